"""The region of `hf-unlearn compare`: where a model that never saw the forget set lies, and what a run misses of it.

Read by compare's race, its report and the studies; a pure function of the measurements of the target, of the
never-trained model and of a run (:meth:`hf_unlearn.jobs.compare.CompareSetting.measure`).
"""

from __future__ import annotations

from typing import Any

from ..evaluation.fluency import fluent_like


def build_region(before: dict, never_trained: dict, cli: Any) -> dict:
    """The region a run must end in, from the target's (``before``) and the never-trained model's measurements.

    The forget side is the never-trained model's (forget ROUGE-L, membership AUC, fluency); the kept side is what
    both models keep: retain ROUGE-L and, on TOFU, real knowledge at least ``retain_ratio`` x the lower of the two
    (so the never-trained model lies in its own region). Real knowledge is read as the arithmetic mean of TOFU's
    six values (ROUGE-L, probability, truth ratio on real authors and world facts): their harmonic mean, TOFU's
    model utility, is reported beside it but sinks to nothing when one value is near zero, as a small model's
    real-author ROUGE-L is. ``cli``: the compare arguments (``forget_rouge_tolerance``, ``membership_tolerance``,
    ``retain_ratio``)."""
    region = {
        "forget_rouge_l_recall_max": never_trained["forget"]["rouge_l_recall"] + cli.forget_rouge_tolerance,
        "membership_auc_reference": never_trained["forget"]["membership_auc"],
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
    if "fluency" in never_trained["forget"]:
        # fluent answers the never-trained model did not write: the target's, before unlearning
        region["fluent_nll"] = before["forget"].get("fluency", {}).get("reference_nll")
    return region


def region_misses(row: dict, region: dict) -> dict[str, float | bool]:
    """Each condition of the region ``row`` fails, with how far it is from the edge (``fluent``: False when the
    forget answers are not fluent like the never-trained model's; fluency is only judged where it was measured)."""
    forget = row["forget"]
    misses: dict[str, float | bool] = {}
    over = forget["rouge_l_recall"] - region["forget_rouge_l_recall_max"]
    if over > 0:
        misses["forget_rouge_l_recall"] = over
    off = abs(forget["membership_auc"] - region["membership_auc_reference"]) - region["membership_tolerance"]
    if off > 0:
        misses["membership_auc"] = off if forget["membership_auc"] > region["membership_auc_reference"] else -off
    under = row["retain"]["rouge_l_recall"] - region["retain_rouge_l_recall_min"]
    if under < 0:
        misses["retain_rouge_l_recall"] = under
    if "real_knowledge_mean_min" in region and "real_knowledge" in row:
        short = row["real_knowledge"]["mean"] - region["real_knowledge_mean_min"]
        if short < 0:
            misses["real_knowledge_mean"] = short
    fluency = forget.get("fluency")
    if fluency is not None and "fluency" in region["never_trained"]["forget"]:
        never = region["never_trained"]["forget"]["fluency"]
        if not fluent_like(fluency, never, fluent_nll=region.get("fluent_nll")):
            misses["fluent"] = False
    return misses


def in_region(row: dict, region: dict) -> bool:
    """Forget side like the never-trained model's (reproduced no more, as recognisable, as fluent), kept side kept
    (retain and, on TOFU, real knowledge): :func:`region_misses` finds nothing."""
    return not region_misses(row, region)


__all__ = ["build_region", "in_region", "region_misses"]
