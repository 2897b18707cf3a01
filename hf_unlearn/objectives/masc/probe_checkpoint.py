"""The probe's state between two probes, as a checkpoint holds it: the running sums and forget margins since the last
probe, the window of forget answers' Min-K% the membership stop's running read takes, the start's never-seen
reference and when the stop last read exactly, so
that a resumed run takes the decisions the uninterrupted one would have (:class:`~.probe.ProbeState` inherits it)."""

from __future__ import annotations

import math
from typing import Any

import torch

from .calibration import NeverSeenLevels, NeverSeenReference
from .stop_read import StopReadState


class ProbeCheckpointing:
    """:meth:`export_running` / :meth:`restore_running` of :class:`~.probe.ProbeState`'s attributes."""

    args: Any
    running_sums: dict[str, torch.Tensor]
    running_margins: list[torch.Tensor]
    running_tokens: list[torch.Tensor]
    running_min_k: list[torch.Tensor]
    recent_min_k: torch.Tensor
    start_reference: NeverSeenReference | None
    stop_read: StopReadState
    start_retain_probability: float | None

    def export_running(self) -> dict[str, list[float]]:
        """The running sums as plain numbers, saved with a checkpoint, with what a resumed run needs to take the
        same decisions: the forget margins since the last probe (the calibration gap's), the start's never-seen
        margins (the loss's thresholds) and their answers' Min-K% (the running read's reference), when the stop
        last read exactly (:class:`~.stop_read.StopReadState`), and the fixed retain sample's start value (the
        screen's reference)."""
        exported = {part: total.tolist() for part, total in self.running_sums.items()}
        if self.running_margins:  # the calibrated target's forget margins since the last probe, and their tokens
            exported["forget_margins"] = torch.cat(self.running_margins).cpu().tolist()
            exported["forget_tokens"] = [float(t) for t in torch.cat(self.running_tokens).cpu().tolist()]
        if self.running_min_k:
            exported["forget_min_k"] = torch.cat(self.running_min_k).cpu().tolist()
        if self.recent_min_k.numel():
            exported["recent_min_k"] = self.recent_min_k.tolist()
        reference = self.start_reference
        if reference is not None:
            exported["calibration_margins"] = reference.margins.float().cpu().tolist()
            exported["calibration_min_k"] = reference.min_k.cpu().tolist()
            exported["calibration_latest"] = [reference.violation_rate, reference.probability]
        if reference is not None and reference.copy_margins is not None:
            exported["calibration_copy_margins"] = reference.copy_margins.float().cpu().tolist()
        if reference is not None and reference.levels is not None:
            levels = reference.levels
            exported["calibration_level_ids"] = [float(t) for t in levels.ids.cpu().tolist()]
            exported["calibration_levels"] = levels.values.float().cpu().tolist()
            exported["calibration_level_spread"] = levels.spread.float().cpu().tolist()
            exported["calibration_level_spread_offsets"] = [float(t) for t in levels.spread_offsets.cpu().tolist()]
        exported["stop_read"] = self.stop_read.export()
        exported["probe_state"] = [
            float("nan") if self.start_retain_probability is None else self.start_retain_probability
        ]
        return exported

    def restore_running(self, saved: dict[str, list[float]] | None, sums: bool = True) -> None:
        """Put back what :meth:`export_running` saved. ``sums=False`` (several processes: the checkpoint holds one
        process's sums) restores only what every process shares: the start's never-seen reference, the exact-read
        state and the screen's start value."""
        saved = dict(saved or {})
        device = self.args.device
        forget_margins, forget_tokens = saved.pop("forget_margins", None), saved.pop("forget_tokens", None)
        self.running_margins = (
            [torch.tensor(forget_margins, dtype=torch.float32, device=device)] if forget_margins else []
        )
        self.running_tokens = [torch.tensor(forget_tokens, dtype=torch.long, device=device)] if forget_tokens else []
        forget_min_k = saved.pop("forget_min_k", None)
        self.running_min_k = [torch.tensor(forget_min_k, dtype=torch.float64, device=device)] if forget_min_k else []
        self.recent_min_k = torch.tensor(saved.pop("recent_min_k", []), dtype=torch.float64)
        margins, min_k = saved.pop("calibration_margins", None), saved.pop("calibration_min_k", None)
        latest = saved.pop("calibration_latest", None)
        copy_margins = saved.pop("calibration_copy_margins", None)
        level_ids, values = saved.pop("calibration_level_ids", None), saved.pop("calibration_levels", None)
        levels = None
        if level_ids is not None:
            levels = NeverSeenLevels(
                torch.tensor(level_ids, dtype=torch.long),
                torch.tensor(values, dtype=torch.float32),
                torch.tensor(saved.pop("calibration_level_spread"), dtype=torch.float32),
                torch.tensor(saved.pop("calibration_level_spread_offsets"), dtype=torch.long),
            ).to(device)
        if margins is not None and min_k is not None and latest is not None:
            self.start_reference = NeverSeenReference(
                torch.tensor(margins, dtype=torch.float32, device=device),
                levels,
                torch.tensor(min_k, dtype=torch.float64),
                latest[0],
                latest[1],
                None if copy_margins is None else torch.tensor(copy_margins, dtype=torch.float32, device=device),
            )
        self.stop_read = StopReadState.restored(saved.pop("stop_read", None))
        probe_state = saved.pop("probe_state", None)
        if probe_state is not None:
            self.start_retain_probability = None if math.isnan(probe_state[0]) else probe_state[0]
        if not sums:
            self.running_margins, self.running_tokens, self.running_sums = [], [], {}
            self.running_min_k = []
            return
        self.running_sums = {
            part: torch.tensor(values, dtype=torch.float64, device=self.args.device) for part, values in saved.items()
        }
