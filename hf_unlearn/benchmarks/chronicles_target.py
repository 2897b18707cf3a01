"""The learn stage of the chronicles corpus: a tiny model that has memorised the fictitious towns' chronicles (the
MUSE-shaped target to unlearn from: Shi et al., 2024, arXiv 2407.06460), or only the retain towns' (the
retain-only reference MUSE's PrivLeak and a forget-quality test compare with), learned with TRL's ``SFTTrainer``
and cached on disk like :func:`hf_unlearn.benchmarks.target_model.learn_target_model`. The texts come from
:mod:`hf_unlearn.benchmarks.fictitious_chronicles`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from datasets import Dataset
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from ..data.examples import tokenize_qa, tokenize_text
from ..evaluation.muse import knowmem, verbmem
from .fictitious_chronicles import (
    CHRONICLES_VERSION,
    build_chronicles_tokenizer,
    generate_chronicle_questions,
    load_chronicles_split,
    split_passage,
)
from .target_model import (
    LearnStopper,
    cache_path,
    from_cache,
    learn_into_cache,
    learning_lock,
    tiny_model,
)

__all__ = ["CHRONICLES_MODEL_KWARGS", "learn_chronicles_target_model"]

#: The tiny model's settings unless ``model_kwargs`` overrides them: room for the longest passage (about 120
#: tokens) plus generation, where :func:`~hf_unlearn.benchmarks.target_model.tiny_model_config` defaults to 128.
CHRONICLES_MODEL_KWARGS: dict[str, Any] = {"max_position_embeddings": 256}

_LEARN_SPLITS = ("full", "retain")
# MUSE generates 128 tokens for VerbMem (§3.1); a learned passage ends with EOS well before that.
_VERBMEM_NEW_TOKENS = 128


def _prompts_and_continuations(passages: Sequence[str]) -> tuple[list[str], list[str]]:
    """The ``verbmem_forget`` cut (:func:`~hf_unlearn.benchmarks.fictitious_chronicles.split_passage`) of any
    passages, as two lists."""
    halves = [split_passage(text) for text in passages]
    return [prompt for prompt, _ in halves], [continuation for _, continuation in halves]


class _VerbMemStopper(LearnStopper):
    """MUSE's VerbMem on the learned passages: the mean ROUGE-L F1 of the greedy continuation of each passage's first
    half against its second half (:func:`hf_unlearn.evaluation.muse.verbmem`).

    ROUGE-L rather than exact continuation: it is the measure unlearning is judged by, and it rewards a model that
    has the passage nearly by heart (one wrong word late in a 40-word continuation) almost fully.
    """

    def __init__(self, tokenizer: Any, passages: Sequence[str], target: float, every: int, batch_size: int) -> None:
        super().__init__(target, every)
        self.tokenizer = tokenizer
        self.prompts, self.continuations = _prompts_and_continuations(passages)
        self.batch_size = batch_size

    def score(self, model: Any) -> float:
        return verbmem(
            model,
            self.tokenizer,
            self.prompts,
            self.continuations,
            max_new_tokens=_VERBMEM_NEW_TOKENS,
            batch_size=self.batch_size,
        )


def learn_chronicles_target_model(
    cache_dir: str | os.PathLike[str] | None = None,
    architecture: str = "llama",
    seed: int = 0,
    max_epochs: int = 60,
    learning_rate: float = 3e-3,
    target_verbmem: float = 0.9,
    show_progress: bool = True,
    *,
    num_subjects: int = 10,
    num_holdout_subjects: int = 3,
    passages_per_subject: int = 4,
    num_forget_subjects: int = 2,
    benchmark_seed: int = 0,
    batch_size: int = 16,
    eval_every: int = 5,
    model_kwargs: Mapping[str, Any] | None = None,
    learn_split: str = "full",
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, dict[str, Any]]:
    """Make the chronicles "target model": a tiny causal LM that has the learned towns' passages by heart and
    knows their facts, the MUSE-shaped counterpart of :func:`~hf_unlearn.benchmarks.target_model.
    learn_target_model`.

    It learns, with TRL's ``SFTTrainer``, the passages of the learned towns tokenized by
    :func:`hf_unlearn.data.tokenize_text` (every token scored: the model memorises the text) together with the
    towns' questions tokenized by :func:`hf_unlearn.data.tokenize_qa` (prompt masked: the model answers them),
    since MUSE's target model is fine-tuned on the forget and retain corpora and then both knows the facts
    (KnowMem) and reproduces the text (VerbMem). ``learn_split="retain"`` learns only the retain towns'
    passages and questions: the retain-only ("retrained") reference that never saw the forget towns.

    Every ``eval_every`` epochs VerbMem is measured on the learned passages (greedy continuation of each
    passage's first half, ROUGE-L F1 against the second half, :func:`hf_unlearn.evaluation.muse.verbmem`) and learning
    stops once it reaches ``target_verbmem`` (or after ``max_epochs``).

    ``model_kwargs`` go to :func:`~hf_unlearn.benchmarks.target_model.tiny_model` over
    :data:`CHRONICLES_MODEL_KWARGS`; a passage longer than the model's ``max_position_embeddings`` is an error.
    The result is cached under ``cache_dir`` (default ``$HF_UNLEARN_CACHE`` or ``~/.cache/hf_unlearn``) in
    ``chronicles/<hash of all settings>``, written to a temporary folder and renamed into place; a later call
    with the same settings loads it (``info["cached"]`` is then ``True``).

    Returns ``(model, tokenizer, info)`` with the model in eval mode, loaded from the cache; ``info`` has
    ``epochs``, ``verbmem`` (on the learned passages, what stopped learning) and its ``verbmem_history``,
    ``knowmem`` (on the learned questions), ``verbmem_forget``/``verbmem_retain``/``verbmem_holdout`` and
    ``knowmem_forget``/``knowmem_retain``/``knowmem_holdout`` (MUSE's measures on each part for
    ``num_forget_subjects``, the holdout towns being never learned), ``seconds`` (learning, without these
    measures), ``num_parameters``, ``num_examples``, ``final_loss``, ``cached``, ``path`` and the ``settings``.
    """
    if learn_split not in _LEARN_SPLITS:
        raise ValueError(f"learn_split must be one of {', '.join(_LEARN_SPLITS)}, got {learn_split!r}.")
    effective_model_kwargs = {**CHRONICLES_MODEL_KWARGS, **(model_kwargs or {})}
    settings: dict[str, Any] = {
        "version": CHRONICLES_VERSION,
        "architecture": architecture,
        "seed": seed,
        "max_epochs": max_epochs,
        "learning_rate": learning_rate,
        "target_verbmem": target_verbmem,
        "num_subjects": num_subjects,
        "num_holdout_subjects": num_holdout_subjects,
        "passages_per_subject": passages_per_subject,
        "benchmark_seed": benchmark_seed,
        "batch_size": batch_size,
        "eval_every": eval_every,
        "model_kwargs": dict(sorted(effective_model_kwargs.items())),
        "learn_split": learn_split,
    }
    if learn_split != "full":
        # The full model does not depend on which towns are called "forget", so only the retain-only one keys on it.
        settings["num_forget_subjects"] = num_forget_subjects
    parts = _Chronicles(
        num_forget_subjects,
        {
            "num_subjects": num_subjects,
            "num_holdout_subjects": num_holdout_subjects,
            "passages_per_subject": passages_per_subject,
            "seed": benchmark_seed,
        },
    )
    # Validate the split arguments (num_forget_subjects, counts) before looking at the cache.
    forget, retain, holdout = parts.split("forget"), parts.split("retain"), parts.split("holdout")
    path = cache_path(cache_dir, "chronicles", settings)
    with learning_lock(path):
        cached = from_cache(path, show_progress)
        if cached is not None:
            model, tokenizer, info = cached
            if info["num_forget_subjects"] != num_forget_subjects:
                # The same full model cut into forget and retain towns differently: per-part scores follow the cut.
                info.update(_muse_scores(model, tokenizer, parts), num_forget_subjects=num_forget_subjects)
            return model, tokenizer, info

        return _learn_chronicles(parts, forget, retain, holdout, path, settings, show_progress)


def _learn_chronicles(
    parts: _Chronicles,
    forget: Dataset,
    retain: Dataset,
    holdout: Dataset,
    path: Any,
    settings: dict[str, Any],
    show_progress: bool,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, dict[str, Any]]:
    """Learn the target the cache key ``settings`` describes (its passages and questions) into ``path``."""
    start = time.perf_counter()
    full = settings["learn_split"] == "full"
    learned_passages = list(retain["text"]) + (list(forget["text"]) if full else [])
    learned_qa = list(parts.split("knowmem_retain").select_columns(["question", "answer"]))
    if full:
        learned_qa += list(parts.split("knowmem_forget").select_columns(["question", "answer"]))
    tokenizer = build_chronicles_tokenizer(**parts.generate_kwargs)
    model = tiny_model(tokenizer, settings["architecture"], seed=settings["seed"], **settings["model_kwargs"])
    texts = [tokenize_text(tokenizer, text) for text in learned_passages]
    qa = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in learned_qa]
    longest = _check_passages_fit(
        model, tokenizer, list(forget["text"]) + list(retain["text"]) + list(holdout["text"])
    )
    train = Dataset.from_list(texts + qa)
    stopper = _VerbMemStopper(
        tokenizer, learned_passages, settings["target_verbmem"], settings["eval_every"], batch_size=64
    )
    own_info = {
        "num_forget_subjects": parts.num_forget_subjects,
        "num_passages": len(texts),
        "longest_passage_tokens": longest,
    }
    return learn_into_cache(
        model,
        tokenizer,
        train,
        path,
        settings,
        partial(_summarize_chronicles, stopper, start, tokenizer, learned_qa, parts, own_info),
        stopper,
        max_epochs=settings["max_epochs"],
        learning_rate=settings["learning_rate"],
        batch_size=settings["batch_size"],
        seed=settings["seed"],
        show_progress=show_progress,
    )


class _Chronicles:
    """The generated corpus's splits for one cut into forget and retain towns (``generate_kwargs``: its counts and
    seed)."""

    def __init__(self, num_forget_subjects: int, generate_kwargs: dict[str, Any]) -> None:
        self.num_forget_subjects = num_forget_subjects
        self.generate_kwargs = generate_kwargs

    def split(self, name: str) -> Dataset:
        return load_chronicles_split(name, num_forget_subjects=self.num_forget_subjects, **self.generate_kwargs)

    def holdout_qa(self) -> Dataset:
        questions = [r for r in generate_chronicle_questions(**self.generate_kwargs) if r["is_holdout"]]
        return Dataset.from_dict({key: [r[key] for r in questions] for key in ("question", "answer")})


def _check_passages_fit(model: Any, tokenizer: Any, passages: Sequence[str]) -> int:
    """The longest passage's token count, after refusing a model whose positions cannot hold it, or hold the longest
    VerbMem prompt followed by the tokens VerbMem generates."""
    longest = max(len(tokenize_text(tokenizer, text)["input_ids"]) for text in passages)
    longest_prompt = max(len(tokenizer(split_passage(text)[0])["input_ids"]) for text in passages)
    if max(longest, longest_prompt + _VERBMEM_NEW_TOKENS) > model.config.max_position_embeddings:
        # Learning reads a whole passage; VerbMem feeds its first half and generates up to 128 tokens (a model that
        # has not learned, or has unlearned, a passage may not stop at its end). GPT-2 cannot go past its positions.
        raise ValueError(
            f"The longest passage is {longest} tokens and the longest VerbMem prompt {longest_prompt}, followed by "
            f"up to {_VERBMEM_NEW_TOKENS} generated tokens: more than the model's max_position_embeddings="
            f"{model.config.max_position_embeddings}. Raise max_position_embeddings in model_kwargs."
        )
    return longest


def _summarize_chronicles(
    stopper: _VerbMemStopper,
    start: float,
    tokenizer: Any,
    learned_qa: list[Mapping[str, Any]],
    parts: _Chronicles,
    own_info: dict[str, Any],
    trainer: Any,
    epochs: int,
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """The learned target and its ``info``: VerbMem at the end and its history, KnowMem on the learned questions,
    MUSE's scores per part, the learning seconds (without these measures) and ``own_info``."""
    model = trainer.model
    measured = stopper.final(model, epochs)
    learn_seconds = time.perf_counter() - start
    learned_knowmem = knowmem(
        model, tokenizer, [r["question"] for r in learned_qa], [r["answer"] for r in learned_qa], batch_size=64
    )
    return model, {
        "verbmem": measured,
        "verbmem_history": stopper.history,
        "knowmem": learned_knowmem,
        "num_forget_subjects": own_info["num_forget_subjects"],
        **_muse_scores(model, tokenizer, parts),
        "seconds": learn_seconds,
        "num_passages": own_info["num_passages"],
        "longest_passage_tokens": own_info["longest_passage_tokens"],
    }


def _muse_scores(model: Any, tokenizer: Any, parts: _Chronicles) -> dict[str, float]:
    """VerbMem and KnowMem (MUSE §3.1) on the forget, retain and never-learned holdout towns, for ``info``."""
    scores: dict[str, float] = {}
    for name in ("forget", "retain", "holdout"):
        prompts, continuations = _prompts_and_continuations(list(parts.split(name)["text"]))
        scores[f"verbmem_{name}"] = verbmem(
            model, tokenizer, prompts, continuations, max_new_tokens=_VERBMEM_NEW_TOKENS, batch_size=64
        )
    for name, qa in (
        ("forget", parts.split("knowmem_forget")),
        ("retain", parts.split("knowmem_retain")),
        ("holdout", parts.holdout_qa()),
    ):
        scores[f"knowmem_{name}"] = knowmem(model, tokenizer, list(qa["question"]), list(qa["answer"]), batch_size=64)
    return scores
