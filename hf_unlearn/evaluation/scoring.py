"""One teacher-forced pass per (question, answer) that the answer metrics read.

TOFU's answer probability, open-unlearning's exact memorisation and extraction strength, and MASC's exact-reproduction
bound all look at the same logits: those predicting each answer token given the question and the true answer so far.
:func:`score_answers` runs that forward once per example (batched by :func:`~hf_unlearn.evaluation.metrics.
score_teacher_forced`) and keeps, per example, what each of them reads:

* ``log_prob_sum`` and ``count``: the answer tokens' summed log-probability and their number (answer probability,
  truth ratio), reduced in the batch exactly as :func:`~hf_unlearn.evaluation.metrics.answer_log_probs` does;
* ``predictions`` and ``labels``: the argmax at every answer position but the last (memorisation metrics);
* ``violations``: with ``k``, the answer tokens whose restricted margin (:func:`hf_unlearn.objectives.margin.
  restricted_margin`, self-competitors, beta 1) is above ``tau``, and their number in ``violation_fraction``.

A metric is one registered function (:func:`answer_metric`) that declares what it reads; :func:`measure_answers` runs
the one pass the requested metrics need (the margins only when one reads them) and computes them all from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.examples import IGNORE_INDEX, tokenize_qa
from ..objectives.margin import (
    exact_reproduction_bound,
    restricted_margin,
    shift_for_causal_lm,
    threshold_from_probability,
    token_log_probs,
    violation_fractions,
)
from .metrics import pad_token_id_of, qa_records, score_teacher_forced


@dataclass
class AnswerScores:
    """What one teacher-forced pass over one (question, answer) gives (module docstring)."""

    log_prob_sum: float
    count: int
    predictions: list[int]
    labels: list[int]
    violation_fraction: float | None = None

    @property
    def probability(self) -> float:
        """TOFU's answer probability ``exp(mean answer-token log-probability)`` (NaN without answer tokens)."""
        import math

        return math.exp(self.log_prob_sum / self.count) if self.count else float("nan")


def score_answers(
    model: Any,
    examples: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    k: int | None = None,
    tau: float = 0.0,
    batch_size: int = 32,
    show_progress: bool = False,
) -> list[AnswerScores]:
    """:class:`AnswerScores` of every tokenized example (``input_ids``, ``labels``), one forward each; with ``k``,
    the violation fraction of the restricted margin at threshold ``tau`` too."""

    def read(logits: torch.Tensor, labels: torch.Tensor) -> list[AnswerScores]:
        log_probs, mask = token_log_probs(logits, labels)
        sums, counts = log_probs.sum(dim=-1).tolist(), mask.sum(dim=-1).tolist()
        shifted, shifted_labels = shift_for_causal_lm(logits, labels)
        argmaxes = shifted.argmax(dim=-1)
        fractions: list[float | None] = [None] * len(sums)
        if k is not None:
            fractions = violation_fractions(restricted_margin(shifted, shifted_labels, k=k), tau)[0].tolist()
        scores = []
        for row, (row_predictions, row_labels) in enumerate(zip(argmaxes, shifted_labels, strict=True)):
            positions = (row_labels != IGNORE_INDEX).nonzero(as_tuple=True)[0][:-1]  # the EOS is not predicted
            scores.append(
                AnswerScores(
                    sums[row],
                    counts[row],
                    row_predictions[positions].tolist(),
                    row_labels[positions].tolist(),
                    fractions[row],
                )  # fmt: skip
            )
        return scores

    return score_teacher_forced(model, examples, pad_token_id, read, batch_size, show_progress, desc="Scoring answers")


