"""TOFU on a pretrained model, the regime of the MASC and TOFU papers: a base model (SmolLM2-135M-Instruct by default,
offline) fine-tuned on some of TOFU's fictitious authors through its chat template, the target to unlearn from; the
same base fine-tuned without the forget authors, the never-trained reference; authors never learned, the calibration
set and the membership attack's non-members.

The rows come from a folder in TOFU's schema (:func:`hf_unlearn.data.load_tofu_folder`: ``authors.jsonl`` and,
optionally, ``real_authors.jsonl`` and ``world_facts.jsonl``). The authors are assigned to roles in order of their
id (:class:`TofuAuthorSplit`): the first ``num_forget`` are forgotten, the next ``num_retain`` kept, then the
calibration and holdout authors, never learned. Like the embedded benchmark's learn stage
(:mod:`hf_unlearn.benchmarks.target_model`), learning is cached on disk under a digest of its settings and of the
learned rows.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from datasets import Dataset

from ..data.examples import ensure_pad_token, tokenize_qa
from ..data.loaders import load_tofu_folder
from ..evaluation.metrics import default_max_new_tokens, generate_answers, rouge_l_recall
from ..training.adapters import lora_config, with_adapter
from .target_model import (
    PRETRAINED_BASES,
    LearnStopper,
    cache_path,
    from_cache,
    learn_into_cache,
    learning_lock,
    tiny_model,
)
from .tokenizer import train_bpe_tokenizer

#: The base models :func:`learn_tofu_target` knows by name; any other name is loaded as a local folder or Hub id.
#: ``tiny`` is a randomly initialised ~1M-parameter Llama with a BPE tokenizer trained on the folder's text: the
#: CI-sized miniature, not a model anyone would unlearn.
TOFU_BASES = (*PRETRAINED_BASES, "tiny")
TOFU_BENCHMARK_VERSION = 1


@dataclass(frozen=True)
class TofuAuthorSplit:
    """Which TOFU authors play which role, by author id."""

    forget: tuple[int, ...]
    retain: tuple[int, ...]
    calibration: tuple[int, ...]
    holdout: tuple[int, ...]

    @property
    def learned(self) -> tuple[int, ...]:
        return self.forget + self.retain

    @classmethod
    def in_order(
        cls, author_ids: Sequence[int], num_forget: int = 2, num_retain: int = 4, num_calibration: int = 2,
        num_holdout: int = 2, offset: int = 0,
    ) -> TofuAuthorSplit:  # fmt: skip
        """The first ``num_forget`` authors (by id, starting ``offset`` authors in and wrapping round) forgotten,
        the next ``num_retain`` kept, then the calibration and the holdout authors (never learned)."""
        authors = sorted(set(int(a) for a in author_ids))
        if authors:
            shift = offset % len(authors)
            authors = authors[shift:] + authors[:shift]
        counts = {"num_forget": num_forget, "num_retain": num_retain, "num_calibration": num_calibration}
        if min(counts.values()) < 1 or num_holdout < 1:
            raise ValueError(f"Every role needs at least one author, got {counts} and num_holdout={num_holdout}.")
        needed = num_forget + num_retain + num_calibration + num_holdout
        if needed > len(authors):
            raise ValueError(
                f"The TOFU folder has {len(authors)} authors; forget {num_forget} + retain {num_retain} + "
                f"calibration {num_calibration} + holdout {num_holdout} = {needed} are needed."
            )
        ends = [num_forget, num_forget + num_retain, num_forget + num_retain + num_calibration, needed]
        starts = [0, *ends[:-1]]
        return cls(*(tuple(authors[a:b]) for a, b in zip(starts, ends, strict=True)))


def tofu_sets(tofu_dir: str, split: TofuAuthorSplit, questions_per_author: int | None = None) -> dict[str, Dataset]:
    """``forget``, ``retain``, ``calibration`` and ``holdout`` question/answer sets of ``split``'s authors (the first
    ``questions_per_author`` questions of each, default all), and the folder's ``real_authors``/``world_facts``."""
    loaded = load_tofu_folder(tofu_dir)
    authors = loaded.pop("authors")
    kept: dict[int, int] = {}
    rows_by_role: dict[str, list[dict[str, Any]]] = {
        role: [] for role in ("forget", "retain", "calibration", "holdout")
    }
    role_of = {a: role for role in rows_by_role for a in getattr(split, role)}
    for row in authors:
        author = int(row["author"])
        role = role_of.get(author)
        if role is None or (questions_per_author is not None and kept.get(author, 0) >= questions_per_author):
            continue
        kept[author] = kept.get(author, 0) + 1
        rows_by_role[role].append({"question": row["question"], "answer": row["answer"], "author": author})
    sets = {role: Dataset.from_list(rows) for role, rows in rows_by_role.items()}
    return {**sets, **loaded}


