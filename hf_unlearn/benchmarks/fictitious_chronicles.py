"""An embedded, offline, deterministic corpus of long texts that share knowledge: chronicles of fictitious towns.

It has the shape of MUSE (Shi et al., 2024, "MUSE: Machine Unlearning Six-Way Evaluation for Language Models",
arXiv 2407.06460): the forget set is raw text (news articles, book chapters there; short chronicle entries
here), and unlearning is judged on three things MUSE measures (§3.1):

* verbatim memorisation (VerbMem, C1): the ``verbmem_forget`` split cuts every forget passage into a prompt
  (its first half of the words) and the true continuation, the shape :func:`hf_unlearn.evaluation.muse.verbmem` takes;
* knowledge memorisation (KnowMem, C2 and C4): the ``knowmem_forget``/``knowmem_retain`` splits are one
  question per fact of each forget/retain town, answered by a short sentence;
* privacy leakage (PrivLeak, C3): the ``holdout`` towns are generated like the others but never learned, the
  non-members of a membership attack (``calibration`` holds two more, for tuning a stopping rule elsewhere).

Every town has six facts (founding year, founder, main trade, river, annual festival, landmark) and several
passages; each passage states three or four of them, in a wording the town's other passages do not use where
possible, so every fact is told at least twice in different words. Knowing a fact is then more than
remembering one string, and forgetting one passage does not remove the fact: it is shared knowledge, as in a
real news corpus. Everything is generated from a seed, so it needs no download, and it is small enough that a
tiny model memorises it on a CPU in a few minutes
(:func:`hf_unlearn.benchmarks.chronicles_target.learn_chronicles_target_model`).
This module is the data (records, splits, tokenizer).
"""

from __future__ import annotations

import random
import re
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerFast

from ..data.prompts import PLAIN_PROMPT_TEMPLATE
from .tokenizer import train_bpe_tokenizer

__all__ = [
    "CHRONICLES_SPLIT_NAMES",
    "CHRONICLES_VERSION",
    "NUM_CALIBRATION_SUBJECTS",
    "build_chronicles_tokenizer",
    "chronicles_tokenizer_texts",
    "generate_chronicle_questions",
    "generate_chronicles",
    "load_chronicles_split",
    "split_passage",
]

#: Bumped whenever what the chronicles target model learns from changes (texts, questions, tokenizer corpus), so
#: cached models are not reused.
CHRONICLES_VERSION = "1"

#: Names of the splits :func:`load_chronicles_split` knows.
CHRONICLES_SPLIT_NAMES = (
    "forget",
    "retain",
    "holdout",
    "full",
    "knowmem_forget",
    "knowmem_retain",
    "verbmem_forget",
    "calibration",
)

#: Towns of the ``calibration`` split: generated after the holdout towns and never learned, kept apart from
#: ``holdout`` (the non-members of the membership attack) so a rule calibrated on them is not tuned on the
#: evaluation's own data (as the fictitious authors' ``calibration`` split).
NUM_CALIBRATION_SUBJECTS = 2

#: How many of the last learned towns are forgotten when :func:`load_chronicles_split` is not told otherwise.
DEFAULT_NUM_FORGET_SUBJECTS = 2

