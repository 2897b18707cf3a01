"""What the calibrated stop acts on (beyond the MASC paper): the statistic read exactly as the evaluation reads it.

The calibrated stops compare the forget answers with answers the model never trained on (the calibration set):
``stop_target='membership'`` by the Min-K% AUC between them (Shi et al. 2024, the attack
:func:`~hf_unlearn.evaluation.bundle.qa_membership_aucs` runs), ``'calibration'`` by the calibration gap
(:func:`~.calibration.calibration_gap`). A stop decides only on an **exact read**: the fixed forget sample and every
calibration answer scored once each, in eval mode, at the current weights. It equals the evaluation's read at those
weights (tests/test_stopping.py checks it to 1e-6). The never-seen answers' scores move with unlearning (up with the
defaults, down with a larger rate: docs/studies/masc_landing.md), so a reference taken at step 0 is not the one the
evaluation reads.

An exact read costs a forward over both sets. Between them, a **running read** at every probe (free: the forget
answers' scores from the training forwards since the last probe, against the never-seen scores taken at step 0),
corrected by how far it was from the last exact read, says when the next exact read is worth its forward: when the
corrected running read is within :data:`EXACT_READ_MARGIN` of the target, and at least every
:data:`EXACT_READ_EVERY` probes so that the correction stays current. The running read never stops a run."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...scores import membership_auc, membership_auc_interval
from .calibration import NeverSeenReference

#: The statistic each calibrated stop target acts on, and the key it is recorded under in the probe history.
STOP_STATISTICS = {"membership": "calibration_min_k_auc", "calibration": "calibration_gap"}

#: An exact read when the corrected running read is within this of the target: an AUC for ``'membership'`` (the
#: window of 64 answers reads an AUC to about ±0.05, the correction adds as much), logits for ``'calibration'``.
EXACT_READ_MARGIN = {"membership": 0.1, "calibration": 1.0}

#: At least every this many probes an exact read, whatever the running read says: it renews the correction. On TOFU
#: with SmolLM2-135M an exact read costs about five steps (docs/cost.md), so this is ~5 % of a run's steps.
EXACT_READ_EVERY = 20


def min_k_auc(forget: torch.Tensor, never_seen: torch.Tensor) -> float:
    """The Min-K% AUC of forget answers' scores against never-seen ones (answers with nothing left to score, NaN,
    are not read), as the evaluation computes it (:func:`~hf_unlearn.scores.membership_auc`)."""
    return membership_auc(forget[~forget.isnan()].tolist(), never_seen[~never_seen.isnan()].tolist())


def min_k_auc_interval(
    forget: torch.Tensor,
    never_seen: torch.Tensor,
    forget_groups: Sequence[Any] | None = None,
    never_seen_groups: Sequence[Any] | None = None,
) -> tuple[float, float]:
    """The 95 % interval of :func:`min_k_auc` (:func:`~hf_unlearn.scores.membership_auc_interval`), resampling the
    answers' authors where both sides name them (as the evaluation's interval does), else the answers."""
    kept = [~forget.isnan(), ~never_seen.isnan()]

    def scored(groups: Sequence[Any] | None, keep: torch.Tensor) -> list[Any] | None:
        return None if groups is None else [g for g, k in zip(groups, keep.tolist(), strict=True) if k]

    groups = {"forget_groups": scored(forget_groups, kept[0]), "holdout_groups": scored(never_seen_groups, kept[1])}
    return membership_auc_interval(forget[kept[0]].tolist(), never_seen[kept[1]].tolist(), **groups)


def auc_with_interval(read: Mapping[str, Any]) -> str:
    """A probe's exact Min-K% AUC as the stop's reason writes it: the value and its 95 % interval."""
    auc = read.get("calibration_min_k_auc", float("nan"))
    low, high = read.get("calibration_min_k_auc_low"), read.get("calibration_min_k_auc_high")
    return f"{auc:.3f}" + ("" if low is None or high is None else f" [95 % interval {low:.3f}, {high:.3f}]")


def stop_statistic(target: str, forget: Mapping[str, Any], reference: NeverSeenReference) -> float | None:
    """The statistic ``target`` acts on, of one probe set's forget measurement (``margins``, ``tokens``, ``min_k``)
    against ``reference``; ``None`` when the forget side brings nothing to read."""
    if target == "membership":
        scores = forget.get("min_k")
        return None if scores is None or not bool((~scores.isnan()).any()) else min_k_auc(scores, reference.min_k)
    margins = forget.get("margins")
    return None if margins is None else reference.gap(forget)


def last_exact_read(history: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The last probe of ``history`` that read the calibrated stop's statistic exactly (:mod:`.stop_read`), else
    the last probe."""
    exact = [h for h in history if h.get("stop_read_exact", 1.0) == 1.0 and "calibration_gap" in h]
    return exact[-1] if exact else (history[-1] if history else {})


@dataclass
class StopReadState:
    """Between exact reads: the probes since the last one, how far the running read was from it (exact minus
    running), and how many there were. Saved with a checkpoint, so that a resumed run reads when the uninterrupted
    one would have."""

    probes_since_exact: int = 0
    offset: float = 0.0
    exact_reads: int = 0

    def due(self, target: str, threshold: float, running: float | None) -> bool:
        """Whether this probe reads exactly: no running read, the corrected running read within
        :data:`EXACT_READ_MARGIN` of ``threshold``, or :data:`EXACT_READ_EVERY` probes since the last exact read."""
        if running is None or self.probes_since_exact + 1 >= EXACT_READ_EVERY:
            return True
        corrected, margin = running + self.offset, EXACT_READ_MARGIN[target]
        return corrected >= threshold - margin if target == "membership" else corrected <= threshold + margin

    def skipped(self) -> None:
        self.probes_since_exact += 1

    def read(self, exact: float, running: float | None) -> None:
        self.probes_since_exact, self.exact_reads = 0, self.exact_reads + 1
        if running is not None and math.isfinite(exact) and math.isfinite(running):
            self.offset = exact - running

    def export(self) -> list[float]:
        return [float(self.probes_since_exact), self.offset, float(self.exact_reads)]

    @classmethod
    def restored(cls, saved: list[float] | None) -> StopReadState:
        if not saved:
            return cls()
        return cls(int(saved[0]), float(saved[1]), int(saved[2]))
