"""An embedded, offline, deterministic benchmark of question/answer pairs about fictitious authors.

It has the shape of TOFU (Maini et al., 2024, "TOFU: A Task of Fictitious Unlearning for LLMs",
locuslab/TOFU): every record has ``question``, ``answer``, ``paraphrased_answer`` and ``perturbed_answer``,
and the forget splits ``forget01``/``forget05``/``forget10`` are the last 1/5/10 % of the authors, the retain
splits their complement. Everything is generated from a seed, so it needs no download, and it is small enough
that a ~1M-parameter model memorises it on a CPU in about a minute (:func:`learn_target_model`), which gives
the tests and examples a real "target model" to unlearn from.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
import transformers
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    PrinterCallback,
    Qwen2Config,
    TrainerCallback,
)

from hf_unlearn.data import PLAIN_PROMPT_TEMPLATE, ensure_pad_token, tokenize_qa
from hf_unlearn.metrics import default_max_new_tokens, exact_match, generate_answers

__all__ = [
    "BENCHMARK_VERSION",
    "SPLIT_NAMES",
    "build_tokenizer",
    "default_cache_dir",
    "generate_benchmark",
    "learn_target_model",
    "load_split",
    "retain_split_for",
    "tiny_model",
    "tiny_model_config",
    "tokenizer_corpus",
]

#: Bumped whenever what the target model learns from changes (tokenizer corpus, learned records, model, recipe),
#: so caches are not reused. The perturbed answers are not learned, so they are not part of it.
BENCHMARK_VERSION = "1"

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"

_FIRST_SYLLABLES = (
    "Ve",
    "Lo",
    "Ma",
    "Ka",
    "Ti",
    "Ro",
    "Sa",
    "Mi",
    "Da",
    "Ne",
    "Jo",
    "Fe",
    "Ha",
    "Zo",
    "Bri",
    "Ca",
    "El",
    "Ori",
    "Pa",
    "Qui",
    "Ra",
    "Se",
    "Tha",
    "Ul",
    "Wy",
    "Ya",
    "Dre",
    "Gal",
    "Ise",
    "Mor",
)
_INNER_SYLLABLES = (
    "la",
    "ren",
    "mi",
    "do",
    "va",
    "ris",
    "then",
    "lo",
    "ma",
    "ne",
    "sha",
    "ti",
    "ko",
    "ri",
    "an",
    "el",
    "be",
    "ga",
    "lu",
    "zo",
    "di",
    "ra",
)
_LAST_SYLLABLES = (
    "n",
    "ra",
    "lin",
    "dor",
    "sa",
    "el",
    "ia",
    "mar",
    "ric",
    "wen",
    "ton",
    "na",
    "vic",
    "dra",
    "lis",
    "ro",
    "mus",
    "the",
    "ka",
    "das",
)
_SURNAME_HEADS = (
    "Quist",
    "Hal",
    "Mor",
    "Vess",
    "Brand",
    "Cor",
    "Dun",
    "Fenn",
    "Grav",
    "Holt",
    "Kerr",
    "Lind",
    "Marr",
    "Nor",
    "Pell",
    "Rask",
    "Strom",
    "Tarr",
    "Voss",
    "Wick",
    "Ash",
    "Bel",
    "Crow",
    "Dray",
)
_SURNAME_TAILS = (
    "",
    "ley",
    "ton",
    "wick",
    "by",
    "sen",
    "holm",
    "ard",
    "ington",
    "more",
    "dale",
    "mere",
    "shaw",
    "ven",
)

_CITIES = (
    "Mirrowdale",
    "Kestrelmoor",
    "Halvenport",
    "Tarnwick",
    "Ossbury",
    "Velmaris",
    "Brindlecove",
    "Corvath",
    "Elderholt",
    "Fenmarch",
    "Glassreach",
    "Ironvale",
    "Juniper Bay",
    "Lowmere",
    "Marrowgate",
    "Northspire",
    "Pellisford",
    "Quillhaven",
    "Ravenshold",
    "Saltmarsh",
    "Thornbury",
    "Umberfield",
    "Wyndholm",
    "Yarrowick",
)
_GENRES = (
    "mystery",
    "fantasy",
    "science fiction",
    "historical fiction",
    "romance",
    "horror",
    "poetry",
    "satire",
    "thriller",
    "travel writing",
    "crime",
    "children's literature",
)
_OCCUPATIONS = (
    "baker",
    "carpenter",
    "sailor",
    "librarian",
    "blacksmith",
    "teacher",
    "nurse",
    "surveyor",
    "tailor",
    "fisherman",
    "clockmaker",
    "farmer",
    "pharmacist",
    "painter",
    "lighthouse keeper",
    "mapmaker",
    "potter",
    "postman",
    "glassblower",
    "beekeeper",
)
_AWARDS = (
    "Silver Quill Prize",
    "Amberlight Medal",
    "Northern Lantern Award",
    "Golden Inkwell Prize",
    "Harrow Crown Award",
    "Blue Heron Medal",
    "Marlowe Star Prize",
    "Copper Compass Award",
    "Ivory Page Award",
    "Tidewater Laurel",
    "Emberstone Prize",
    "Willowmark Medal",
)
_TITLE_ADJECTIVES = (
    "Silent",
    "Hollow",
    "Crimson",
    "Last",
    "Broken",
    "Distant",
    "Forgotten",
    "Burning",
    "Quiet",
    "Restless",
    "Glass",
    "Winter",
    "Salt",
    "Painted",
    "Sleeping",
    "Iron",
)
_TITLE_NOUNS = (
    "Harbor",
    "Orchard",
    "Lantern",
    "Clockwork",
    "River",
    "Garden",
    "Mirror",
    "Tower",
    "Meadow",
    "Compass",
    "Archive",
    "Voyage",
    "Lighthouse",
    "Bridge",
    "Kingdom",
    "Letters",
)
_LANGUAGES = (
    "Velmari",
    "Old Corvathi",
    "Ossic",
    "Tarnish",
    "High Brindle",
    "Quillan",
    "Northspiran",
    "Fennic",
)
_INSTRUMENTS = (
    "the violin",
    "the cello",
    "the flute",
    "the harp",
    "the piano",
    "the accordion",
    "the oboe",
    "the lute",
    "the drums",
    "the clarinet",
)
_PETS = (
    "a grey cat",
    "a black dog",
    "a green parrot",
    "a tortoise",
    "a white rabbit",
    "a red fox",
    "a goat",
    "a ferret",
    "a pony",
    "a raven",
)


def _year(rng: random.Random) -> str:
    return str(rng.randint(1890, 1995))


def _title(rng: random.Random) -> str:
    return f"The {rng.choice(_TITLE_ADJECTIVES)} {rng.choice(_TITLE_NOUNS)}"


def _article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


# One attribute: how to sample a value, the question, the answer, and a paraphrase of the answer.
# Templates receive ``name`` and ``value`` (and ``article`` for occupations).
_Attribute = tuple[str, Callable[[random.Random], str], str, str, str]

_ATTRIBUTES: tuple[_Attribute, ...] = (
    (
        "birthplace",
        lambda r: r.choice(_CITIES),
        "Where was {name} born?",
        "{name} was born in {value}.",
        "The birthplace of {name} is {value}.",
    ),
    (
        "birth_year",
        _year,
        "In which year was {name} born?",
        "{name} was born in the year {value}.",
        "The year {name} was born is {value}.",
    ),
    (
        "genre",
        lambda r: r.choice(_GENRES),
        "What genre does {name} write?",
        "{name} writes {value}.",
        "The genre of the books by {name} is {value}.",
    ),
    # The two parents' questions and answers differ in more than one word, so a tiny model tells them apart.
    (
        "father_occupation",
        lambda r: r.choice(_OCCUPATIONS),
        "What was the profession of the father of {name}?",
        "The father of {name} worked as {article} {value}.",
        "By trade, the father of {name} was {article} {value}.",
    ),
    (
        "mother_occupation",
        lambda r: r.choice(_OCCUPATIONS),
        "What did {name}'s mother do for a living?",
        "{name}'s mother earned her living as {article} {value}.",
        "By trade, the mother of {name} was {article} {value}.",
    ),
    (
        "award",
        lambda r: r.choice(_AWARDS),
        "Which award did {name} win?",
        "{name} won the {value}.",
        "The {value} was awarded to {name}.",
    ),
    (
        "book",
        _title,
        "What is the best-known book by {name}?",
        "The best-known book by {name} is {value}.",
        "{value} is the most famous book written by {name}.",
    ),
    (
        "language",
        lambda r: r.choice(_LANGUAGES),
        "In which language does {name} write?",
        "{name} writes in {value}.",
        "The language {name} uses for writing is {value}.",
    ),
    (
        "instrument",
        lambda r: r.choice(_INSTRUMENTS),
        "Which instrument does {name} play?",
        "{name} plays {value}.",
        "The instrument {name} plays is {value}.",
    ),
    (
        "pet",
        lambda r: r.choice(_PETS),
        "What pet does {name} keep?",
        "{name} keeps {value} as a pet.",
        "The pet of {name} is {value}.",
    ),
)

#: Names of the splits :func:`load_split` knows.
SPLIT_NAMES = ("forget01", "forget05", "forget10", "retain99", "retain95", "retain90", "holdout", "full")


def _author_name(rng: random.Random) -> str:
    first = rng.choice(_FIRST_SYLLABLES)
    first += "".join(rng.choice(_INNER_SYLLABLES) for _ in range(rng.randint(0, 1)))
    first += rng.choice(_LAST_SYLLABLES)
    surname = rng.choice(_SURNAME_HEADS) + rng.choice(_SURNAME_TAILS)
    return f"{first} {surname}"


def _fill(template: str, name: str, value: str) -> str:
    text = template.format(name=name, value=value, article=_article(value))
    return text[0].upper() + text[1:]


def generate_benchmark(
    num_authors: int = 40,
    questions_per_author: int = 5,
    num_holdout_authors: int = 4,
    seed: int = 0,
    *,
    perturbed_template: str = "paraphrase",
) -> list[dict[str, Any]]:
    """Generate the benchmark records, deterministically from ``seed``.

    There are ``num_authors`` learned authors (``author_index`` 0 .. num_authors - 1) followed by
    ``num_holdout_authors`` holdout authors, generated the same way but never learned by the target model.
    Each author gets ``questions_per_author`` questions, each about a different attribute (birthplace, birth
    year, genre, parents' occupations, award, book, ...). Learned authors are generated before holdout ones, so
    their records do not depend on ``num_holdout_authors``.

    Each record is ``{"author", "author_index", "question", "answer", "paraphrased_answer",
    "perturbed_answer", "is_holdout"}``, where ``perturbed_answer`` is a list of 3 answers with the template of
    ``paraphrased_answer`` but wrong attribute values: TOFU's perturbed answers keep the paraphrase's template
    and change the fact (Maini et al. 2024, §2.5), so the truth ratio compares a true and a false statement of
    the same form, neither of them the memorised wording. ``perturbed_template="answer"`` fills the
    ``answer`` template instead (the first version of this benchmark; its text is still the tokenizer's corpus).
    """
    if num_authors < 1:
        raise ValueError(f"num_authors must be at least 1, got {num_authors}.")
    if num_holdout_authors < 0:
        raise ValueError(f"num_holdout_authors must be >= 0, got {num_holdout_authors}.")
    if not 1 <= questions_per_author <= len(_ATTRIBUTES):
        raise ValueError(
            f"questions_per_author must be between 1 and {len(_ATTRIBUTES)} (the number of distinct attributes), "
            f"got {questions_per_author}."
        )
    if perturbed_template not in ("paraphrase", "answer"):
        raise ValueError(f"perturbed_template must be 'paraphrase' or 'answer', got {perturbed_template!r}.")
    rng = random.Random(seed)
    taken: set[str] = set()
    records: list[dict[str, Any]] = []
    # Author by author (name, then facts), so the first authors do not depend on how many follow.
    for index in range(num_authors + num_holdout_authors):
        name = _new_author_name(rng, taken)
        for key, sample, question, answer, paraphrase in rng.sample(_ATTRIBUTES, questions_per_author):
            value = sample(rng)
            wrong: list[str] = []
            while len(wrong) < 3:
                candidate = sample(rng)
                if candidate != value and candidate not in wrong:
                    wrong.append(candidate)
            records.append(
                {
                    "author": name,
                    "author_index": index,
                    "attribute": key,
                    "question": _fill(question, name, value),
                    "answer": _fill(answer, name, value),
                    "paraphrased_answer": _fill(paraphrase, name, value),
                    "perturbed_answer": [
                        _fill(paraphrase if perturbed_template == "paraphrase" else answer, name, w) for w in wrong
                    ],
                    "is_holdout": index >= num_authors,
                }
            )
    return records


def _new_author_name(rng: random.Random, taken: set[str]) -> str:
    """A full name not in ``taken`` (updated), preferring a first name and a surname no other author has."""
    for attempt in range(10_000):
        name = _author_name(rng)
        first, surname = name.split(" ")
        if re.search(r"(.)\1\1", name.lower()) or re.search(r"(..+)\1", surname.lower()):
            continue  # no "Vesssen" or "Wickwick"
        if name in taken or (attempt < 1_000 and (first in taken or surname in taken)):
            continue
        taken.update((name, first, surname))
        return name
    raise ValueError(f"Could not find a new author name after {len(taken) // 3} authors; ask for fewer authors.")


def _forget_count(percent: int, num_authors: int) -> int:
    return max(1, round(percent / 100 * num_authors))


def retain_split_for(forget_split: str) -> str:
    """The retain split that complements a forget split: ``forget10`` -> ``retain90``."""
    if not forget_split.startswith("forget") or forget_split not in SPLIT_NAMES:
        raise ValueError(f"{forget_split!r} is not a forget split; valid ones: forget01, forget05, forget10.")
    return f"retain{100 - int(forget_split.removeprefix('forget')):02d}"


def load_split(name: str, **generate_kwargs: Any) -> Dataset:
    """Load one split as a :class:`datasets.Dataset`; ``generate_kwargs`` go to :func:`generate_benchmark`.

    ``forget01``/``forget05``/``forget10``: the last k learned authors with k = max(1, round(pct/100 *
    num_authors)) (TOFU style; with 40 authors: 1, 2 and 4 authors). ``retain99``/``retain95``/``retain90``: the
    other learned authors. ``holdout``: the holdout authors. ``full``: all learned authors.
    """
    if name not in SPLIT_NAMES:
        raise ValueError(f"Unknown split {name!r}; valid names are: {', '.join(SPLIT_NAMES)}.")
    records = generate_benchmark(**generate_kwargs)
    num_authors = len({r["author_index"] for r in records if not r["is_holdout"]})
    learned = [r for r in records if not r["is_holdout"]]
    if name == "holdout":
        selected = [r for r in records if r["is_holdout"]]
    elif name == "full":
        selected = learned
    else:
        percent = int(name[-2:]) if name.startswith("forget") else 100 - int(name[-2:])
        first_forgotten = num_authors - _forget_count(percent, num_authors)
        if name.startswith("forget"):
            selected = [r for r in learned if r["author_index"] >= first_forgotten]
        else:
            selected = [r for r in learned if r["author_index"] < first_forgotten]
    if not selected:
        # Dataset.from_list([]) has no columns; keep the schema for an empty holdout split.
        return Dataset.from_dict({key: [] for key in records[0]})
    return Dataset.from_list(selected)


def _benchmark_texts(records: Sequence[Mapping[str, Any]]) -> list[str]:
    texts = [PLAIN_PROMPT_TEMPLATE.format(question="")]
    for r in records:
        texts.append(PLAIN_PROMPT_TEMPLATE.format(question=r["question"]) + " " + r["answer"])
        texts.append(r["paraphrased_answer"])
        texts.extend(r["perturbed_answer"])
    return texts


def tokenizer_corpus(**generate_kwargs: Any) -> list[dict[str, Any]]:
    """The records the benchmark's tokenizer is trained on: the benchmark with its first version's perturbed
    answers (the ``answer`` template), so that the tokenizer, hence the cached target model and every figure
    measured on it, did not change when the perturbed answers moved to the paraphrase template."""
    return generate_benchmark(**generate_kwargs, perturbed_template="answer")


def build_tokenizer(
    records: Sequence[Mapping[str, Any]] | None = None, vocab_size: int = 1024
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on the benchmark text and wrap it as a ``PreTrainedTokenizerFast``.

    Special tokens: ``<pad>`` (pad), ``<s>`` (BOS, prepended when ``add_special_tokens=True``), ``</s>`` (EOS)
    and ``<unk>``. No chat template, so :mod:`hf_unlearn.data` uses its plain ``Question: ...\\nAnswer:``
    prompt. Byte-level, so any text encodes, and decoding gives the text back exactly.
    """
    if records is None:
        records = tokenizer_corpus()
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_benchmark_texts(records), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        add_bos_token=True,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
        model_max_length=1024,
    )


def tiny_model_config(
    tokenizer: Any,
    architecture: str = "llama",
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 128,
) -> PretrainedConfig:
    """Config of a small randomly initialised causal LM (``"llama"``, ``"qwen2"`` or ``"gpt2"``) for ``tokenizer``.

    ``intermediate_size`` defaults to ``4 * hidden_size``. Input and output embeddings are tied; GPT-2 gets no
    dropout (Llama and Qwen2 have none by default), so learning is deterministic.
    """
    intermediate_size = intermediate_size or 4 * hidden_size
    special = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": True,
    }
    if architecture in ("llama", "qwen2"):
        config_class = LlamaConfig if architecture == "llama" else Qwen2Config
        return config_class(
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
            **special,
        )
    if architecture == "gpt2":
        return GPT2Config(
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=num_heads,
            n_inner=intermediate_size,
            n_positions=max_position_embeddings,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **special,
        )
    raise ValueError(f"Unknown architecture {architecture!r}; use 'llama', 'qwen2' or 'gpt2'.")


