"""The weight states the utility floor may put back (MASC's stop, beyond the paper's): the last probe that passed the
floor, and a candidate the retain screen passed, kept in host memory (:class:`~.probe.ProbeState` inherits it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from transformers.utils import logging

logger = logging.get_logger(__name__)


class KeptStates:
    """:meth:`snapshot`, :meth:`restore`, :meth:`keep_good_state` and :meth:`restore_after_failure` of
    :class:`~.probe.ProbeState`'s trainable parameters."""

    args: Any
    sets: Any
    can_snapshot: bool
    retain_verified: bool
    start_retain_probability: float | None
    snapshots: dict[str, tuple[int, list[torch.Tensor]]]
    restored_step: int | None
    _trainable: Callable[[], list[torch.Tensor]]
    _timed: Callable[[str, Sequence[Mapping[str, Any]]], dict[str, Any]]
    _agree_across_processes: Callable[[Any], Any]

    def snapshot(self, name: str, step: int) -> None:
        """Copy the trainable parameters to host memory (not possible when DeepSpeed partitions them)."""
        if not self.can_snapshot:
            return
        self.snapshots[name] = (step, [p.detach().to("cpu", copy=True) for p in self._trainable()])

    def restore(self, name: str) -> None:
        if name not in self.snapshots:
            logger.warning(f"UnlearnTrainer: no '{name}' state was kept, so the weights stay as they are.")
            return
        step, saved = self.snapshots[name]
        with torch.no_grad():
            for param, value in zip(self._trainable(), saved):
                param.copy_(value.to(param.device))
        self.restored_step = step
        logger.warning(f"UnlearnTrainer: restored the weights of step {step} ({name.replace('_', ' ')} state).")

    def keep_good_state(self, step: int) -> None:
        """The utility floor's fallback, called at every probe that passed it: the weights to put back if a later
        probe falls through. A pass read on the fixed sample certifies the current weights. A pass read on the
        screen does not (its batches ran at the weights *before* each update, so an update that broke the model
        just before this probe is not in it): the current weights become a candidate, promoted at the next probe
        whose reading passes, when the screen's batches include a forward at exactly those weights."""
        if self.retain_verified:
            self.snapshots.pop("candidate", None)
            self.snapshot("last_good", step)
            return
        if "candidate" in self.snapshots:
            self.snapshots["last_good"] = self.snapshots.pop("candidate")
        self.snapshot("candidate", step)

    def restore_after_failure(self, step: int) -> None:
        """The floor fell through: put back the candidate state if the fixed retain sample, measured at its
        weights now, is above the floor (one forward pass, only at a failure); else the last certified state."""
        floor = (self.args.utility_floor or 0.0) * (self.start_retain_probability or 0.0)
        if "candidate" in self.snapshots and self.sets.retain:
            self.restore("candidate")
            reading = self._timed("retain", self.sets.retain)["probabilities"].mean().item()
            if self._agree_across_processes(reading) >= floor:
                return
            logger.warning(
                f"UnlearnTrainer: the state of step {self.restored_step} was under the utility floor too "
                f"(retain answer probability {reading:.4g} < {floor:.4g}); going back further."
            )
        self.restore("last_good")
