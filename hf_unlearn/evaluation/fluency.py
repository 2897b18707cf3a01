"""Do the forget answers look like a model that never saw the data, or like damage?

An unlearned model that babbles on exactly the forgotten topics ("190 190 190 ...") tells everyone what was removed;
a model that never learned them answers fluently with a wrong fact. ROUGE-L cannot tell the two apart (both score
low), so the forget answers are also measured for fluency, two ways:

* **Repetition** (the degenerate kind of damage): the share of answers whose word 3-grams repeat, i.e. whose
  distinct-3 ratio (distinct 3-grams / 3-grams, Li et al. 2016, "A Diversity-Promoting Objective Function for
  Neural Conversation Models", §4.3, used here per answer) is below ``DEGENERATE_DISTINCT_3``, plus the share of
  empty answers. A fluent sentence repeats no 3-gram; "190 190 190 190" has distinct-3 = 1/2.
* **Likelihood under the never-trained model** (the garbled kind): the mean token negative log-likelihood of each
  generated answer, given its question, under the retain-only model (the model that never saw the forget data;
  MUSE's and TOFU's reference). Fluent answers it did not write itself (the target model's, before unlearning)
  set the level a fluent answer reaches; its own greedy answers score far lower under it (0.19 against 2.87
  nats/token on TOFU with SmolLM2), and garbled sentences ("born to father and so on ...") far higher.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .metrics import answer_log_probs, default_max_new_tokens, generate_answers, qa_records

#: An answer whose distinct-3 ratio is below this is counted as degenerate (repetitive).
DEGENERATE_DISTINCT_3 = 0.75


def distinct_3(text: str) -> float | None:
    """Distinct word 3-grams / word 3-grams of ``text``; ``None`` for answers shorter than three words."""
    words = text.split()
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) / len(grams) if grams else None


def repetition(texts: Sequence[str], threshold: float = DEGENERATE_DISTINCT_3) -> dict[str, float]:
    """Share of ``texts`` that are empty, and of the non-empty ones whose distinct-3 ratio is below ``threshold``."""
    if not texts:
        return {"empty_share": float("nan"), "repetitive_share": float("nan"), "distinct_3": float("nan")}
    non_empty = [t for t in texts if t.strip()]
    ratios = [r for r in (distinct_3(t) for t in non_empty) if r is not None]
    return {
        "empty_share": 1 - len(non_empty) / len(texts),
        "repetitive_share": sum(r < threshold for r in ratios) / len(non_empty) if non_empty else float("nan"),
        "distinct_3": sum(ratios) / len(ratios) if ratios else float("nan"),
    }


def reference_nll(
    reference_model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    prompt_template: str | None = None,
    batch_size: int = 32,
) -> float:
    """Mean over the non-empty ``answers`` of their mean token NLL given the question under ``reference_model``."""
    pairs = [(q, a) for q, a in zip(questions, answers, strict=True) if a.strip()]
    if not pairs:
        return float("nan")
    scored = answer_log_probs(
        reference_model, tokenizer, [q for q, _ in pairs], [a for _, a in pairs], batch_size,
        prompt_template=prompt_template,
    )  # fmt: skip
    values = [-total / count for total, count in scored if count > 0]
    return sum(values) / len(values) if values else float("nan")


def answer_fluency(
    model: Any,
    tokenizer: Any,
    records: Any,
    reference_model: Any | None = None,
    max_new_tokens: int | None = None,
    prompt_template: str | None = None,
    batch_size: int = 32,
    answers: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Greedy answers of ``model`` to the questions of ``records``, measured for fluency (module docstring):
    ``empty_share``, ``repetitive_share``, ``distinct_3`` and, with ``reference_model`` (same tokenizer),
    ``reference_nll``. ``examples`` holds the first three answers, for a reader to see. ``answers``: the greedy
    answers already generated (``evaluate_qa(..., return_predictions=True)``), one per record, instead of
    generating them again."""
    rows = qa_records(records)
    questions = [str(r["question"]) for r in rows]
    if answers is not None:
        if len(answers) != len(questions):
            raise ValueError(f"answer_fluency got {len(answers)} answers for {len(questions)} questions.")
        answers = list(answers)
    else:
        if max_new_tokens is None:
            max_new_tokens = default_max_new_tokens(
                tokenizer, [str(r["answer"]) for r in rows], prompt_template=prompt_template
            )
        answers = generate_answers(
            model, tokenizer, questions, max_new_tokens, batch_size, prompt_template=prompt_template
        )
    measured: dict[str, Any] = repetition(answers)
    if reference_model is not None:
        measured["reference_nll"] = reference_nll(reference_model, tokenizer, questions, answers, prompt_template)
    measured["examples"] = answers[:3]
    return measured


def fluent_like(
    measured: Mapping[str, Any],
    never_trained: Mapping[str, Any],
    nll_tolerance: float = 0.5,
    fluent_nll: float | None = None,
) -> bool:
    """True when answers are no more repetitive or empty than the never-trained model's (+ 0.1) and their likelihood
    under it is within ``nll_tolerance`` nats per token of ``fluent_nll``: the level of fluent answers the
    never-trained model did not write itself, e.g. the target model's answers before unlearning. Its own greedy
    answers are no such level (measured on TOFU with SmolLM2: 0.19 nats/token for its own answers, 2.87 for the
    target's fluent ones); they are the fallback when ``fluent_nll`` is not given."""
    level_nll = never_trained.get("reference_nll") if fluent_nll is None else fluent_nll

    def worse(value: Any, level: Any, slack: float) -> bool:
        if value is None or level is None or math.isnan(value) or math.isnan(level):
            return False
        return value > level + slack

    return not (
        worse(measured.get("repetitive_share"), never_trained.get("repetitive_share"), 0.1)
        or worse(measured.get("empty_share"), never_trained.get("empty_share"), 0.1)
        or worse(measured.get("reference_nll"), level_nll, nll_tolerance)
    )


__all__ = ["DEGENERATE_DISTINCT_3", "answer_fluency", "distinct_3", "fluent_like", "reference_nll", "repetition"]