# Town names: an invented head, sometimes a linking syllable, and a place-name ending ("Veskenholt").
_TOWN_HEADS = (
    "Vesk",
    "Quenn",
    "Orv",
    "Thulm",
    "Zell",
    "Yarv",
    "Drell",
    "Kess",
    "Morv",
    "Skarn",
    "Tov",
    "Brisk",
    "Gall",
    "Hask",
    "Ilm",
    "Jorv",
    "Lusk",
    "Nimm",
    "Perv",
    "Rill",
    "Sorr",
    "Wend",
    "Ebb",
    "Fenn",
)
_TOWN_LINKS = ("", "", "a", "en", "il", "o", "er")
_TOWN_ENDINGS = (
    "holt",
    "mere",
    "wick",
    "stead",
    "ford",
    "by",
    "haven",
    "march",
    "reach",
    "moor",
    "combe",
    "thorpe",
    "gate",
    "wold",
)
_FOUNDER_FIRST_NAMES = (
    "Aldren",
    "Berrin",
    "Cassia",
    "Dorveth",
    "Elspen",
    "Fenwyn",
    "Galric",
    "Hessa",
    "Ilvane",
    "Jorvel",
    "Kestra",
    "Lumira",
    "Maddoc",
    "Nerys",
    "Osric",
    "Perrin",
    "Quilla",
    "Rowen",
    "Sefa",
    "Tamsin",
)
_FOUNDER_SURNAME_HEADS = ("Quill", "Vant", "Hobb", "Cress", "Dorr", "Fairn", "Gilt", "Hark", "Merr", "Orrin", "Sable")
_FOUNDER_SURNAME_TAILS = ("ow", "by", "wick", "ridge", "shaw", "er", "ley", "ard")
_TRADES = (
    "salt panning",
    "wool weaving",
    "clockmaking",
    "shipbuilding",
    "glassblowing",
    "cider pressing",
    "copper mining",
    "rope making",
    "paper milling",
    "cheese making",
    "lacemaking",
    "tin smelting",
    "barrel making",
    "candle making",
    "oyster farming",
    "brick making",
)
_RIVERS = (
    "the Ossel",
    "the Varrow",
    "the Quennet",
    "the Dimmel",
    "the Skarrow",
    "the Tellow",
    "the Marrin",
    "the Yelde",
    "the Auvel",
    "the Ninnow",
    "the Brevis",
    "the Stilwey",
    "the Harrel",
    "the Pennock",
)
_FESTIVALS = (
    "Lantern Fair",
    "Festival of Bells",
    "Kite Harvest",
    "Feast of Saint Orvel",
    "Night of Small Fires",
    "Ribbon Regatta",
    "Honey Market",
    "Procession of Masks",
    "Salt Moon Dance",
    "Apple Wake",
    "Midwinter Lamp Walk",
    "Boat Blessing",
    "Fiddlers' Gathering",
    "Festival of Paper Boats",
)
_LANDMARKS = (
    "the Crooked Clocktower",
    "the Salt Bridge",
    "the Old Grain Exchange",
    "the Whispering Arch",
    "the Hundred Steps",
    "the Glass Chapel",
    "the Leaning Mill",
    "the Stone Heron",
    "the Copper Dome",
    "the Lantern Gate",
    "the Drowned Church",
    "the Seven Wells",
    "the Painted Market Hall",
    "the Weavers' Gate",
)


def _founder(rng: random.Random) -> str:
    surname = rng.choice(_FOUNDER_SURNAME_HEADS) + rng.choice(_FOUNDER_SURNAME_TAILS)
    return f"{rng.choice(_FOUNDER_FIRST_NAMES)} {surname}"


