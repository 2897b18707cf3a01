"""Everything the trainer refuses in its data before a weight changes, and what it warns about.

Errors name the set, the problem and the first rows concerned: an empty set, examples without answer tokens or longer
than the model's context, a retain set missing for a retain term, forget examples that are also retain or calibration
examples, missing alternative answers (AltPO). :class:`~hf_unlearn.UnlearnTrainer` and
:func:`~hf_unlearn.jobs.sequence.unlearn_sequentially` (for every request, before the first trains) run
:func:`check_unlearning_data`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import nn
from transformers.utils import logging

from .examples import IGNORE_INDEX
from .pairing import ContinuationScoring, refusal_example

logger = logging.get_logger(__name__)


def check_examples(dataset: Sequence[Mapping[str, Any]], name: str) -> None:
    """Fail before any step on an empty set or examples without answer tokens."""
    if dataset is None or len(dataset) == 0:
        raise ValueError(f"The {name} set is empty: there is nothing to {'forget' if name == 'forget' else 'keep'}.")
    first = dataset[0]
    missing = [key for key in ("input_ids", "labels") if key not in first]
    if missing:
        raise ValueError(
            f"The {name} examples lack {missing}. Tokenize them first, e.g. with "
            "hf_unlearn.build_qa_dataset(dataset, tokenizer), which masks the prompt with -100."
        )
    empty = [i for i in range(len(dataset)) if all(label == IGNORE_INDEX for label in dataset[i]["labels"])]
    if len(empty) == len(dataset):
        raise ValueError(
            f"Every label of the {name} set is -100: no example has answer tokens to "
            f"{'forget' if name == 'forget' else 'keep'}. Check the prompt masking."
        )
    if empty:
        raise ValueError(
            f"{len(empty)} {name} example(s) have no answer tokens (all labels -100), e.g. indices {empty[:5]}. "
            "Drop them or fix the prompt masking."
        )


def check_unlearning_data(
    model: nn.Module,
    forget: Sequence[Mapping[str, Any]],
    retain: Sequence[Mapping[str, Any]] | None,
    calibration: Sequence[Mapping[str, Any]] | None = None,
    *,
    method: str,
    retain_objective: str,
    alternate_column: str | None = None,
    forget_objective: str = "",
    forget_name: str = "forget",
    retain_hint: str = "retain_dataset=...",
) -> None:
    """Refuse, before a weight changes, what cannot be unlearned: empty sets, examples without answer tokens or longer
    than the model's context, a retain set missing for the retain term ``retain_objective`` (``"none"``: not
    needed), forget examples that are also retain or calibration examples, and, with ``alternate_column`` (AltPO), a
    forget example without an alternative answer there. ``retain_hint`` says how to pass a retain set where the caller
    is not the trainer (e.g. a CLI flag)."""
    check_examples(forget, forget_name)
    if retain_objective != "none":
        if retain is None:
            raise ValueError(
                f"Method {method!r} has the retain term {retain_objective!r} and needs a retain_dataset. "
                f"Pass {retain_hint}, or retain_loss='none' to unlearn without one."
            )
        check_examples(retain, "retain")
    check_context_length(model, forget, forget_name)
    if retain is not None:
        check_context_length(model, retain, "retain")
        check_overlap(forget, retain, "retain")
    if calibration is not None:
        check_overlap(forget, calibration, "calibration")
        check_examples(calibration, "calibration")
        check_context_length(model, calibration, "calibration")
    if alternate_column is not None:
        alternate_answers(forget, alternate_column, forget_objective)


def warn_if_nothing_is_cut(dataset: Sequence[Mapping[str, Any]], args: Any) -> None:
    """forget_scoring='continuation' on examples too short to split scores them whole: say so rather than let a
    user believe the prefix is context (typical of short QA answers under the reference's 32 + 32 tokens)."""
    cut = ContinuationScoring.from_config(args)
    needed = cut.min_prefix_tokens + cut.min_suffix_tokens
    long_enough = sum(
        1 for i in range(len(dataset)) if sum(label != IGNORE_INDEX for label in dataset[i]["labels"][1:]) >= needed
    )
    if long_enough < len(dataset):
        logger.warning(
            f"forget_scoring='continuation': {len(dataset) - long_enough} of {len(dataset)} forget examples have "
            f"fewer than {needed} scored tokens (forget_scoring_kwargs' min_prefix_tokens + min_suffix_tokens), "
            "so they are scored whole, as with forget_scoring='answer'. Lower the two minimums for short texts."
        )


def alternate_answers(examples: Sequence[Mapping[str, Any]], column: str, objective: str) -> list[str]:
    """Example i's alternative answer from ``column``: the text, or the (i mod n)-th of a list (AltPO)."""
    answers = []
    for i, example in enumerate(examples):
        value = example.get(column)
        if isinstance(value, list | tuple):
            value = value[i % len(value)] if value else None
        if not isinstance(value, str) or not value.strip():
            raise ValueError(
                f"{objective!r} needs a plausible alternative answer for every forget example in column {column!r} "
                f"(forget_loss_kwargs['alternate_column']); forget example {i} has {value!r}. Add the column (e.g. "
                "TOFU's perturbed_answer) or name another with forget_loss_kwargs={'alternate_column': ...}."
            )
        answers.append(value)
    return answers


def alternative_answer_examples(
    forget: Sequence[Mapping[str, Any]], objective: Any, hyperparameters: Mapping[str, Any], tokenizer: Any
) -> list[dict[str, list[int]]] | None:
    """Each forget example's prompt followed by the answer the objective prefers instead: a refusal (IdkDPO, from
    its declared ``refusal_answers`` in turn) or the example's alternative answer (AltPO, from the column its
    ``alternate_column`` names); ``hyperparameters``: the objective's resolved values. ``None`` for objectives that
    need neither."""
    if not (objective.needs_refusal or objective.needs_alternate):
        return None
    what = "refusal" if objective.needs_refusal else "alternate"
    if tokenizer is None:
        raise ValueError(
            f"{objective.name!r} writes {what} answers and needs the tokenizer: pass processing_class=tokenizer."
        )
    refusals = hyperparameters.get("refusal_answers")
    answers = (
        [refusals[i % len(refusals)] for i in range(len(forget))]
        if what == "refusal"
        else alternate_answers(forget, hyperparameters["alternate_column"], objective.name)
    )
    return [refusal_example(tokenizer, example, answer) for example, answer in zip(forget, answers, strict=True)]


def check_overlap(forget: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]], name: str) -> None:
    """A forget example that is also in the retain (or calibration) set is trained both ways; all of them is a
    mistake, some of them worth a warning."""
    other_examples = {tuple(other[i]["input_ids"]) for i in range(len(other))}
    shared = [i for i in range(len(forget)) if tuple(forget[i]["input_ids"]) in other_examples]
    if shared and len(shared) == len(forget):
        raise ValueError(
            f"Every forget example is also in the {name} set, so the run would forget and "
            f"{'keep' if name == 'retain' else 'calibrate on'} the same text. Pass the {name} data you meant."
        )
    if shared:
        logger.warning(
            f"{len(shared)} of {len(forget)} forget examples are also in the {name} set (forget indices "
            f"{shared[:5]}); they are pushed away and {'kept' if name == 'retain' else 'used as never-seen data'} "
            f"at once. Remove them from the {name} set unless that is intended."
        )


def check_context_length(model: nn.Module, dataset: Sequence[Mapping[str, Any]], name: str) -> None:
    """Positions past the model's context would fail mid-run (or silently wrap); refuse them up front."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not limit:
        return
    lengths = [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
    too_long = [i for i, n in enumerate(lengths) if n > limit]
    if too_long:
        raise ValueError(
            f"{len(too_long)} {name} example(s) are longer than the model's context of {limit} tokens (longest: "
            f"{max(lengths)} tokens, e.g. index {too_long[0]}). Truncate or drop them, e.g. "
            "build_qa_dataset(..., max_length=...)."
        )
