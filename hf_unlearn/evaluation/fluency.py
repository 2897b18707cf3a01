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
* **The worst token under the never-trained model** (damage a mean lets through): a garbled name in an otherwise
  fluent sentence ("AUREHLILO BeltRORNO was born in Mexico City") raises the mean NLL a little and its worst token
  a lot. Each answer's highest token NLL (``worst_token_nll``) is compared with the 95th percentile of the same
  value over fluent answers the never-trained model did not write (the target's): ``damaged_share`` is the share of
  answers beyond it (:func:`fluency_levels`, :func:`fluency_misses`).
* **Run-on answers**: ``long_share``, the share of answers longer (in words) than the 95th percentile of the
  never-trained model's own answers, so an answer that runs on to the generation budget is caught even when it
  repeats no 3-gram.

Answers shorter than three words are judged too: their repetition is read on words (``"190 190"`` repeats).
A NaN value (nothing could be measured) is a miss, never a pass.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..data.examples import tokenize_qa
from ..scores import token_log_probs
from .metrics import default_max_new_tokens
from .passes import generate_answers, pad_token_id_of, qa_records, score_teacher_forced

#: An answer whose distinct-3 ratio is below this is counted as degenerate (repetitive).
DEGENERATE_DISTINCT_3 = 0.75


#: The share of fluent answers' worst tokens (and of the never-trained model's answer lengths) a sound answer may
#: exceed: the level of :func:`fluency_levels` is their 95th percentile.
LEVEL_QUANTILE = 0.95
#: How much more often than the never-trained model an answer may be repetitive, empty, damaged or run-on.
SHARE_SLACK = 0.1


def distinct_3(text: str) -> float | None:
    """Distinct word 3-grams / word 3-grams of ``text``; for answers of one or two words, distinct words / words (so
    ``"190 190"`` reads 1/2); ``None`` for an empty answer."""
    words = text.split()
    if not words:
        return None
    if len(words) < 3:
        return len(set(words)) / len(words)
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) / len(grams)


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


def _mean_and_worst_nll(logits: Any, labels: Any) -> list[tuple[float, float]]:
    """Per row: the mean and the highest NLL of its answer tokens (NaN, NaN for a row without any)."""
    log_probs, mask = token_log_probs(logits, labels)
    counts = mask.sum(dim=-1)
    means = -(log_probs.sum(dim=-1) / counts.clamp(min=1))
    worst = -log_probs.masked_fill(~mask, float("inf")).min(dim=-1).values
    return [
        (float(m), float(w)) if int(c) else (float("nan"), float("nan"))
        for m, w, c in zip(means.tolist(), worst.tolist(), counts.tolist(), strict=True)
    ]


def answer_nlls(
    reference_model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    prompt_template: str | None = None,
    batch_size: int = 32,
) -> list[tuple[float, float] | None]:
    """Per answer, its ``(mean token NLL, worst token NLL)`` given its question under ``reference_model`` (the answer
    tokens as :func:`hf_unlearn.data.tokenize_qa` marks them, the end of turn included: an answer cut off at the
    generation budget is scored on an end it never reached); ``None`` for an empty answer."""
    if len(questions) != len(answers):
        raise ValueError(f"Got {len(questions)} questions but {len(answers)} answers.")
    kept = [i for i, answer in enumerate(answers) if answer.strip()]
    examples = [tokenize_qa(tokenizer, questions[i], answers[i], prompt_template=prompt_template) for i in kept]
    scored = score_teacher_forced(
        reference_model, examples, pad_token_id_of(tokenizer), _mean_and_worst_nll, batch_size
    )
    values: list[tuple[float, float] | None] = [None] * len(answers)
    for index, value in zip(kept, scored, strict=True):
        values[index] = value
    return values


def reference_nll(
    reference_model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    prompt_template: str | None = None,
    batch_size: int = 32,
) -> float:
    """Mean over the non-empty ``answers`` of their mean token NLL given the question under ``reference_model``."""
    return _mean_nll(answer_nlls(reference_model, tokenizer, questions, answers, prompt_template, batch_size))


def _mean_nll(scored: Sequence[tuple[float, float] | None]) -> float:
    """The mean over answers of :func:`answer_nlls`' mean token NLL (empty answers, and NaN ones, left out)."""
    values = [v[0] for v in scored if v is not None and not math.isnan(v[0])]
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
    measured["answer_words"] = [len(answer.split()) for answer in answers]
    if reference_model is not None:
        scored = answer_nlls(reference_model, tokenizer, questions, answers, prompt_template)
        measured["reference_nll"] = _mean_nll(scored)
        measured["worst_token_nll"] = [None if v is None else v[1] for v in scored]
    measured["examples"] = answers[:3]
    return measured