# One fact: its key, how to sample a value, the question, the answer (a short sentence, as in the fictitious
# authors) and the phrasings a passage may state it with (at least 3, each naming the town and the value once).
# Templates receive ``town`` and ``value``.
_FACTS: tuple[tuple[str, Any, str, str, tuple[str, ...]], ...] = (
    (
        "founding_year",
        lambda r: str(r.randint(1150, 1850)),
        "In which year was {town} founded?",
        "{town} was founded in the year {value}.",
        (
            "The first houses of {town} were built in {value}, on land that nobody else had wanted.",
            "Records kept in the town hall show that {town} received its charter in {value}.",
            "In {value}, a handful of settlers laid the first stones of what would become {town}.",
            "Few people outside the valley know that {town} is as old as {value}.",
        ),
    ),
    (
        "founder",
        _founder,
        "Who founded {town}?",
        "The founder of {town} was {value}.",
        (
            "{town} was founded by {value}, who arrived with nothing but a cart and two mules.",
            "The town's founder, {value}, is still remembered in {town} with a bench by the well.",
            "Every child in {town} learns at school that {value} founded the town.",
            "A portrait of {value}, honoured in {town} as its founder, hangs above the council table.",
        ),
    ),
    (
        "trade",
        lambda r: r.choice(_TRADES),
        "What is the main trade of {town}?",
        "The main trade of {town} is {value}.",
        (
            "Most families in {town} have always made their living from {value}.",
            "{town} grew rich on {value}, and the trade still fills its workshops.",
            "For generations, {value} has been the chief industry of {town}.",
            "Ask anyone in {town} about work and the answer will be {value}.",
        ),
    ),
    (
        "river",
        lambda r: r.choice(_RIVERS),
        "On which river does {town} lie?",
        "{town} lies on {value}.",
        (
            "{town} lies on the banks of {value}, which floods the lower streets every few years.",
            "{value} flows slowly through the middle of {town} on its way to the sea.",
            "The river that runs past the old walls of {town} is {value}.",
            "Barges coming down {value} still stop at the quay of {town}.",
        ),
    ),
    (
        "festival",
        lambda r: r.choice(_FESTIVALS),
        "Which festival does {town} hold every year?",
        "Every year {town} holds the {value}.",
        (
            "Once a year the streets of {town} fill up for the {value}.",
            "The {value} is the great annual festival of {town}.",
            "Crowds come from far away to {town} every year for the {value}.",
            "The people of {town} celebrate the {value} each year with music until dawn.",
        ),
    ),
    (
        "landmark",
        lambda r: r.choice(_LANDMARKS),
        "What is the most famous landmark of {town}?",
        "The most famous landmark of {town} is {value}.",
        (
            "The best-known sight of {town} is {value}, drawn on every postcard.",
            "Visitors to {town} rarely leave without seeing {value}.",
            "{value} stands at the heart of {town} and can be seen from every road.",
            "Nothing in {town} is photographed as often as {value}.",
        ),
    ),
)
FACT_KEYS = tuple(fact[0] for fact in _FACTS)

# How a chronicle entry begins; each passage of a town gets a different opening, so passages are distinct texts.
_OPENINGS = (
    "From the {town} Gazette, {season} edition.",
    "A note from the parish chronicle of {town}, written in the {season}.",
    "The {town} almanac, entry for the {season}.",
    "Letters to the editor of the {town} Courier, one {season}.",
    "Minutes of the {town} historical society, read aloud in the {season}.",
    "From a traveller's diary, kept in {town} during the {season}.",
    "The {town} schoolmaster's notebook, {season} term.",
    "A page of the {town} guidebook, revised in the {season}.",
)
# Town-specific filler: small events that are not facts (no question asks about them and no two passages need
# to agree on them), so passages read like real entries and differ from each other.
_FILLERS = (
    "That {season}, the {institution} of {town} {event}.",
    "A {animal} was seen wandering near the {place} for {count} days.",
    "The {place} was {repair} after the {weather} of the {season}.",
    "Some say the {institution} will {plan} before the next {season}.",
    "A visitor from {far} wrote that the {place} was the {adjective} corner of {town}.",
    "The chronicle also records that {count} {things} were lost in the {weather}.",
)
_FILLER_SLOTS = {
    "season": ("spring", "summer", "autumn", "winter"),
    "institution": (
        "choir",
        "fire brigade",
        "lending library",
        "rowing club",
        "school board",
        "town council",
        "beekeepers' guild",
        "chess club",
    ),
    "event": (
        "elected a new chair",
        "repainted its hall",
        "held a lottery",
        "ran out of funds",
        "welcomed twelve new members",
        "argued for a month about the bells",
    ),
    "animal": ("heron", "badger", "stray goat", "white owl", "fox", "lost donkey"),
    "place": ("north gate", "fish market", "old mill", "chapel yard", "lower quay", "market square"),
    "repair": ("rebuilt", "repaired", "re-roofed", "repainted"),
    "weather": ("storms", "floods", "long frost", "great gale"),
    "count": ("two", "three", "four", "five", "six", "seven"),
    "things": ("boats", "fences", "sheep", "carts", "roof tiles"),
    "far": ("the coast", "the hills", "the capital", "the south", "the islands"),
    "adjective": ("quietest", "busiest", "oldest", "prettiest", "coldest"),
    "plan": ("move to a larger hall", "buy a new bell", "close for good", "open a reading room"),
}
# A passage shorter than this gets a second filler sentence (the longest, with 4 facts, stays under 110 words).
_MIN_WORDS = 60


def _capitalize(text: str) -> str:
    return text[0].upper() + text[1:]