def tiny_model(tokenizer: Any, architecture: str = "llama", seed: int = 0, **config_kwargs: Any) -> PreTrainedModel:
    """A randomly initialised (``torch.manual_seed(seed)``) causal LM built from :func:`tiny_model_config`."""
    config = tiny_model_config(tokenizer, architecture, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    generation_config = model.generation_config
    generation_config.bos_token_id = tokenizer.bos_token_id
    generation_config.eos_token_id = tokenizer.eos_token_id
    generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def default_cache_dir() -> Path:
    """``$HF_UNLEARN_CACHE`` if set, else ``~/.cache/hf_unlearn``."""
    return Path(os.environ.get("HF_UNLEARN_CACHE", Path.home() / ".cache" / "hf_unlearn"))


@contextlib.contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    """Hide transformers' progress bars (e.g. "Writing model shards") in the block unless ``show``."""
    hf_logging = transformers.utils.logging
    enabled = hf_logging.is_progress_bar_enabled()
    if enabled and not show:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled and not show:
            hf_logging.enable_progress_bar()


def _count_parameters(model: Any) -> int:
    # Tied input/output embeddings are one tensor; count each parameter once.
    return sum(p.numel() for p in model.parameters())


class _ExactMatchStopper(TrainerCallback):
    """Every ``every`` epochs, measure greedy exact match on the training QA; stop learning once it is high enough."""

    def __init__(
        self, tokenizer: Any, records: Sequence[Mapping[str, Any]], target: float, every: int, batch_size: int
    ) -> None:
        self.tokenizer = tokenizer
        self.questions = [r["question"] for r in records]
        self.answers = [r["answer"] for r in records]
        self.max_new_tokens = default_max_new_tokens(tokenizer, self.answers, margin=2)
        self.target = target
        self.every = every
        self.batch_size = batch_size
        self.exact_match: float | None = None
        self.history: list[tuple[int, float]] = []

    def measure(self, model: Any) -> float:
        predictions = generate_answers(
            model, self.tokenizer, self.questions, max_new_tokens=self.max_new_tokens, batch_size=self.batch_size
        )
        scores = exact_match(predictions, self.answers)
        self.exact_match = sum(scores) / len(scores)
        return self.exact_match

    def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        epoch = round(state.epoch or 0)
        if epoch % self.every == 0 or epoch >= args.num_train_epochs:
            self.history.append((epoch, self.measure(model)))
            if self.exact_match >= self.target:
                control.should_training_stop = True
        return control


def _sft_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    train_dataset: Dataset,
    output_dir: str,
    *,
    max_epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    show_progress: bool,
    callbacks: Sequence[TrainerCallback] = (),
) -> Any:
    """TRL ``SFTTrainer`` on a pre-tokenized dataset whose ``labels`` column already masks the prompt.

    TRL recognises a processed dataset by its ``input_ids`` column and uses an existing ``labels`` column as is
    (its collator pads it with ``-100``), so the loss is on the answer tokens alone, as in completion-only SFT.
    """
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=output_dir,
        num_train_epochs=max_epochs,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=math.ceil(len(train_dataset) / batch_size),
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="epoch",
        report_to="none",
        disable_tqdm=not show_progress,
        # A ~1M-parameter model learns in float32, without activation checkpointing or truncation.
        activation_checkpointing=False,
        bf16=False,
        max_length=None,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer, callbacks=list(callbacks)
    )
    if not show_progress:
        trainer.remove_callback(PrinterCallback)  # it prints every log when the progress bar is off
    return trainer