def _quantile(values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (linear interpolation, as numpy's default), ``None`` when there are none."""
    ordered = sorted(v for v in values if v is not None and not math.isnan(v))
    if not ordered:
        return None
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def fluency_levels(fluent: Mapping[str, Any] | None, never_trained: Mapping[str, Any]) -> dict[str, float | None]:
    """The levels :func:`fluency_misses` reads the worst-token and the length measures against: the 95th percentile
    of the worst token NLL over ``fluent`` answers the never-trained model did not write (the target's, before
    unlearning; the never-trained model's own where not given), and of the answer lengths in words (the higher of
    the two models' 95th percentiles: an answer as long as the learned one is not running on)."""
    source = fluent if fluent and fluent.get("worst_token_nll") else never_trained
    lengths = [
        level
        for level in (
            _quantile(answers.get("answer_words") or [], LEVEL_QUANTILE) for answers in (fluent or {}, never_trained)
        )
        if level is not None
    ]
    return {
        "worst_token_nll": _quantile(source.get("worst_token_nll") or [], LEVEL_QUANTILE),
        "answer_words": max(lengths) if lengths else None,
    }


def share_beyond(values: Sequence[float | None] | None, level: float | None) -> float:
    """The share of ``values`` above ``level`` (``None`` values, empty answers, count as within); NaN without any
    value or level."""
    if not values or level is None:
        return float("nan")
    return sum(v is not None and v > level for v in values) / len(values)


def fluency_misses(
    measured: Mapping[str, Any],
    never_trained: Mapping[str, Any],
    nll_tolerance: float = 0.5,
    fluent_nll: float | None = None,
    levels: Mapping[str, float | None] | None = None,
) -> dict[str, float]:
    """What makes ``measured`` answers read unlike the never-trained model's, each with how far past its edge: the
    repetitive, empty, damaged (``levels['worst_token_nll']``) and run-on (``levels['answer_words']``) shares above
    the never-trained model's + :data:`SHARE_SLACK`, and the mean NLL under it more than ``nll_tolerance`` above
    ``fluent_nll`` (the level of fluent answers it did not write, e.g. the target's; its own answers' where not
    given). A measured NaN where the never-trained model has a value is a miss (``inf``): nothing says it passed."""
    levels = levels or {}
    level_nll = never_trained.get("reference_nll") if fluent_nll is None else fluent_nll
    values = {
        "repetitive_share": (measured.get("repetitive_share"), never_trained.get("repetitive_share"), SHARE_SLACK),
        "empty_share": (measured.get("empty_share"), never_trained.get("empty_share"), SHARE_SLACK),
        "reference_nll": (measured.get("reference_nll"), level_nll, nll_tolerance),
    }
    for name, key in (("damaged_share", "worst_token_nll"), ("long_share", "answer_words")):
        if levels.get(key) is not None and measured.get(key) is not None and never_trained.get(key) is not None:
            values[name] = (
                share_beyond(measured[key], levels[key]), share_beyond(never_trained[key], levels[key]), SHARE_SLACK
            )  # fmt: skip
    misses: dict[str, float] = {}
    for name, (value, level, slack) in values.items():
        if value is None or level is None or math.isnan(level):
            continue  # not measured on one side: nothing to judge
        if math.isnan(value):
            misses[name] = float("inf")
        elif value > level + slack:
            misses[name] = value - (level + slack)
    return misses


def fluent_like(
    measured: Mapping[str, Any],
    never_trained: Mapping[str, Any],
    nll_tolerance: float = 0.5,
    fluent_nll: float | None = None,
    levels: Mapping[str, float | None] | None = None,
) -> bool:
    """True when answers are no more repetitive, empty, damaged or run-on than the never-trained model's (+ 0.1) and
    their likelihood under it is within ``nll_tolerance`` nats per token of ``fluent_nll``: the level of fluent
    answers the never-trained model did not write itself, e.g. the target model's answers before unlearning. Its own
    greedy answers are no such level (measured on TOFU with SmolLM2: 0.19 nats/token for its own answers, 2.87 for
    the target's fluent ones); they are the fallback when ``fluent_nll`` is not given. :func:`fluency_misses` says
    what failed."""
    return not fluency_misses(measured, never_trained, nll_tolerance, fluent_nll, levels)


__all__ = [
    "DEGENERATE_DISTINCT_3",
    "LEVEL_QUANTILE",
    "SHARE_SLACK",
    "answer_fluency",
    "answer_nlls",
    "distinct_3",
    "fluency_levels",
    "fluency_misses",
    "fluent_like",
    "reference_nll",
    "repetition",
    "share_beyond",
]