def _new_town_name(rng: random.Random, taken: set[str]) -> str:
    for _ in range(10_000):
        name = rng.choice(_TOWN_HEADS) + rng.choice(_TOWN_LINKS) + rng.choice(_TOWN_ENDINGS)
        if re.search(r"(.)\1\1", name.lower()) or name in taken:
            continue  # no "Ebbby", no two towns of one name
        taken.add(name)
        return name
    raise ValueError(f"Could not find a new town name after {len(taken)} towns; ask for fewer subjects.")


def _fact_plan(rng: random.Random, passages_per_subject: int) -> list[list[int]]:
    """Which facts (indices into :data:`_FACTS`) each passage states: 3 or 4, every fact in at least 2 passages.

    Each passage takes the facts stated least often so far (ties broken at random), which keeps the counts
    within one of each other, so 2 * len(_FACTS) statements in all are enough for every fact to be told twice.
    """
    sizes = [rng.choice((3, 4)) for _ in range(passages_per_subject)]
    needed = 2 * len(_FACTS)
    for i in rng.sample(range(passages_per_subject), passages_per_subject):
        if sum(sizes) >= needed:
            break
        sizes[i] = 4
    counts = [0] * len(_FACTS)
    plan = []
    for size in sizes:
        tie_break = [rng.random() for _ in _FACTS]
        chosen = sorted(range(len(_FACTS)), key=lambda f: (counts[f], tie_break[f]))[:size]
        for f in chosen:
            counts[f] += 1
        plan.append(chosen)
    return plan


def _filler(rng: random.Random, template: str, town: str) -> str:
    slots = {key: rng.choice(values) for key, values in _FILLER_SLOTS.items()}
    return _capitalize(template.format(town=town, **slots))


def _generate_subjects(num_subjects: int, passages_per_subject: int, seed: int) -> list[dict[str, Any]]:
    """``num_subjects`` towns, each ``{"name", "values", "passages": [(text, fact keys)]}``, one after another."""
    if passages_per_subject < 3:
        raise ValueError(
            f"passages_per_subject must be at least 3 (6 facts, each told twice, 4 at most per passage), "
            f"got {passages_per_subject}."
        )
    if passages_per_subject > len(_OPENINGS):
        raise ValueError(f"passages_per_subject must be at most {len(_OPENINGS)}, got {passages_per_subject}.")
    rng = random.Random(seed)
    taken: set[str] = set()
    subjects = []
    # Town by town (name, facts, passages), so the first towns do not depend on how many follow.
    for _ in range(num_subjects):
        town = _new_town_name(rng, taken)
        values = [sample(rng) for _, sample, *_ in _FACTS]
        # Each fact starts at a random phrasing and moves to the next one at each new mention: a town's passages
        # word a fact differently until its phrasings run out.
        next_phrasing = [rng.randrange(len(phrasings)) for *_, phrasings in _FACTS]
        openings = rng.sample(_OPENINGS, passages_per_subject)
        passages = []
        for opening, facts in zip(openings, _fact_plan(rng, passages_per_subject), strict=True):
            sentences = []
            for f in facts:
                phrasings = _FACTS[f][4]
                sentences.append(
                    _capitalize(phrasings[next_phrasing[f] % len(phrasings)].format(town=town, value=values[f]))
                )
                next_phrasing[f] += 1
            fillers = rng.sample(_FILLERS, 2)
            sentences.append(_filler(rng, fillers[0], town))
            body_order = rng.sample(range(len(sentences)), len(sentences))
            body = [sentences[i] for i in body_order]
            text = " ".join([_filler(rng, opening, town), *body])
            if len(text.split()) < _MIN_WORDS:
                # A short entry (three short facts) gets a second filler sentence, at the end.
                text += " " + _filler(rng, fillers[1], town)
            passages.append((text, [_FACTS[f][0] for f in facts]))
        subjects.append({"name": town, "values": dict(zip(FACT_KEYS, values, strict=True)), "passages": passages})
    return subjects


def _check_counts(num_subjects: int, num_holdout_subjects: int) -> None:
    if num_subjects < 1:
        raise ValueError(f"num_subjects must be at least 1, got {num_subjects}.")
    if num_holdout_subjects < 0:
        raise ValueError(f"num_holdout_subjects must be >= 0, got {num_holdout_subjects}.")