def score_qa_records(
    model: Any,
    tokenizer: Any,
    records: Any,
    k: int | None = None,
    tau: float = 0.0,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[AnswerScores]:
    """:func:`score_answers` of the records with ``question`` and ``answer``, tokenized as for learning
    (:func:`hf_unlearn.data.tokenize_qa`), in the records' order."""
    examples = [
        tokenize_qa(tokenizer, str(r["question"]), str(r["answer"]), prompt_template=prompt_template)
        for r in qa_records(records)
    ]
    return score_answers(model, examples, pad_token_id_of(tokenizer), k, tau, batch_size, show_progress)


def memorization_from(scores: Sequence[AnswerScores]) -> dict[str, float]:
    """Mean exact memorisation and extraction strength (:mod:`hf_unlearn.evaluation.memorization`) of the scored
    answers that have a position besides EOS (NaN when none has)."""
    from .memorization import exact_memorization, extraction_strength

    scored = [s for s in scores if s.labels]
    if not scored:
        return {"exact_memorization": float("nan"), "extraction_strength": float("nan")}
    return {
        "exact_memorization": sum(exact_memorization(s.predictions, s.labels) for s in scored) / len(scored),
        "extraction_strength": sum(extraction_strength(s.predictions, s.labels) for s in scored) / len(scored),
    }


def bound_from(scores: Sequence[AnswerScores], rho: float) -> dict[str, float]:
    """MASC Proposition 1 from scores taken with ``k`` and ``tau = threshold_from_probability(rho)``: what
    :func:`~hf_unlearn.evaluation.metrics.reproduction_bound` reports (answers without tokens left out)."""
    kept = [s for s in scores if s.count > 0]
    if any(s.violation_fraction is None for s in kept):
        raise ValueError("bound_from needs scores taken with k (score_answers(..., k=..., tau=...)).")
    fractions = torch.tensor([s.violation_fraction for s in kept], dtype=torch.float32)
    lengths = torch.tensor([s.count for s in kept])
    bounds = exact_reproduction_bound(fractions, lengths, rho)
    return {"mean": bounds.mean().item(), "max": bounds.max().item(), "violation_rate": fractions.mean().item()}


#: What a pass can give a metric: ``log_probs`` (the sums and counts), ``predictions`` (teacher-forced argmaxes and
#: labels) and ``margins`` (violation fractions of the restricted margin, at the metric's ``k`` and ``rho``).
READS = ("log_probs", "predictions", "margins")


@dataclass(frozen=True)
class AnswerMetric:
    """A metric of answers scored by :func:`score_answers`: what it reads and how it turns the scores into values."""

    name: str
    reads: frozenset[str]
    compute: Callable[[Sequence[AnswerScores], float], dict[str, float]]


#: Every registered answer metric by name (:func:`answer_metric`); :func:`measure_answers` runs one pass for any of
#: them.
ANSWER_METRICS: dict[str, AnswerMetric] = {}


def answer_metric(name: str, reads: Sequence[str]) -> Callable[[Callable], Callable]:
    """Register ``compute(scores, rho) -> {key: value}`` as the answer metric ``name`` reading ``reads`` (of
    :data:`READS`)."""
    unknown = set(reads) - set(READS)
    if unknown:
        raise ValueError(f"Answer metric {name!r} reads {sorted(unknown)}; a pass gives {', '.join(READS)}.")

    def register(compute: Callable) -> Callable:
        ANSWER_METRICS[name] = AnswerMetric(name, frozenset(reads), compute)
        return compute

    return register


@answer_metric("probability", reads=("log_probs",))
def mean_probability(scores: Sequence[AnswerScores], rho: float) -> dict[str, float]:
    """TOFU's answer probability, averaged (NaN without answers)."""
    values = [s.probability for s in scores]
    return {"probability": sum(values) / len(values) if values else float("nan")}


@answer_metric("memorization", reads=("predictions",))
def memorization_metric(scores: Sequence[AnswerScores], rho: float) -> dict[str, float]:
    """open-unlearning's exact memorisation and extraction strength (:func:`memorization_from`)."""
    return memorization_from(scores)


@answer_metric("reproduction_bound", reads=("margins",))
def reproduction_bound_metric(scores: Sequence[AnswerScores], rho: float) -> dict[str, float]:
    """MASC's exact-reproduction bound, its maximum and the violation rate (:func:`bound_from`)."""
    bound = bound_from(scores, rho)
    return {
        "exact_reproduction_bound": bound["mean"],
        "exact_reproduction_bound_max": bound["max"],
        "violation_rate": bound["violation_rate"],
    }


def measure_answers(
    model: Any,
    tokenizer: Any,
    records: Any,
    metrics: Sequence[str],
    k: int = 10,
    rho: float = 0.5,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> tuple[list[AnswerScores], dict[str, float]]:
    """The records' scores (one :func:`score_qa_records` pass, with the margins when a metric reads them) and the
    values of the registered ``metrics`` computed from them."""
    unknown = [name for name in metrics if name not in ANSWER_METRICS]
    if unknown:
        raise ValueError(f"Unknown answer metric(s) {unknown}; registered: {', '.join(ANSWER_METRICS)}.")
    margins = any("margins" in ANSWER_METRICS[name].reads for name in metrics)
    scores = score_qa_records(
        model, tokenizer, records, k if margins else None, threshold_from_probability(rho), batch_size, show_progress,
        prompt_template,
    )  # fmt: skip
    values: dict[str, float] = {}
    for name in metrics:
        values.update(ANSWER_METRICS[name].compute(scores, rho))
    return scores, values


__all__ = [
    "ANSWER_METRICS",
    "READS",
    "AnswerMetric",
    "AnswerScores",
    "answer_metric",
    "bound_from",
    "measure_answers",
    "memorization_from",
    "score_answers",
    "score_qa_records",
]
