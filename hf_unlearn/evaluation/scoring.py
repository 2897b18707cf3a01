"""One teacher-forced pass per (question, answer) that the answer metrics read.

TOFU's answer probability, open-unlearning's exact memorisation and extraction strength, and MASC's exact-reproduction
bound all look at the same logits: those predicting each answer token given the question and the true answer so far.
:func:`score_answers` runs that forward once per example (batched by :func:`~hf_unlearn.evaluation.metrics.
score_teacher_forced`) and keeps, per example, what each of them reads:

* ``log_prob_sum`` and ``count``: the answer tokens' summed log-probability and their number (answer probability,
  truth ratio), reduced in the batch exactly as :func:`~hf_unlearn.evaluation.metrics.answer_log_probs` does;
* ``predictions`` and ``labels``: the argmax at every answer position but the last (memorisation metrics);
* ``violations``: with ``k``, the answer tokens whose restricted margin (:func:`hf_unlearn.objectives.masc.margin.
  restricted_margin`, self-competitors, beta 1) is above ``tau``, and their number in ``violation_fraction``;
* ``token_log_probs`` (when asked): the example's token ids, where its answer starts, and each answer token's
  log-probability, EOS included (the loss, zlib and Min-K% membership attacks);
* ``token_mean`` and ``token_std`` (when asked): at each answer token's position, the mean ``mu = sum_z p log p`` and
  the standard deviation ``sqrt(sum_z p (log p)^2 - mu^2)`` of ``log p(z | prefix)`` under the model's own
  distribution, what Min-K%++ standardises with (Zhang et al., "Min-K%++", ICLR 2025, arXiv 2404.02936, §3).

A metric is one registered function (:func:`answer_metric`) that declares what it reads; :func:`measure_answers` runs
the one pass the requested metrics need (the margins, per-token values and moments only when one reads them) and
computes them all from it. The membership attacks, whose AUC needs two sets, declare what they read in
:data:`hf_unlearn.evaluation.membership.ATTACK_READS` and read the scores themselves
(:func:`hf_unlearn.evaluation.membership.membership_scores` with ``scored``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..data.examples import IGNORE_INDEX, tokenize_qa
from ..objectives.masc.margin import (
    exact_reproduction_bound,
    restricted_margin,
    threshold_from_probability,
    violation_fractions,
)
from ..scores import shift_for_causal_lm, token_log_probs
from .metrics import pad_token_id_of, prompt_length, qa_records, score_teacher_forced


@dataclass
class AnswerScores:
    """What one teacher-forced pass over one (question, answer) gives (module docstring)."""

    log_prob_sum: float
    count: int
    predictions: list[int]
    labels: list[int]
    violation_fraction: float | None = None
    input_ids: tuple[int, ...] | None = None
    answer_start: int | None = None
    token_log_probs: torch.Tensor | None = None
    token_mean: torch.Tensor | None = None
    token_std: torch.Tensor | None = None

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
    reads: Collection[str] = (),
) -> list[AnswerScores]:
    """:class:`AnswerScores` of every tokenized example (``input_ids``, ``labels``), one forward each; with ``k``,
    the violation fraction of the restricted margin at threshold ``tau`` too; with ``"token_log_probs"`` or
    ``"token_moments"`` in ``reads``, the per-token values (the moments imply the log-probabilities)."""
    moments = "token_moments" in reads
    per_token = moments or "token_log_probs" in reads

    def read(logits: torch.Tensor, labels: torch.Tensor) -> list[AnswerScores]:
        log_probs, mask = token_log_probs(logits, labels)
        sums, counts = log_probs.sum(dim=-1).tolist(), mask.sum(dim=-1).tolist()
        shifted, shifted_labels = shift_for_causal_lm(logits, labels)
        argmaxes = shifted.argmax(dim=-1)
        fractions: list[float | None] = [None] * len(sums)
        if k is not None:
            fractions = violation_fractions(restricted_margin(shifted, shifted_labels, k=k), tau)[0].tolist()
        # Per row, the answer tokens' values in order (the mask's positions are the answer tokens, prompt first).
        tokens = log_probs[mask].cpu().split(counts) if per_token else [None] * len(sums)
        means, stds = distribution_moments(shifted[mask], counts) if moments else ([None] * len(sums),) * 2
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
                    token_log_probs=tokens[row],
                    token_mean=means[row],
                    token_std=stds[row],
                )  # fmt: skip
            )
        return scores

    scores = score_teacher_forced(
        model, examples, pad_token_id, read, batch_size, show_progress, desc="Scoring answers"
    )  # fmt: skip
    if per_token:  # what a reader matches its own tokens against (membership_scores)
        for score, example in zip(scores, examples, strict=True):
            score.input_ids, score.answer_start = tuple(example["input_ids"]), prompt_length(example)
    return scores


#: Positions whose full distribution :func:`distribution_moments` holds at once (a few (rows, vocabulary) float32
#: tensors: 256 x 128k is 128 MiB each), so a batch of long answers on a large vocabulary stays within memory.
MOMENT_CHUNK = 256


def distribution_moments(
    logits: torch.Tensor, counts: Sequence[int]
) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
    """Mean and standard deviation of ``log p(z | prefix)`` for ``z ~ p`` at each row of ``logits`` (N, V), on the
    CPU, split into ``counts``: Min-K%++'s ``mu = sum p log p`` and ``sigma^2 = sum p (log p)^2 - mu^2`` (Zhang et
    al., ICLR 2025, §3), in float32 as the attack's own forward computes them."""
    means, stds = [], []
    for chunk in logits.split(MOMENT_CHUNK):
        log_probs = torch.log_softmax(chunk.float(), dim=-1)
        probs = log_probs.exp()
        mean = (probs * log_probs).sum(-1)
        means.append(mean)
        stds.append(((probs * log_probs.square()).sum(-1) - mean.square()).clamp(min=0).sqrt())
    mean = torch.cat(means) if means else logits.new_zeros(0, dtype=torch.float32)
    std = torch.cat(stds) if stds else logits.new_zeros(0, dtype=torch.float32)
    return mean.cpu().split(list(counts)), std.cpu().split(list(counts))


def score_qa_records(
    model: Any,
    tokenizer: Any,
    records: Any,
    k: int | None = None,
    tau: float = 0.0,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
    reads: Collection[str] = (),
) -> list[AnswerScores]:
    """:func:`score_answers` of the records with ``question`` and ``answer``, tokenized as for learning
    (:func:`hf_unlearn.data.tokenize_qa`), in the records' order."""
    examples = [
        tokenize_qa(tokenizer, str(r["question"]), str(r["answer"]), prompt_template=prompt_template)
        for r in qa_records(records)
    ]
    return score_answers(model, examples, pad_token_id_of(tokenizer), k, tau, batch_size, show_progress, reads)


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
