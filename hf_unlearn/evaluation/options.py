"""TOFU's truth ratio and its normalised probability over a question's options (Maini et al. 2024, §2.5).

Both read the options' scores that :func:`hf_unlearn.evaluation.passes.option_scores` takes in one batched pass
(each question's prompt encoded once for all its options, :func:`hf_unlearn.evaluation.passes.score_after_prompts`);
this module computes the metrics from them. ``option_scores`` and ``score_after_prompts`` are still importable from
here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .passes import option_scores, score_after_prompts

__all__ = [
    "normalized_probabilities",
    "normalized_probabilities_from",
    "option_scores",
    "real_knowledge_options",
    "score_after_prompts",
    "truth_ratios",
    "truth_ratios_from",
]


def truth_ratios(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[float]:
    """Per question TOFU truth ratio ``P~(perturbed) / P~(paraphrased)`` (Maini et al. 2024, §2.5).

    ``P~(a) = exp(-mean token NLL of a)``; the perturbed answers are averaged in log space. Records need
    ``question``, ``paraphrased_answer`` and ``perturbed_answer`` (a list of strings); others are skipped.
    """
    scores = option_scores(
        model, tokenizer, dataset_or_records, "paraphrased_answer", batch_size, show_progress, prompt_template
    )
    return truth_ratios_from(scores)


def truth_ratios_from(scores: Sequence[tuple[float, list[float]]]) -> list[float]:
    """Truth ratios from :func:`option_scores` (base = the paraphrased answer)."""
    return [math.exp(sum(perturbed) / len(perturbed) - base) for base, perturbed in scores]


def normalized_probabilities(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[float]:
    """Per question ``P~(answer) / (P~(answer) + sum P~(perturbed))``: TOFU's "Prob" on the real-authors and
    world-facts sets (Maini et al. 2024, §2.5), where the perturbed answers act as wrong options."""
    scores = option_scores(model, tokenizer, dataset_or_records, "answer", batch_size, show_progress, prompt_template)
    return normalized_probabilities_from(scores)


def normalized_probabilities_from(scores: Sequence[tuple[float, list[float]]]) -> list[float]:
    """Normalised probabilities from :func:`option_scores` (base = the answer)."""
    return [1.0 / (1.0 + sum(math.exp(p - base) for p in perturbed)) for base, perturbed in scores]


def real_knowledge_options(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> tuple[list[float], list[float]]:
    """Per question of a real-knowledge set (TOFU's real authors and world facts, Maini et al. 2024, §2.5): the
    probability normalised over the answer and its perturbed answers, and the truth ratio.

    TOFU's real-knowledge sets compare the perturbed answers with the answer itself (the loader sets it as the
    paraphrase): the truth ratio then reads the same option scores instead of a second pass over every option."""
    shared = {"batch_size": batch_size, "show_progress": show_progress, "prompt_template": prompt_template}
    scores = option_scores(model, tokenizer, dataset_or_records, "answer", **shared)
    if all("paraphrased_answer" in r and r["paraphrased_answer"] == r["answer"] for r in dataset_or_records):
        return normalized_probabilities_from(scores), truth_ratios_from(scores)
    return normalized_probabilities_from(scores), truth_ratios(model, tokenizer, dataset_or_records, **shared)