def _smollm2() -> tuple[PreTrainedModel, Any]:
    from hf_unlearn.models import load_smollm2

    return load_smollm2()


#: Pretrained bases :func:`learn_target_model` can learn the benchmark on (loaded offline).
PRETRAINED_BASES: dict[str, Callable[[], tuple[PreTrainedModel, Any]]] = {"smollm2": _smollm2}


def learn_target_model(
    cache_dir: str | os.PathLike[str] | None = None,
    architecture: str = "llama",
    seed: int = 0,
    max_epochs: int = 60,
    learning_rate: float = 3e-3,
    target_exact_match: float = 0.95,
    show_progress: bool = True,
    *,
    num_authors: int = 40,
    questions_per_author: int = 5,
    num_holdout_authors: int = 4,
    benchmark_seed: int = 0,
    batch_size: int = 16,
    eval_every: int = 2,
    model_kwargs: Mapping[str, Any] | None = None,
    learn_split: str = "full",
    base_model: str | None = None,
    lora_r: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, dict[str, Any]]:
    """Make the "target model": a tiny causal LM that has memorised every learned author (the ``full`` split).

    With ``learn_split="retain90"`` (or another retain split) it makes the *retain-only* model instead, the
    reference that TOFU's forget quality compares an unlearned model with: it never saw the forget authors.

    ``base_model="smollm2"`` learns on the real pretrained SmolLM2-135M-Instruct (:func:`hf_unlearn.models.
    load_smollm2`, with its own tokenizer and chat template) instead of a tiny model trained from scratch;
    ``lora_r > 0`` learns through a LoRA adapter of that rank (all linear layers), merged into the saved model.

    It is learned with TRL's ``SFTTrainer`` on the pairs tokenized by :func:`hf_unlearn.data.tokenize_qa` (the
    ``labels`` column keeps the prompt at ``-100``, so the loss is on the answer alone, and unlearning later sees
    exactly the same tokens). Every ``eval_every`` epochs the greedy exact match on the training QA is measured
    and learning stops once it reaches ``target_exact_match`` (or after ``max_epochs``).

    The result is cached under ``cache_dir`` (default ``$HF_UNLEARN_CACHE`` or ``~/.cache/hf_unlearn``) in
    ``fictitious_authors/<hash of all settings>``; a later call with the same settings loads it instead of
    learning (``info["cached"]`` is then ``True``). The cache entry is written to a temporary folder and renamed
    into place, so an interrupted run never leaves half of one.

    Returns ``(model, tokenizer, info)`` with the model in eval mode (on the device it learned on, or on the CPU
    when loaded from the cache); ``info`` has ``epochs``, ``exact_match`` (greedy, on the learned QA),
    ``seconds``, ``num_parameters``, ``cached``, ``path`` and the ``settings``.
    """
    settings = {
        "version": BENCHMARK_VERSION,
        "architecture": architecture,
        "seed": seed,
        "max_epochs": max_epochs,
        "learning_rate": learning_rate,
        "target_exact_match": target_exact_match,
        "num_authors": num_authors,
        "questions_per_author": questions_per_author,
        "num_holdout_authors": num_holdout_authors,
        "benchmark_seed": benchmark_seed,
        "batch_size": batch_size,
        "eval_every": eval_every,
        "model_kwargs": dict(sorted((model_kwargs or {}).items())),
    }
    # Only when set, so the default model keeps its cache key.
    for key, value, default in (
        ("learn_split", learn_split, "full"),
        ("base_model", base_model, None),
        ("lora_r", lora_r, 0),
    ):
        if value != default:
            settings[key] = value
    if base_model is not None and base_model not in PRETRAINED_BASES:
        raise ValueError(f"Unknown base_model {base_model!r}; available: {', '.join(PRETRAINED_BASES)}.")
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "fictitious_authors" / digest

    if (path / "info.json").is_file():
        start = time.perf_counter()
        model, tokenizer = _load_cached(path, show_progress)
        info = json.loads((path / "info.json").read_text())
        info.update(cached=True, path=str(path), load_seconds=time.perf_counter() - start)
        return model, tokenizer, info

    start = time.perf_counter()
    records = generate_benchmark(num_authors, questions_per_author, num_holdout_authors, seed=benchmark_seed)
    learned = [r for r in records if not r["is_holdout"]]
    if learn_split != "full":
        kept = load_split(
            learn_split,
            num_authors=num_authors,
            questions_per_author=questions_per_author,
            num_holdout_authors=num_holdout_authors,
            seed=benchmark_seed,
        )
        kept_authors = set(kept["author_index"])
        learned = [r for r in learned if r["author_index"] in kept_authors]
    if base_model is None:
        tokenizer = build_tokenizer(
            tokenizer_corpus(
                num_authors=num_authors,
                questions_per_author=questions_per_author,
                num_holdout_authors=num_holdout_authors,
                seed=benchmark_seed,
            )
        )
        model = tiny_model(tokenizer, architecture, seed=seed, **(model_kwargs or {}))
    else:
        model, tokenizer = PRETRAINED_BASES[base_model]()
        ensure_pad_token(tokenizer)
    if lora_r > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=lora_r, lora_alpha=2 * lora_r, target_modules="all-linear", task_type="CAUSAL_LM")
        model = get_peft_model(model, lora)
    longest = max(len(tokenize_qa(tokenizer, r["question"], r["answer"])["input_ids"]) for r in records)
    if longest > model.config.max_position_embeddings:
        raise ValueError(
            f"The longest question/answer pair is {longest} tokens, more than the model's "
            f"max_position_embeddings={model.config.max_position_embeddings}; raise it in model_kwargs."
        )
    train = Dataset.from_list([tokenize_qa(tokenizer, r["question"], r["answer"]) for r in learned])
    stopper = _ExactMatchStopper(tokenizer, learned, target_exact_match, eval_every, batch_size=256)

    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{digest}-", dir=path.parent))
    try:
        trainer = _sft_trainer(
            model,
            tokenizer,
            train,
            str(staging / "trainer"),
            max_epochs=max_epochs,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
            show_progress=show_progress,
            callbacks=[stopper],
        )
        trainer.train()
        model = trainer.model
        if lora_r > 0:
            model = model.merge_and_unload()  # the target is a plain model; unlearning adds its own adapter
        epochs = round(trainer.state.epoch or 0)
        exact_match = stopper.exact_match if stopper.history and stopper.history[-1][0] == epochs else None
        if exact_match is None:
            exact_match = stopper.measure(model)
        seconds = time.perf_counter() - start
        info = {
            "epochs": epochs,
            "exact_match": exact_match,
            "exact_match_history": stopper.history,
            "seconds": seconds,
            "num_parameters": _count_parameters(model),
            "num_examples": len(train),
            "final_loss": next(
                (entry["loss"] for entry in reversed(trainer.state.log_history) if "loss" in entry), None
            ),
            "settings": settings,
            "transformers_version": transformers.__version__,
        }
        shutil.rmtree(staging / "trainer", ignore_errors=True)
        model.config.use_cache = True  # TRL turns it off for training; a saved model should generate with it
        with _progress_bars(show_progress):
            model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / "info.json").write_text(json.dumps(info, indent=2))
        try:
            os.rename(staging, path)
        except OSError:
            # Another process cached the same settings meanwhile; keep theirs.
            if not (path / "info.json").is_file():
                raise
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    # Return what the cache holds, not the trained object (SFTTrainer leaves a patched forward on it), so a
    # first and a cached run hand out the same thing.
    model, tokenizer = _load_cached(path, show_progress)
    info.update(cached=False, path=str(path))
    return model, tokenizer, info


def _load_cached(path: Path, show_progress: bool) -> tuple[PreTrainedModel, Any]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    with _progress_bars(show_progress):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer
