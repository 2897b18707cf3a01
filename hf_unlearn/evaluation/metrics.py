"""Question/answer metrics of TOFU (Maini et al., 2024, "TOFU: A Task of Fictitious Unlearning for LLMs"), batched.

* ROUGE-L recall of the greedy answer against the reference answer (TOFU's "ROUGE"),
* the answer probability ``P(a | q) ** (1 / |a|)``, i.e. ``exp(-mean token NLL)`` of the reference answer given
  the question (TOFU's "Prob" on the forget and retain sets),
* exact match of the greedy answer (after whitespace, case and trailing-punctuation normalisation),
* truth ratios and their aggregates, forget quality (two-sample KS test against a retain-only model's truth
  ratios), model utility (harmonic mean) and MASC's exact-reproduction bound (Proposition 1, arXiv 2606.02920).
  Everything here measures a model on records; :func:`hf_unlearn.evaluation.suites.evaluate_unlearning` puts them
  together, and the benchmark suites that load TOFU, MUSE or the embedded data live there too.

The model's passes they read (generation, teacher-forced scoring) run in :mod:`hf_unlearn.evaluation.passes`; the
names of the passes this module always exported are still importable from here.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable, Sequence
from typing import Any

from scipy.stats import hmean, ks_2samp

from ..data.examples import IGNORE_INDEX, tokenize_qa
from ..objectives.masc.margin import exact_reproduction_bound, measure_violations, threshold_from_probability
from .passes import (
    GENERATION_BATCH_SIZE,
    answer_log_probs,
    generate_answers,
    generate_continuations,
    pad_token_id_of,
    qa_records,
    score_teacher_forced,
)

__all__ = [
    "answer_log_probs",
    "answer_probability",
    "GENERATION_BATCH_SIZE",
    "default_max_new_tokens",
    "evaluate_qa",
    "exact_match",
    "forget_quality",
    "generate_answers",
    "generate_continuations",
    "model_utility",
    "pad_token_id_of",
    "qa_records",
    "reproduction_bound",
    "rouge_l_f1",
    "rouge_l_recall",
    "score_teacher_forced",
]


def answer_probability(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[float]:
    """Per example ``exp(-mean token NLL)`` of the answer, i.e. ``P(a | q) ** (1 / |a|)`` (TOFU's "Prob")."""
    return [
        math.exp(total / count) if count else float("nan")
        for total, count in answer_log_probs(
            model, tokenizer, questions, answers, batch_size, show_progress, prompt_template
        )
    ]


_ROUGE_SCORER: Any = None


def _rouge_l(predictions: Sequence[str], references: Sequence[str], measure: str) -> list[float]:
    global _ROUGE_SCORER
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions but {len(references)} references.")
    if _ROUGE_SCORER is None:
        from rouge_score import rouge_scorer

        _ROUGE_SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [
        getattr(_ROUGE_SCORER.score(ref, pred)["rougeL"], measure)
        for pred, ref in zip(predictions, references, strict=True)
    ]


def rouge_l_recall(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L recall of each prediction against its reference (TOFU's "ROUGE"), with Porter stemming."""
    return _rouge_l(predictions, references, "recall")


def rouge_l_f1(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F1 of each prediction against its reference (MUSE's VerbMem and KnowMem), with Porter stemming."""
    return _rouge_l(predictions, references, "fmeasure")


_TRAILING_PUNCTUATION = string.punctuation


def _normalize(text: str) -> str:
    return " ".join(text.split()).lower().rstrip(_TRAILING_PUNCTUATION).rstrip()


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """1.0 where prediction and reference are equal after collapsing whitespace, lower-casing and stripping
    trailing punctuation, else 0.0."""
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions but {len(references)} references.")
    return [float(_normalize(p) == _normalize(r)) for p, r in zip(predictions, references, strict=True)]


def default_max_new_tokens(
    tokenizer: Any, answers: Iterable[str], margin: int = 4, prompt_template: str | None = None
) -> int:
    """Tokens enough to generate the longest answer (EOS included) plus ``margin``."""
    longest = max(
        (
            sum(
                label != IGNORE_INDEX
                for label in tokenize_qa(tokenizer, "", a, prompt_template=prompt_template)["labels"]
            )
            for a in answers
        ),
        default=0,
    )
    return longest + margin


def evaluate_qa(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    max_new_tokens: int | None = None,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
    return_predictions: bool = False,
    scores: Sequence[Any] | None = None,
    generation_batch_size: int = GENERATION_BATCH_SIZE,
) -> dict[str, Any]:
    """Mean ROUGE-L recall, answer probability and exact match over the records with ``question`` and ``answer``.

    ``dataset_or_records`` is a :class:`datasets.Dataset` or a sequence of mappings. ``max_new_tokens`` defaults
    to the longest tokenized answer plus a few tokens. Returns ``{"rouge_l_recall", "probability",
    "exact_match", "num_examples"}`` (the means are NaN when there is no example), and with ``return_predictions``
    the greedy answers under ``"predictions"`` (so a fluency measure can read them instead of generating again).
    ``scores``: the records' :func:`hf_unlearn.evaluation.passes.score_qa_records`, read instead of scoring the
    answers again. ``batch_size`` is for scoring, ``generation_batch_size`` for generating.
    """
    records = qa_records(dataset_or_records)
    questions = [str(r["question"]) for r in records]
    answers = [str(r["answer"]) for r in records]
    if not records:
        nan = float("nan")
        empty: dict[str, Any] = {"rouge_l_recall": nan, "probability": nan, "exact_match": nan, "num_examples": 0}
        return {**empty, "predictions": []} if return_predictions else empty
    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(tokenizer, answers, prompt_template=prompt_template)
    predictions = generate_answers(
        model, tokenizer, questions, max_new_tokens, generation_batch_size, show_progress, prompt_template
    )
    if scores is not None:
        probabilities = [s.probability for s in scores]
    else:
        probabilities = answer_probability(
            model, tokenizer, questions, answers, batch_size, show_progress, prompt_template
        )

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    measured: dict[str, Any] = {
        "rouge_l_recall": mean(rouge_l_recall(predictions, answers)),
        "probability": mean(probabilities),
        "exact_match": mean(exact_match(predictions, answers)),
        "num_examples": len(records),
    }
    if return_predictions:
        measured["predictions"] = predictions
    return measured


def forget_truth_ratio(ratios: Sequence[float]) -> float:
    """TOFU's forget-set aggregation ``mean(min(TR, 1/TR))``: 1 when paraphrase and perturbations look alike."""
    return sum(min(r, 1.0 / r) for r in ratios) / len(ratios) if ratios else float("nan")


def retain_truth_ratio(ratios: Sequence[float]) -> float:
    """TOFU's retain-set aggregation ``mean(max(0, 1 - TR))``: high when the true paraphrase is preferred."""
    return sum(max(0.0, 1.0 - r) for r in ratios) / len(ratios) if ratios else float("nan")


def forget_quality(truth_ratios_evaluated: Sequence[float], truth_ratios_retain_only: Sequence[float]) -> float:
    """p-value of the two-sample KS test between forget-set truth ratios (TOFU §2.5): high = indistinguishable
    from a model that never saw the forget set."""
    return float(ks_2samp(list(truth_ratios_evaluated), list(truth_ratios_retain_only)).pvalue)


def model_utility(values: Sequence[float]) -> float:
    """Harmonic mean (TOFU §2.5); 0 as soon as one value is 0, as a harmonic mean should be."""
    values = [float(v) for v in values]
    if not values:
        return float("nan")
    if min(values) <= 0:
        return 0.0
    return float(hmean(values))


def reproduction_bound(
    model: Any,
    tokenizer: Any,
    records: Any,
    k: int = 10,
    rho: float = 0.5,
    batch_size: int = 32,
    prompt_template: str | None = None,
) -> dict[str, float]:
    """MASC Proposition 1 at beta = 1 on ``records``: mean and max of ``rho^((1 - v_i) L_i)``, and the violation
    rate, with self-competitors (k) and threshold tau = log(rho / (1 - rho))."""
    examples = [
        tokenize_qa(tokenizer, r["question"], r["answer"], prompt_template=prompt_template)
        for r in qa_records(records)
    ]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    measured = measure_violations(model, examples, pad_id, k, threshold_from_probability(rho), batch_size=batch_size)
    bounds = exact_reproduction_bound(measured["fractions"], measured["lengths"], rho)
    return {
        "mean": bounds.mean().item(),
        "max": bounds.max().item(),
        "violation_rate": measured["fractions"].mean().item(),
    }
