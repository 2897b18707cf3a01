"""The region of `hf-unlearn compare`: where a model that never saw the forget set lies, and what a run misses of it.

Read by compare's race, its report and the studies; a pure function of the measurements of the target, of the
never-trained model and of a run (:meth:`hf_unlearn.jobs.compare.CompareSetting.measure`).
"""

from __future__ import annotations

import math
from typing import Any

from ..evaluation.fluency import fluency_levels, fluency_misses
from ..evaluation.membership import TOO_FEW, judge_difference, paired_off_interval

#: The real-knowledge values that each get their own floor (TOFU's real-authors and world-facts sets).
REAL_KNOWLEDGE_VALUES = ("rouge_l_recall", "probability", "truth_ratio")


def membership_aucs(forget: dict) -> dict[str, float]:
    """Every attack's AUC of a measurement's forget side (``membership_aucs``; a measurement taken before every
    attack was read holds Min-K%'s alone, ``membership_auc``)."""
    return dict(forget.get("membership_aucs") or {"min_k": forget["membership_auc"]})


def real_knowledge_values(measured: dict) -> dict[str, float]:
    """``{"real_authors.rouge_l_recall": value, ...}``: each of TOFU's six real-knowledge values of a measurement."""
    return {
        f"{name}.{metric}": values[metric]
        for name, values in measured.items()
        if isinstance(values, dict)
        for metric in REAL_KNOWLEDGE_VALUES
        if metric in values
    }


def build_region(before: dict, never_trained: dict, cli: Any) -> dict:
    """The region a run must end in, from the target's (``before``) and the never-trained model's measurements.

    The forget side is the never-trained model's: forget ROUGE-L, every membership attack's AUC (each within
    ``membership_tolerance`` of the never-trained model's, issue 54), and fluency (repetitive, empty, damaged and
    run-on answers, :func:`~hf_unlearn.evaluation.fluency.fluency_misses`, against levels from the target's fluent
    answers and the never-trained model's own). The kept side is what both models keep: retain ROUGE-L and, on TOFU,
    each of the six real-knowledge values (ROUGE-L, probability, truth ratio on real authors and world facts) and
    their mean at least ``retain_ratio`` x the lower of the two models' (so the never-trained model lies in its own
    region). Their harmonic mean, TOFU's model utility, is reported beside it but sinks to nothing when one value is
    near zero, as a small model's real-author ROUGE-L is; a value that falls to zero fails its own floor. ``cli``:
    the compare arguments (``forget_rouge_tolerance``, ``membership_tolerance``, ``retain_ratio``)."""
    references = membership_aucs(never_trained["forget"])
    region = {
        "forget_rouge_l_recall_max": never_trained["forget"]["rouge_l_recall"] + cli.forget_rouge_tolerance,
        "membership_auc_reference": references["min_k"],
        "membership_auc_references": references,
        "membership_tolerance": cli.membership_tolerance,
        "retain_rouge_l_recall_min": cli.retain_ratio
        * min(before["retain"]["rouge_l_recall"], never_trained["retain"]["rouge_l_recall"]),
        "retain_ratio": cli.retain_ratio,
        "before": before,
        "never_trained": never_trained,
    }
    if "real_knowledge" in before:
        kept = min(before["real_knowledge"]["mean"], never_trained["real_knowledge"]["mean"])
        region["real_knowledge_mean_min"] = cli.retain_ratio * kept
        target, never = (
            real_knowledge_values(before["real_knowledge"]),
            real_knowledge_values(never_trained["real_knowledge"]),
        )
        region["real_knowledge_min"] = {
            key: cli.retain_ratio * min(target[key], never[key]) for key in target if key in never
        }
    if "fluency" in never_trained["forget"]:
        # fluent answers the never-trained model did not write: the target's, before unlearning
        fluent = before["forget"].get("fluency", {})
        region["fluent_nll"] = fluent.get("reference_nll")
        region["fluency_levels"] = fluency_levels(fluent, never_trained["forget"]["fluency"])
    return region


def _below(value: float | None, floor: float) -> float | None:
    """How far ``value`` is under ``floor`` (negative), ``-inf`` for a NaN or missing value and for nothing kept (a
    value of 0 under a floor of 0: both models lost it, so a run at 0 keeps nothing), None when it is not."""
    if value is None or math.isnan(value) or math.isnan(floor):
        return float("-inf")
    if floor <= 0 and value <= 0:
        return float("-inf")
    return value - floor if value < floor else None


