"""Two token-level memorisation metrics of an answer, as open-unlearning defines them (locuslab/open-unlearning,
``src/evals/metrics/memorization.py``): exact memorisation and extraction strength.

Both look at the model's teacher-forced greedy predictions over the answer: at every answer position, the argmax of
the logits that predict it, given the prompt and the true answer so far. Following open-unlearning, the last labelled
position is dropped (in this library's tokenization, :func:`hf_unlearn.data.tokenize_qa`, the EOS token that ends
every answer), leaving ``L`` predictions ``p`` of the labels ``y``:

* **Exact memorisation** (EM; Tirumala et al. 2022, "Memorization Without Overfitting: Analyzing the Training
  Dynamics of Large Language Models", arXiv 2205.10770, §2): the share of positions where ``p_t == y_t``.
* **Extraction strength** (ES; after Carlini et al. 2021, "Extracting Training Data from Large Language Models",
  arXiv 2012.07805, whose extraction is prefix-based; ES is open-unlearning's measure of how little of the answer
  must be given for the rest to come out): ``1 - k / L`` for the smallest ``k`` such that ``p[k:] == y[k:]``, i.e.
  the model reproduces the answer's suffix from position ``k`` on. 1 when every prediction is right.

**A quirk kept on purpose.** open-unlearning searches ``k`` in ``0 .. L - 1`` and, when no suffix matches (the
last prediction is wrong), leaves ``k = L - 1``: such an answer scores ``1 / L``, the same as one whose last token
alone is right, not 0. This module follows it, so that its numbers are comparable with open-unlearning's published
ones; an answer's ES is therefore never below ``1 / L``.

An answer with no position left after the EOS is dropped (an empty answer) gets neither score and is left out of
the means (open-unlearning gives it EM ``None`` and ES 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ..data.examples import IGNORE_INDEX, tokenize_qa
from ..scores import shift_for_causal_lm
from .passes import pad_token_id_of, qa_records, score_teacher_forced

__all__ = [
    "evaluate_memorization",
    "exact_memorization",
    "extraction_strength",
    "memorization_scores",
    "teacher_forced_predictions",
]


def check_lengths(predictions: Sequence[int], labels: Sequence[int]) -> None:
    if len(predictions) != len(labels) or not labels:
        raise ValueError(f"Need as many predictions as labels, at least one; got {len(predictions)}, {len(labels)}.")


def exact_memorization(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """Share of positions where the teacher-forced prediction is the label (Tirumala et al. 2022, §2)."""
    check_lengths(predictions, labels)
    return sum(p == y for p, y in zip(predictions, labels, strict=True)) / len(labels)


def extraction_strength(predictions: Sequence[int], labels: Sequence[int]) -> float:
    """``1 - k / L`` for the smallest ``k`` with ``predictions[k:] == labels[k:]``, searched in ``0 .. L - 1`` as
    open-unlearning does (no matching suffix: ``k = L - 1``, so ``1 / L``; see the module docstring)."""
    check_lengths(predictions, labels)
    length = len(labels)
    # The matching suffix starts right after the last wrong prediction; capped at L - 1 (open-unlearning's loop end).
    wrong = [t for t in range(length) if predictions[t] != labels[t]]
    k = min(wrong[-1] + 1, length - 1) if wrong else 0
    return 1.0 - k / length


def teacher_forced_predictions(
    model: Any,
    examples: Sequence[dict[str, Any]],
    pad_token_id: int,
    batch_size: int = 32,
    show_progress: bool = False,
) -> list[tuple[list[int], list[int]]]:
    """Per tokenized example ``(predictions, labels)`` over its answer: the argmax of the logits at every labelled
    position but the last (EOS), teacher-forced in batches (:func:`~hf_unlearn.evaluation.passes.
    score_teacher_forced`)."""

    def argmaxes(logits: torch.Tensor, labels: torch.Tensor) -> list[tuple[list[int], list[int]]]:
        logits, labels = shift_for_causal_lm(logits, labels)
        predictions = logits.argmax(dim=-1)
        pairs = []
        for row_predictions, row_labels in zip(predictions, labels, strict=True):
            positions = (row_labels != IGNORE_INDEX).nonzero(as_tuple=True)[0][:-1]  # the EOS is not scored
            pairs.append((row_predictions[positions].tolist(), row_labels[positions].tolist()))
        return pairs

    return score_teacher_forced(
        model, examples, pad_token_id, argmaxes, batch_size, show_progress, desc="Scoring memorisation"
    )


def memorization_scores(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[dict[str, float] | None]:
    """Per question/answer pair ``{"exact_memorization", "extraction_strength"}`` (``None`` for an answer with no
    token besides EOS), tokenized as for learning (:func:`hf_unlearn.data.tokenize_qa`)."""
    if len(questions) != len(answers):
        raise ValueError(f"Got {len(questions)} questions but {len(answers)} answers.")
    examples = [
        tokenize_qa(tokenizer, q, a, prompt_template=prompt_template) for q, a in zip(questions, answers, strict=True)
    ]
    pairs = teacher_forced_predictions(model, examples, pad_token_id_of(tokenizer), batch_size, show_progress)
    return [
        {
            "exact_memorization": exact_memorization(predictions, labels),
            "extraction_strength": extraction_strength(predictions, labels),
        }
        if labels
        else None
        for predictions, labels in pairs
    ]


def evaluate_memorization(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> dict[str, float]:
    """Mean exact memorisation and extraction strength over the records with ``question`` and ``answer`` (NaN when
    none can be scored)."""
    records = qa_records(dataset_or_records)
    scores = memorization_scores(
        model,
        tokenizer,
        [str(r["question"]) for r in records],
        [str(r["answer"]) for r in records],
        batch_size,
        show_progress,
        prompt_template,
    )
    scored = [s for s in scores if s is not None]
    return {
        name: sum(s[name] for s in scored) / len(scored) if scored else float("nan")
        for name in ("exact_memorization", "extraction_strength")
    }
