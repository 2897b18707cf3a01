"""The MASC online stopping rule as a `TrainerCallback` whose state travels with checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState

from .margin import hoeffding_upper_bound

# A probe returns at least {"violation_rate": float, "num_examples": int}; other numbers are recorded too.
Probe = Callable[[], dict[str, float]]


class ViolationStoppingCallback(TrainerCallback, ExportableState):
    """Measure the violation rate every ``probe_interval`` optimizer steps; stop at the first rate <= ``alpha``.

    MASC §3 stopping rule: the violation rate is the mean over probe examples of the fraction of answer tokens
    whose restricted margin exceeds tau. With ``hoeffding=True`` the run stops only when the one-sided
    Hoeffding upper bound ``rate + sqrt(log(1/delta_j) / 2n)`` is <= alpha, ``delta_j = 6 delta / (pi^2 (j+1)^2)``.

    With ``stop=False`` it only measures and records (any objective gets the same curve).
    The probe itself is supplied by the trainer with :meth:`bind`; the counters below are exported to
    ``trainer_state.json`` in each checkpoint and restored on ``resume_from_checkpoint``.
    """

    def __init__(
        self,
        alpha: float,
        probe_interval: int,
        stop: bool = True,
        hoeffding: bool = False,
        hoeffding_delta: float = 0.05,
    ) -> None:
        self.alpha = alpha
        self.probe_interval = probe_interval
        self.stop = stop
        self.hoeffding = hoeffding
        self.hoeffding_delta = hoeffding_delta
        self.probes_done = 0
        self.last_violation_rate: float | None = None
        self.stop_step: int | None = None
        self.history: list[dict[str, float]] = []
        self._probe: Probe | None = None

    def bind(self, probe: Probe) -> None:
        """Give the callback the function that measures the current model."""
        self._probe = probe

    def state(self) -> dict[str, Any]:
        return {
            "args": {
                "alpha": self.alpha,
                "probe_interval": self.probe_interval,
                "stop": self.stop,
                "hoeffding": self.hoeffding,
                "hoeffding_delta": self.hoeffding_delta,
            },
            "attributes": {
                "probes_done": self.probes_done,
                "last_violation_rate": self.last_violation_rate,
                "stop_step": self.stop_step,
                "history": self.history,
            },
        }

    @property
    def stopped_early(self) -> bool:
        return self.stop_step is not None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Record the start point (step 0) for the curves; it is not a stopping decision."""
        if self.probe_interval > 0 and state.global_step == 0 and not self.history and self._probe is not None:
            self.history.append({"step": 0, **self._probe()})
        return control

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        if self.stop_step is not None:  # resumed from a checkpoint taken after the stop
            control.should_training_stop = True
            return control
        if self.probe_interval <= 0 or state.global_step % self.probe_interval != 0:
            return control
        if self._probe is None:
            raise RuntimeError("ViolationStoppingCallback has no probe: the trainer must call bind() first.")
        measured = self._probe()
        rate = float(measured["violation_rate"])
        bound = hoeffding_upper_bound(rate, int(measured["num_examples"]), self.probes_done, self.hoeffding_delta)
        self.history.append({"step": state.global_step, **measured, "violation_upper_bound": bound})
        self.probes_done += 1
        self.last_violation_rate = rate
        decisive = bound if self.hoeffding else rate
        if self.stop and decisive <= self.alpha:
            self.stop_step = state.global_step
            control.should_training_stop = True
            control.should_log = True
        return control
