"""The answer metrics that read one teacher-forced pass per (question, answer), and their registry.

TOFU's answer probability, open-unlearning's exact memorisation and extraction strength, and MASC's exact-reproduction
bound all look at the same logits: those predicting each answer token given the question and the true answer so far.
:func:`hf_unlearn.evaluation.passes.score_answers` runs that forward once per example and keeps, per example, what
each of them reads (:class:`hf_unlearn.evaluation.passes.AnswerScores`: the log-probability sums and counts, the
teacher-forced argmaxes, the restricted margin's violations, and when asked the per-token log-probabilities and their
moments); ``AnswerScores``, ``score_answers``, ``score_qa_records`` and ``distribution_moments`` are still importable
from here.

A metric is one registered function (:func:`answer_metric`) that declares what it reads; :func:`measure_answers` runs
the one pass the requested metrics need (the margins, per-token values and moments only when one reads them) and
computes them all from it. The membership attacks, whose AUC needs two sets, declare what they read in
:data:`hf_unlearn.evaluation.membership.ATTACK_READS` and read the scores themselves
(:func:`hf_unlearn.evaluation.membership.membership_scores` with ``scored``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..objectives.masc.margin import exact_reproduction_bound, threshold_from_probability
from .passes import AnswerScores, distribution_moments, score_answers, score_qa_records


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
#: labels), ``margins`` (violation fractions of the restricted margin, at the metric's ``k`` and ``rho``),
#: ``token_log_probs`` (each answer token's log-probability, with the example's token ids) and ``token_moments``
#: (the mean and standard deviation of the log-probabilities under the model's distribution at each answer token).
READS = ("log_probs", "predictions", "margins", "token_log_probs", "token_moments")


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
    reads: Sequence[str] = (),
) -> tuple[list[AnswerScores], dict[str, float]]:
    """The records' scores (one :func:`score_qa_records` pass, with what the metrics read) and the values of the
    registered ``metrics`` computed from them. ``reads`` (of :data:`READS`): what the pass also keeps for a reader
    outside the registry, e.g. the membership attacks (:func:`hf_unlearn.evaluation.membership.attack_reads`)."""
    unknown = [name for name in metrics if name not in ANSWER_METRICS]
    if unknown:
        raise ValueError(f"Unknown answer metric(s) {unknown}; registered: {', '.join(ANSWER_METRICS)}.")
    if set(reads) - set(READS):
        raise ValueError(f"A pass gives {', '.join(READS)}; asked for {sorted(set(reads) - set(READS))}.")
    wanted = set(reads).union(*(ANSWER_METRICS[name].reads for name in metrics))
    scores = score_qa_records(
        model, tokenizer, records, k if "margins" in wanted else None, threshold_from_probability(rho), batch_size,
        show_progress, prompt_template, wanted,
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
    "distribution_moments",
    "measure_answers",
    "memorization_from",
    "score_answers",
    "score_qa_records",
]