def _membership_misses(forget: dict, region: dict) -> dict[str, float]:
    """Each attack the region cannot count as landed: its AUC further than the tolerance from the never-trained
    model's (+: less familiar than never-seen data, -: still a member; NaN where either AUC is NaN or missing), or,
    where both models' scores are at hand, its paired interval wider than ±tolerance and not wholly past it
    (``<key>_interval``: the half-width; too few answers to judge)."""
    references = region.get("membership_auc_references") or {"min_k": region["membership_auc_reference"]}
    never_forget = (region.get("never_trained") or {}).get("forget") or {}
    measured = membership_aucs(forget)
    tolerance = region["membership_tolerance"]
    misses: dict[str, float] = {}
    for attack, reference in references.items():
        key = "membership_auc" if attack == "min_k" else f"membership_auc_{attack}"
        value = measured.get(attack)
        if value is None or reference is None or math.isnan(value) or math.isnan(reference):
            misses[key] = float("nan")  # not measured: nothing says the attack cannot tell the sets apart
            continue
        interval = paired_off_interval(forget.get("membership_scores"), never_forget.get("membership_scores"), attack)
        if judge_difference(value - reference, interval, tolerance) == TOO_FEW:
            misses[f"{key}_interval"] = (interval[1] - interval[0]) / 2
            continue
        off = abs(value - reference) - tolerance
        if off > 0:
            misses[key] = off if value > reference else -off
    return misses


def region_misses(row: dict, region: dict) -> dict[str, float | bool]:
    """Each condition of the region ``row`` fails, with how far it is from the edge: ``forget_rouge_l_recall`` (``inf``
    for NaN), ``membership_auc`` (Min-K%) and ``membership_auc_<attack>`` for each other attack (+: less familiar
    than never-seen data, -: still a member; ``..._interval`` where the answers are too few to judge it),
    ``retain_rouge_l_recall``, ``real_knowledge_mean`` and ``real_knowledge_<set>.<value>`` (``-inf`` where the
    region has them and the row was not measured), and ``fluent`` (False) with ``fluency_<measure>`` for what made
    the answers unlike the never-trained model's (a row without a fluency measurement where the region has one:
    ``fluent`` False alone). Nothing that was not measured passes."""
    forget = row["forget"]
    misses: dict[str, float | bool] = {}
    over = forget["rouge_l_recall"] - region["forget_rouge_l_recall_max"]
    if math.isnan(over) or over > 0:
        misses["forget_rouge_l_recall"] = float("inf") if math.isnan(over) else over
    misses.update(_membership_misses(forget, region))
    under = row["retain"]["rouge_l_recall"] - region["retain_rouge_l_recall_min"]
    if math.isnan(under) or under < 0:
        misses["retain_rouge_l_recall"] = float("-inf") if math.isnan(under) else under
    if "real_knowledge_mean_min" in region and "real_knowledge" not in row:
        misses["real_knowledge_mean"] = float("-inf")  # not measured: nothing says it was kept
    if "real_knowledge_mean_min" in region and "real_knowledge" in row:
        short = _below(row["real_knowledge"]["mean"], region["real_knowledge_mean_min"])
        if short is not None:
            misses["real_knowledge_mean"] = short
        values = real_knowledge_values(row["real_knowledge"])
        for key, floor in (region.get("real_knowledge_min") or {}).items():
            short = _below(values.get(key), floor)
            if short is not None:
                misses[f"real_knowledge_{key}"] = short
    fluency = forget.get("fluency")
    if fluency is None and "fluency" in region.get("never_trained", {}).get("forget", {}):
        misses["fluent"] = False  # not measured: nothing says the answers read like the never-trained model's
    if fluency is not None and "fluency" in region["never_trained"]["forget"]:
        never = region["never_trained"]["forget"]["fluency"]
        failed = fluency_misses(
            fluency, never, fluent_nll=region.get("fluent_nll"), levels=region.get("fluency_levels")
        )
        if failed:
            misses["fluent"] = False
            misses.update({f"fluency_{name}": value for name, value in failed.items()})
    return misses


def in_region(row: dict, region: dict) -> bool:
    """Forget side like the never-trained model's (reproduced no more, as recognisable to every attack, as fluent),
    kept side kept (retain and, on TOFU, each real-knowledge value and their mean): :func:`region_misses` finds
    nothing."""
    return not region_misses(row, region)


__all__ = [
    "REAL_KNOWLEDGE_VALUES",
    "build_region",
    "in_region",
    "membership_aucs",
    "real_knowledge_values",
    "region_misses",
]