class RougeStopper(LearnStopper):
    """Greedy ROUGE-L recall on the learned QA: TOFU's answers are sentences a small model learns to reproduce
    nearly, rarely to the character (exact match stays low when every fact is known)."""

    def __init__(self, tokenizer: Any, records: Sequence[Mapping[str, Any]], target: float, every: int) -> None:
        super().__init__(target, every)
        self.tokenizer = tokenizer
        self.questions = [r["question"] for r in records]
        self.answers = [r["answer"] for r in records]
        self.max_new_tokens = default_max_new_tokens(tokenizer, self.answers)

    def score(self, model: Any) -> float:
        predictions = generate_answers(model, self.tokenizer, self.questions, self.max_new_tokens)
        scores = rouge_l_recall(predictions, self.answers)
        return sum(scores) / len(scores)


def _base(base_model: str, texts: Sequence[str], seed: int) -> tuple[Any, Any]:
    if base_model in PRETRAINED_BASES:
        return PRETRAINED_BASES[base_model]()
    if base_model == "tiny":
        tokenizer = train_bpe_tokenizer(list(texts), vocab_size=1024)
        return tiny_model(tokenizer, "llama", seed=seed, max_position_embeddings=256), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(base_model), AutoTokenizer.from_pretrained(base_model)


def learn_tofu_target(
    tofu_dir: str,
    authors: Sequence[int],
    base_model: str = "smollm2",
    *,
    questions_per_author: int | None = None,
    lora_r: int = 32,
    learning_rate: float = 1e-3,
    max_epochs: int = 10,
    target_rouge_l: float = 0.9,
    batch_size: int = 8,
    eval_every: int = 2,
    seed: int = 0,
    cache_dir: str | None = None,
    show_progress: bool = False,
) -> tuple[Any, Any, dict[str, Any]]:
    """``base_model`` fine-tuned on the QA of ``authors`` from the TOFU folder ``tofu_dir`` (completion-only SFT
    through the tokenizer's chat template, TRL's ``SFTTrainer``), through a LoRA adapter of rank ``lora_r`` on all
    linear layers (merged into the returned model; 0 = full fine-tuning), until greedy ROUGE-L recall on the learned
    QA reaches ``target_rouge_l`` (measured every ``eval_every`` epochs) or ``max_epochs``. The defaults are the
    ones measured to learn six authors on SmolLM2-135M-Instruct in 8 epochs (ROUGE-L 0.97).

    Cached like :func:`~hf_unlearn.benchmarks.learn_target_model` (``info["cached"]``); the cache key includes a
    digest of the learned rows, so an edited folder is learned anew."""
    split_rows = tofu_sets(
        tofu_dir, TofuAuthorSplit(tuple(authors), (), (), ()), questions_per_author=questions_per_author
    )["forget"]
    learned = [dict(r) for r in split_rows]
    if not learned:
        raise ValueError(f"None of the authors {list(authors)} is in {tofu_dir!r}.")
    rows_digest = hashlib.sha256(json.dumps(learned, sort_keys=True).encode()).hexdigest()[:16]
    settings = {
        "version": TOFU_BENCHMARK_VERSION,
        "base_model": base_model,
        "rows": rows_digest,
        "lora_r": lora_r,
        "learning_rate": learning_rate,
        "max_epochs": max_epochs,
        "target_rouge_l": target_rouge_l,
        "batch_size": batch_size,
        "eval_every": eval_every,
        "seed": seed,
    }
    path = cache_path(cache_dir, "tofu", settings)
    with learning_lock(path):
        cached = from_cache(path, show_progress=False)  # a bar while learning; a cached model loads in seconds
        if cached is not None:
            return cached
        start = time.perf_counter()
        all_rows = load_tofu_folder(tofu_dir)["authors"]
        model, tokenizer = _base(base_model, [f"{r['question']} {r['answer']}" for r in all_rows], seed)
        ensure_pad_token(tokenizer)
        if lora_r > 0:
            model = with_adapter(model, lora_config(lora_r, "all-linear", dropout=0.0))
        train = Dataset.from_list([tokenize_qa(tokenizer, r["question"], r["answer"]) for r in learned])
        stopper = RougeStopper(tokenizer, learned, target_rouge_l, eval_every)

        def summarize(trainer: Any, epochs: int) -> tuple[Any, dict[str, Any]]:
            trained = trainer.model.merge_and_unload() if lora_r > 0 else trainer.model
            return trained, {
                "rouge_l_recall": stopper.final(trained, epochs),
                "rouge_l_history": stopper.history,
                "seconds": time.perf_counter() - start,
                "authors": list(authors),
            }

        return learn_into_cache(
            model, tokenizer, train, path, settings, summarize, stopper, max_epochs=max_epochs,
            learning_rate=learning_rate, batch_size=batch_size, seed=seed, show_progress=show_progress,
            description=f"Learning TOFU authors {', '.join(map(str, authors))}",
        )  # fmt: skip


def describe_split(split: TofuAuthorSplit) -> dict[str, list[int]]:
    return {role: list(ids) for role, ids in asdict(split).items()}


__all__ = [
    "TOFU_BASES",
    "RougeStopper",
    "TofuAuthorSplit",
    "describe_split",
    "learn_tofu_target",
    "tofu_sets",
]
