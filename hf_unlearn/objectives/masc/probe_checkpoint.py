"""The probe's state between two probes, as a checkpoint holds it: the running sums and forget margins since the last
probe, the window of forget answers' Min-K% the membership stop reads, and the never-seen margins last measured, so
that a resumed run takes the decisions the uninterrupted one would have (:class:`~.probe.ProbeState` inherits it)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .calibration import NeverSeenLevels


class ProbeCheckpointing:
    """:meth:`export_running` / :meth:`restore_running` of :class:`~.probe.ProbeState`'s attributes."""

    args: Any
    running_sums: dict[str, torch.Tensor]
    running_margins: list[torch.Tensor]
    running_tokens: list[torch.Tensor]
    running_copied: list[torch.Tensor]
    running_min_k: list[torch.Tensor]
    recent_min_k: torch.Tensor
    calibration_levels: NeverSeenLevels | None
    calibration_margins: torch.Tensor | None
    calibration_latest: dict[str, float]
    calibration_min_k: torch.Tensor | None
    probes_since_calibration: int
    start_retain_probability: float | None

    def export_running(self) -> dict[str, list[float]]:
        """The running sums as plain numbers, saved with a checkpoint, with what a resumed run needs to take the
        same decisions: the forget margins since the last probe (the calibration gap's), the never-seen margins
        last measured (the loss's thresholds between refreshes) and their answers' Min-K%, the probes since then,
        and the fixed retain sample's start value (the screen's reference)."""
        exported = {part: total.tolist() for part, total in self.running_sums.items()}
        if self.running_margins:  # the calibrated target's forget margins since the last probe, and their tokens
            exported["forget_margins"] = torch.cat(self.running_margins).cpu().tolist()
            exported["forget_tokens"] = [float(t) for t in torch.cat(self.running_tokens).cpu().tolist()]
            if self.running_copied:
                exported["forget_copied"] = [float(t) for t in torch.cat(self.running_copied).cpu().tolist()]
        if self.running_min_k:
            exported["forget_min_k"] = torch.cat(self.running_min_k).cpu().tolist()
        if self.recent_min_k.numel():
            exported["recent_min_k"] = self.recent_min_k.tolist()
        if self.calibration_margins is not None:
            exported["calibration_margins"] = self.calibration_margins.float().cpu().tolist()
        if self.calibration_min_k is not None:
            exported["calibration_min_k"] = self.calibration_min_k.cpu().tolist()
        if self.calibration_levels is not None:
            levels = self.calibration_levels
            exported["calibration_level_ids"] = [float(t) for t in levels.ids.cpu().tolist()]
            exported["calibration_levels"] = levels.values.float().cpu().tolist()
            if levels.copied is not None:
                exported["calibration_copied_margins"] = levels.copied.float().cpu().tolist()
            if levels.spread is not None:
                exported["calibration_level_spread"] = levels.spread.float().cpu().tolist()
            if levels.spread_offsets is not None:
                exported["calibration_level_spread_offsets"] = [float(t) for t in levels.spread_offsets.cpu().tolist()]
            exported["calibration_latest"] = [
                self.calibration_latest.get("violation_rate_calibration", float("nan")),
                self.calibration_latest.get("calibration_probability", float("nan")),
            ]
        exported["probe_state"] = [
            float(self.probes_since_calibration),
            float("nan") if self.start_retain_probability is None else self.start_retain_probability,
        ]
        return exported

    def restore_running(self, saved: dict[str, list[float]] | None, sums: bool = True) -> None:
        """Put back what :meth:`export_running` saved. ``sums=False`` (several processes: the checkpoint holds one
        process's sums) restores only what every process shares: the never-seen margins, the probes since they
        were measured and the screen's start value."""
        saved = dict(saved or {})
        device = self.args.device
        forget_margins, forget_tokens = saved.pop("forget_margins", None), saved.pop("forget_tokens", None)
        self.running_margins = (
            [torch.tensor(forget_margins, dtype=torch.float32, device=device)] if forget_margins else []
        )
        self.running_tokens = [torch.tensor(forget_tokens, dtype=torch.long, device=device)] if forget_tokens else []
        forget_copied = saved.pop("forget_copied", None)
        self.running_copied = [torch.tensor(forget_copied, device=device).bool()] if forget_copied else []
        forget_min_k = saved.pop("forget_min_k", None)
        self.running_min_k = [torch.tensor(forget_min_k, dtype=torch.float64, device=device)] if forget_min_k else []
        self.recent_min_k = torch.tensor(saved.pop("recent_min_k", []), dtype=torch.float64)
        margins = saved.pop("calibration_margins", None)
        if margins is not None:
            self.calibration_margins = torch.tensor(margins, dtype=torch.float32, device=device)
        min_k = saved.pop("calibration_min_k", None)
        if min_k is not None:
            self.calibration_min_k = torch.tensor(min_k, dtype=torch.float64)
        level_ids, levels = saved.pop("calibration_level_ids", None), saved.pop("calibration_levels", None)
        if level_ids is not None:
            copied_margins = saved.pop("calibration_copied_margins", None)
            spread = saved.pop("calibration_level_spread", None)
            offsets = saved.pop("calibration_level_spread_offsets", None)
            self.calibration_levels = NeverSeenLevels(
                torch.tensor(level_ids, dtype=torch.long),
                torch.tensor(levels, dtype=torch.float32),
                None if copied_margins is None else torch.tensor(copied_margins, dtype=torch.float32),
                None if spread is None else torch.tensor(spread, dtype=torch.float32),
                None if offsets is None else torch.tensor(offsets, dtype=torch.long),
            ).to(device)
        latest = saved.pop("calibration_latest", None)
        if latest is not None:
            self.calibration_latest = {
                "violation_rate_calibration": latest[0],
                "calibration_probability": latest[1],
            }
        probe_state = saved.pop("probe_state", None)
        if probe_state is not None:
            self.probes_since_calibration = int(probe_state[0])
            self.start_retain_probability = None if math.isnan(probe_state[1]) else probe_state[1]
        if not sums:
            self.running_margins, self.running_tokens, self.running_copied, self.running_sums = [], [], [], {}
            self.running_min_k = []
            return
        self.running_sums = {
            part: torch.tensor(values, dtype=torch.float64, device=self.args.device) for part, values in saved.items()
        }