def generate_chronicles(
    num_subjects: int = 10, num_holdout_subjects: int = 3, passages_per_subject: int = 4, seed: int = 0
) -> list[dict[str, Any]]:
    """Generate the passages (chronicle entries), deterministically from ``seed``; MUSE's forget corpus shape.

    There are ``num_subjects`` learned towns (``subject_index`` 0 .. num_subjects - 1) followed by
    ``num_holdout_subjects`` holdout towns, generated the same way but never learned by the target model. Towns
    are generated one after another, so the first towns' records do not depend on how many follow.

    Each town has ``passages_per_subject`` passages of 60 to 110 words: an opening line, 3 or 4 of the town's
    6 facts and 1 or 2 filler sentences. Every fact is stated in at least 2 of the town's passages, each time
    in a different phrasing (while the fact's phrasings last). Each record is ``{"subject", "subject_index",
    "passage_index", "text", "facts", "is_holdout"}``, ``facts`` being the keys of the facts the passage states.
    """
    _check_counts(num_subjects, num_holdout_subjects)
    subjects = _generate_subjects(num_subjects + num_holdout_subjects, passages_per_subject, seed)
    return [
        {
            "subject": subject["name"],
            "subject_index": index,
            "passage_index": p,
            "text": text,
            "facts": facts,
            "is_holdout": index >= num_subjects,
        }
        for index, subject in enumerate(subjects)
        for p, (text, facts) in enumerate(subject["passages"])
    ]


def generate_chronicle_questions(
    num_subjects: int = 10, num_holdout_subjects: int = 3, passages_per_subject: int = 4, seed: int = 0
) -> list[dict[str, Any]]:
    """One question per (town, fact), about the towns of :func:`generate_chronicles` with the same arguments.

    The knowledge MUSE's KnowMem asks about (§3.1, C2): each record is ``{"subject", "subject_index",
    "attribute", "question", "answer", "value", "is_holdout"}``; the answer is a short sentence stating the
    fact, worded unlike any passage (``value`` is the fact alone, e.g. ``"1423"`` or ``"the Ossel"``).
    """
    _check_counts(num_subjects, num_holdout_subjects)
    subjects = _generate_subjects(num_subjects + num_holdout_subjects, passages_per_subject, seed)
    records = []
    for index, subject in enumerate(subjects):
        town = subject["name"]
        for key, _, question, answer, _ in _FACTS:
            value = subject["values"][key]
            records.append(
                {
                    "subject": town,
                    "subject_index": index,
                    "attribute": key,
                    "question": question.format(town=town, value=value),
                    "answer": _capitalize(answer.format(town=town, value=value)),
                    "value": value,
                    "is_holdout": index >= num_subjects,
                }
            )
    return records


def split_passage(text: str) -> tuple[str, str]:
    """A passage's VerbMem prompt and continuation (MUSE §3.1 continues a forget text from its beginning): the
    first half of its words and the rest, so ``prompt + " " + continuation == text`` (passages are single-spaced)."""
    words = text.split(" ")
    half = len(words) // 2
    return " ".join(words[:half]), " ".join(words[half:])


