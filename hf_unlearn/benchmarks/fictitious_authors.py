"""An embedded, offline, deterministic benchmark of question/answer pairs about fictitious authors.

It has the shape of TOFU (Maini et al., 2024, "TOFU: A Task of Fictitious Unlearning for LLMs",
locuslab/TOFU): every record has ``question``, ``answer``, ``paraphrased_answer`` and ``perturbed_answer``,
and the forget splits ``forget01``/``forget05``/``forget10`` are the last 1/5/10 % of the authors, the retain
splits their complement. Everything is generated from a seed, so it needs no download, and it is small enough
that a ~1M-parameter model memorises it on a CPU in about a minute (:func:`learn_target_model`), which gives
the tests and examples a real "target model" to unlearn from. This module is the data (records, splits,
tokenizer); :mod:`hf_unlearn.benchmarks.target_model` is the learn stage that makes a model memorise it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

from datasets import Dataset
from transformers import PreTrainedTokenizerFast

from ..data.prompts import PLAIN_PROMPT_TEMPLATE
from .author_facts import ATTRIBUTES, fill, random_author_name
from .tokenizer import train_bpe_tokenizer

__all__ = [
    "BENCHMARK_VERSION",
    "BENCHMARK_SIZES",
    "SPLIT_NAMES",
    "benchmark_size",
    "build_tokenizer",
    "generate_benchmark",
    "load_split",
    "retain_split_for",
    "tokenizer_corpus",
    "train_bpe_tokenizer",
]

#: Bumped whenever what the target model learns from changes (tokenizer corpus, learned records, model, recipe),
#: so caches are not reused. The perturbed answers are not learned, so they are not part of it.
BENCHMARK_VERSION = "2"

#: Names of the splits :func:`load_split` knows.
SPLIT_NAMES = (
    "forget01",
    "forget05",
    "forget10",
    "retain99",
    "retain95",
    "retain90",
    "holdout",
    "calibration",
    "full",
)
#: Authors of the ``calibration`` split: generated after the holdout authors, never learned, never in the tokenizer's
#: corpus, and kept apart from ``holdout`` (the non-members of the membership attack), so that a stopping rule
#: calibrated on them is not tuned on the evaluation's own data.
NUM_CALIBRATION_AUTHORS = 4

#: Named sizes of the benchmark: :func:`generate_benchmark`'s settings and the calibration authors. ``quick`` is the
#: demo's (4 authors, 20 answers, on each side of the membership attack: too few to judge any attack at the region's
#: ±0.1). ``judge`` has 64 authors of 5 answers on each side (forget10 of 640 learned authors; 64 holdout and 64
#: calibration authors): the answers of one author are not independent (they share the author's name), so an
#: interval resamples authors, and at 64 a side the paired interval of an attack's difference to the never-trained
#: model is narrower than ±0.1, where a verdict can say "lands" or "tells" (issue 66; docs/studies/judge_size.md).
BENCHMARK_SIZES: dict[str, dict[str, int]] = {
    "quick": {
        "num_authors": 40,
        "questions_per_author": 5,
        "num_holdout_authors": 4,
        "num_calibration_authors": NUM_CALIBRATION_AUTHORS,
    },
    "judge": {
        "num_authors": 640,
        "questions_per_author": 5,
        "num_holdout_authors": 64,
        "num_calibration_authors": 64,
    },
}


def benchmark_size(name: str) -> dict[str, int]:
    """The settings of the named size (:data:`BENCHMARK_SIZES`), for :func:`load_split`, :func:`tokenizer_corpus` and
    :func:`~hf_unlearn.benchmarks.learn_target_model`."""
    if name not in BENCHMARK_SIZES:
        raise ValueError(f"Unknown benchmark size {name!r}; choose one of {', '.join(BENCHMARK_SIZES)}.")
    return dict(BENCHMARK_SIZES[name])


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
    if not 1 <= questions_per_author <= len(ATTRIBUTES):
        raise ValueError(
            f"questions_per_author must be between 1 and {len(ATTRIBUTES)} (the number of distinct attributes), "
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
        for key, sample, question, answer, paraphrase in rng.sample(ATTRIBUTES, questions_per_author):
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
                    "question": fill(question, name, value),
                    "answer": fill(answer, name, value),
                    "paraphrased_answer": fill(paraphrase, name, value),
                    "perturbed_answer": [
                        fill(paraphrase if perturbed_template == "paraphrase" else answer, name, w) for w in wrong
                    ],
                    "is_holdout": index >= num_authors,
                }
            )
    return records


def _new_author_name(rng: random.Random, taken: set[str]) -> str:
    """A full name not in ``taken`` (updated), preferring a first name and a surname no other author has."""
    for attempt in range(10_000):
        name = random_author_name(rng)
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
    other learned authors. ``holdout``: the holdout authors. ``calibration``: :data:`NUM_CALIBRATION_AUTHORS` more
    never-learned authors, generated after the holdout ones (what a calibrated stopping rule compares with).
    ``full``: all learned authors. ``num_calibration_authors`` (default :data:`NUM_CALIBRATION_AUTHORS`) sets how many
    calibration authors there are; the other splits do not depend on it.
    """
    if name not in SPLIT_NAMES:
        raise ValueError(f"Unknown split {name!r}; valid names are: {', '.join(SPLIT_NAMES)}.")
    num_calibration_authors = generate_kwargs.pop("num_calibration_authors", NUM_CALIBRATION_AUTHORS)
    if name == "calibration":
        # Authors are generated one after another, so adding more after the holdout ones changes no earlier record.
        holdout = generate_kwargs.get("num_holdout_authors", 4)
        kwargs = dict(generate_kwargs, num_holdout_authors=holdout + num_calibration_authors)
        records = generate_benchmark(**kwargs)
        first = len({r["author_index"] for r in records if not r["is_holdout"]}) + holdout
        return Dataset.from_list([r for r in records if r["author_index"] >= first])
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
    """The records the benchmark's tokenizer is trained on: every author of the benchmark, learned, holdout and
    calibration ones (``num_calibration_authors``, default :data:`NUM_CALIBRATION_AUTHORS`), with the first version's
    perturbed answers (the ``answer`` template, so that moving the perturbed answers to the paraphrase template changed
    no cached model).

    The calibration authors are in it since ``BENCHMARK_VERSION`` 2. Without them their names and values were the only
    text the tokenizer had not seen: 13.4 tokens an answer against 9.0 for the holdout and the forget authors', and
    1.95 nats lower Min-K% under the never-trained model, so a stop calibrated on them compared the forget set with
    data less familiar than any never-seen author of the benchmark (issue 32). A pretrained tokenizer treats a
    user's forget, calibration and holdout text alike; so does this one now."""
    holdout = generate_kwargs.pop("num_holdout_authors", 4)
    calibration = generate_kwargs.pop("num_calibration_authors", NUM_CALIBRATION_AUTHORS)
    never_learned = holdout + calibration
    return generate_benchmark(**generate_kwargs, num_holdout_authors=never_learned, perturbed_template="answer")


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
    return train_bpe_tokenizer(_benchmark_texts(records), vocab_size)