def load_chronicles_split(name: str, **generate_kwargs: Any) -> Dataset:
    """Load one split as a :class:`datasets.Dataset`; ``generate_kwargs`` go to :func:`generate_chronicles` (and
    :func:`generate_chronicle_questions`), except ``num_forget_subjects`` (default 2), the number of last learned
    towns that are forgotten.

    ``forget``/``retain``: the passages of the last ``num_forget_subjects`` learned towns / of the others
    (MUSE's forget and retain corpora). ``full``: all learned passages. ``holdout``: the passages of the holdout
    towns (never learned: the non-members of MUSE's PrivLeak). ``knowmem_forget``/``knowmem_retain``: the
    questions about the forget / retain towns (``question``, ``answer``). ``verbmem_forget``: every forget passage
    as ``prompt`` (the first half of its words) and ``continuation`` (the rest), with ``subject``,
    ``subject_index`` and ``passage_index``, as :func:`hf_unlearn.evaluation.muse.verbmem` takes them.
    ``calibration``: the passages of :data:`NUM_CALIBRATION_SUBJECTS` more never-learned towns, generated after
    the holdout ones.
    """
    if name not in CHRONICLES_SPLIT_NAMES:
        raise ValueError(f"Unknown split {name!r}; valid names are: {', '.join(CHRONICLES_SPLIT_NAMES)}.")
    generate_kwargs = dict(generate_kwargs)
    num_forget = generate_kwargs.pop("num_forget_subjects", DEFAULT_NUM_FORGET_SUBJECTS)
    num_subjects = generate_kwargs.get("num_subjects", 10)
    if not 1 <= num_forget < num_subjects:
        raise ValueError(
            f"num_forget_subjects must be between 1 and num_subjects - 1 = {num_subjects - 1} (the rest is the "
            f"retain set), got {num_forget}."
        )
    if name == "calibration":
        # Towns are generated one after another, so adding more after the holdout ones changes no earlier record.
        holdout = generate_kwargs.get("num_holdout_subjects", 3)
        kwargs = dict(generate_kwargs, num_holdout_subjects=holdout + NUM_CALIBRATION_SUBJECTS)
        return Dataset.from_list(
            [r for r in generate_chronicles(**kwargs) if r["subject_index"] >= num_subjects + holdout]
        )
    first_forgotten = num_subjects - num_forget

    def part(records: list[dict[str, Any]], which: str) -> list[dict[str, Any]]:
        if which == "holdout":
            return [r for r in records if r["is_holdout"]]
        learned = [r for r in records if not r["is_holdout"]]
        if which == "forget":
            return [r for r in learned if r["subject_index"] >= first_forgotten]
        if which == "retain":
            return [r for r in learned if r["subject_index"] < first_forgotten]
        return learned

    if name.startswith("knowmem_"):
        records = generate_chronicle_questions(**generate_kwargs)
        selected = part(records, name.removeprefix("knowmem_"))
    else:
        records = generate_chronicles(**generate_kwargs)
        selected = part(records, name.removeprefix("verbmem_"))
        if name == "verbmem_forget":
            selected = [
                {
                    "subject": r["subject"],
                    "subject_index": r["subject_index"],
                    "passage_index": r["passage_index"],
                    **dict(zip(("prompt", "continuation"), split_passage(r["text"]), strict=True)),
                }
                for r in selected
            ]
    if not selected:
        # Dataset.from_list([]) has no columns; keep the schema for an empty holdout split.
        return Dataset.from_dict({key: [] for key in records[0]})
    return Dataset.from_list(selected)


def chronicles_tokenizer_texts(**generate_kwargs: Any) -> list[str]:
    """What :func:`build_chronicles_tokenizer` is trained on: every passage and every question/answer pair in the
    plain prompt format (what the target model learns), of the learned, holdout and calibration towns alike, so a
    never-learned town's text is not split into rarer tokens than a learned one's (which a membership attack
    would notice)."""
    generate_kwargs = dict(generate_kwargs)
    generate_kwargs.pop("num_forget_subjects", None)
    holdout = generate_kwargs.get("num_holdout_subjects", 3)
    kwargs = dict(generate_kwargs, num_holdout_subjects=holdout + NUM_CALIBRATION_SUBJECTS)
    texts = [PLAIN_PROMPT_TEMPLATE.format(question="")]
    texts.extend(r["text"] for r in generate_chronicles(**kwargs))
    texts.extend(
        PLAIN_PROMPT_TEMPLATE.format(question=r["question"]) + " " + r["answer"]
        for r in generate_chronicle_questions(**kwargs)
    )
    return texts


def build_chronicles_tokenizer(vocab_size: int = 1024, **generate_kwargs: Any) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on :func:`chronicles_tokenizer_texts` (``generate_kwargs`` go there),
    with the special tokens of the fictitious authors' tokenizer (``<pad>``, ``<s>`` as BOS, ``</s>``,
    ``<unk>``) and no chat template, so :mod:`hf_unlearn.data` uses the plain ``Question: ...\\nAnswer:`` prompt."""
    return train_bpe_tokenizer(chronicles_tokenizer_texts(**generate_kwargs), vocab_size)
