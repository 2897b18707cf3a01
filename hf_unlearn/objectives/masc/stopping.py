"""MASC's online stopping rule (§3) and the utility floor, as a `TrainerCallback` whose state travels with
checkpoints: every ``probe_interval`` optimizer steps it asks the probe (:class:`~.probe.ProbeState`) for a
measurement and stops at the first that meets the target (the paper's violation rate, or beyond the paper the
calibration gap or the Min-K% AUC against never-seen answers), or as a failure when retain falls through the floor."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer_callback import ExportableState
from transformers.utils import logging

from .stop_read import auc_with_interval, last_exact_read

logger = logging.get_logger(__name__)


def hoeffding_upper_bound(rate: float, num_examples: int, probe_index: int, delta: float) -> float:
    """One-sided Hoeffding upper confidence bound on the violation rate at the j-th probe (MASC §3).

    ``rate + sqrt(log(1/delta_j) / (2n))`` with ``delta_j = 6 delta / (pi^2 (j+1)^2)``, so the bound holds at
    every probe of the run simultaneously with probability ``1 - delta``.
    """
    delta_j = 6.0 * delta / (math.pi**2 * (probe_index + 1) ** 2)
    return rate + math.sqrt(math.log(1.0 / delta_j) / (2.0 * num_examples))


# A probe returns at least {"violation_rate": float, "num_examples": int}; with the calibrated target also
# "calibration_gap", with the utility floor "retain_probability"; other numbers are recorded too.
Probe = Callable[[], dict[str, float]]


STOPPING_TARGETS = ("alpha", "calibration", "membership")


#: ``calibration_auc_slack`` of ``target='membership'``: stop at Min-K% AUC >= 0.45 against the calibration answers
#: (docs/studies/masc_landing.md, section 12: the rule that landed the most reference assignments, in-sample).
DEFAULT_MEMBERSHIP_AUC_SLACK = 0.05


class ViolationStoppingCallback(TrainerCallback, ExportableState):
    """Probe every ``probe_interval`` optimizer steps; stop at the first probe that meets the target, or as a failure
    when the retain side falls through the utility floor.

    MASC §3 stopping rule: the violation rate is the mean over probe examples of the fraction of answer tokens whose
    restricted margin exceeds tau; the run stops at the first probe where it is <= ``alpha``. With
    ``violation_bound_delta`` set, its one-sided Hoeffding upper bound ``rate + sqrt(log(1/delta_j) / 2n)``, ``delta_j
    = 6 delta / (pi^2 (j+1)^2)``, must be instead. With ``target="calibration"`` (beyond the paper) the run stops once
    the forget answers look no more familiar to the model than data of the same kind it never trained on (the
    calibration set): the calibration gap, the mean excess of the forget set's sorted margins over the never-seen
    margins at the same quantiles (:func:`~.calibration.calibration_gap`), is <= ``calibration_slack`` logits. With
    ``target="membership"`` (beyond the paper) it stops once Min-K% (Shi et al. 2024) tells the forget answers from the
    calibration answers no better than AUC ``0.5 - calibration_auc_slack`` (the probe's ``calibration_min_k_auc``).
    Both decide only on exact reads, both sets scored at the current weights as the evaluation scores them
    (:mod:`.stop_read`).

    Utility floor: when the retain answer probability at a probe is below ``utility_floor`` times its value at the
    start of training, the run stops as a failure (``stop_kind == "utility_floor"``), whatever the forget side says.

    With ``stop=False`` it only measures and records (and still notes the first probe that met the target).
    The probe and the state hooks are supplied by the trainer with :meth:`bind`; the counters below are exported
    to ``trainer_state.json`` in each checkpoint and restored on ``resume_from_checkpoint``.
    """

    def __init__(
        self,
        alpha: float,
        probe_interval: int,
        stop: bool = True,
        violation_bound_delta: float | None = None,
        target: str = "alpha",
        calibration_slack: float = 0.0,
        utility_floor: float | None = None,
        calibration_auc_slack: float | None = None,
    ) -> None:
        if target not in STOPPING_TARGETS:
            raise ValueError(f"target must be one of {STOPPING_TARGETS}, got {target!r}.")
        if target == "membership" and calibration_auc_slack is None:
            calibration_auc_slack = DEFAULT_MEMBERSHIP_AUC_SLACK
        self.alpha = alpha
        self.probe_interval = probe_interval
        self.stop = stop
        self.violation_bound_delta = violation_bound_delta
        self.target = target
        self.calibration_slack = calibration_slack
        self.calibration_auc_slack = calibration_auc_slack
        self.utility_floor = utility_floor
        self.probes_done = 0
        self.last_violation_rate: float | None = None
        self.stop_step: int | None = None
        self.stop_kind: str | None = None
        self.first_target_step: int | None = None
        self.start_retain_probability: float | None = None
        self.history: list[dict[str, float]] = []
        # Statistics the probe accumulates between probes (the trainer's running rates), saved with checkpoints so
        # that a resumed run's next probe measures what the uninterrupted run's would have.
        self.running_sums: dict[str, list[float]] | None = None
        self._probe: Probe | None = None
        self._hooks: dict[str, Callable[[int], None]] = {}
        self._export_running: Callable[[], dict[str, list[float]]] | None = None

    @classmethod
    def from_config(cls, args: Any, has_retain: bool) -> ViolationStoppingCallback:
        """The stopping rule an ``UnlearnConfig`` asks for; without a retain set the utility floor is off (warned)."""
        floor = args.utility_floor or None
        if floor and not has_retain:
            logger.warning("UnlearnTrainer: no retain set, so the utility floor cannot be watched; it is off.")
            floor = None
        return cls(
            alpha=args.stop_alpha,
            probe_interval=args.probe_interval,
            stop=bool(args.stop_at_target),
            violation_bound_delta=args.violation_bound_delta,
            target=args.stop_target,
            calibration_slack=args.calibration_slack,
            utility_floor=floor,
            calibration_auc_slack=args.calibration_auc_slack,
        )

    def bind(
        self,
        probe: Probe,
        on_good_state: Callable[[int], None] | None = None,
        on_failure: Callable[[int], None] | None = None,
        export_running: Callable[[], dict[str, list[float]]] | None = None,
    ) -> None:
        """Give the callback the function that measures the current model, and what to call (with the step) at a
        probe that passed the floor and when the floor is crossed;
        ``export_running`` returns the probe's running sums when a checkpoint is saved."""
        self._probe = probe
        self._export_running = export_running
        self._hooks = {
            name: hook for name, hook in (("good", on_good_state), ("failure", on_failure)) if hook is not None
        }

    def state(self) -> dict[str, Any]:
        return {
            "args": {
                "alpha": self.alpha,
                "probe_interval": self.probe_interval,
                "stop": self.stop,
                "violation_bound_delta": self.violation_bound_delta,
                "target": self.target,
                "calibration_slack": self.calibration_slack,
                "utility_floor": self.utility_floor,
                "calibration_auc_slack": self.calibration_auc_slack,
            },
            "attributes": {
                "probes_done": self.probes_done,
                "last_violation_rate": self.last_violation_rate,
                "stop_step": self.stop_step,
                "stop_kind": self.stop_kind,
                "first_target_step": self.first_target_step,
                "start_retain_probability": self.start_retain_probability,
                "history": self.history,
                "running_sums": self._export_running() if self._export_running is not None else None,
            },
        }

    @property
    def stopped_early(self) -> bool:
        """Stopped by the rule, having reached the target (not by the utility floor)."""
        return self.stop_kind == "target"

    def threshold(self, measured: dict[str, float]) -> float:
        """What the decisive statistic (violation rate, calibration gap, or Min-K% AUC) must reach at this probe."""
        if self.target == "membership":
            return 0.5 - self.calibration_auc_slack
        return self.calibration_slack if self.target == "calibration" else self.alpha

    def statistic(self, measured: dict[str, float], bound: float) -> float:
        """The decisive statistic of this probe. The calibrated targets' is an exact read, taken only at some probes
        (:mod:`.stop_read`): at the others it is missing, and the target is not met."""
        if self.target == "membership":
            return float(measured.get("calibration_min_k_auc", -math.inf))
        if self.target == "calibration":
            return float(measured.get("calibration_gap", math.inf))
        return bound if self.violation_bound_delta is not None else float(measured["violation_rate"])

    def target_met(self, measured: dict[str, float], bound: float) -> bool:
        """Whether this probe meets the target: the statistic at or under its threshold (the AUC at or above it)."""
        statistic, threshold = self.statistic(measured, bound), self.threshold(measured)
        if self.target == "membership":
            return statistic >= threshold
        return statistic <= threshold

    def _call(self, hook: str, step: int) -> None:
        if hook in self._hooks:
            self._hooks[hook](step)

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> TrainerControl:
        """Record the start point (step 0) for the curves and the utility floor; it is not a stopping decision."""
        if self.probe_interval > 0 and state.global_step == 0 and not self.history and self._probe is not None:
            measured = self._probe()
            self.history.append({"step": 0, **measured, "stop_threshold": self.threshold(measured)})
            self.start_retain_probability = measured.get("retain_probability")
        if self.stop_step is None:
            self._call("good", state.global_step)  # the state training starts (or resumes) from
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
        threshold = self.threshold(measured)
        # Logged at delta 0.05 when the rule reads the rate itself, so the history always shows how sure a stop was.
        delta = 0.05 if self.violation_bound_delta is None else self.violation_bound_delta
        bound = hoeffding_upper_bound(rate, int(measured["num_examples"]), self.probes_done, delta)
        entry = {"step": state.global_step, **measured, "violation_upper_bound": bound, "stop_threshold": threshold}
        self.history.append(entry)
        self.probes_done += 1
        self.last_violation_rate = rate
        step = state.global_step
        retain = measured.get("retain_probability")
        if self.utility_floor and self.start_retain_probability and retain is not None:
            floor = self.utility_floor * self.start_retain_probability
            if not retain >= floor:  # also catches NaN
                self.stop_step, self.stop_kind = step, "utility_floor"
                control.should_training_stop = True
                control.should_log = True
                logger.warning(
                    f"Unlearning failed at step {step}: the retain answer probability fell to {retain:.4g}, under the "
                    f"utility floor {floor:.4g} ({self.utility_floor:g} x its start value "
                    f"{self.start_retain_probability:.4g}). Training stopped; lower the learning rate or the forget "
                    "weight."
                )
                self._call("failure", step)
                return control
        statistic = self.statistic(measured, bound)
        met = self.target_met(measured, bound)
        if met and self.first_target_step is None:
            self.first_target_step = step
        if self.stop and met:
            self.stop_step, self.stop_kind = step, "target"
            control.should_training_stop = True
            control.should_log = True
            if self.target == "membership":
                measure = "Min-K% AUC against the calibration set"
            elif self.target == "calibration":
                measure = "calibration gap (logits above never-seen data)"
            else:
                bounded = self.violation_bound_delta is not None
                measure = "upper bound of the violation rate" if bounded else "violation rate"
            relation = ">=" if self.target == "membership" else "<="
            logger.info(
                f"Unlearning target reached at step {step}: forget {measure} {statistic:.3f} {relation} "
                f"{threshold:.3f}, violation rate {rate:.3f}"
                + (f", retain answer probability {retain:.3f}." if retain is not None else ".")
            )
            return control
        self._call("good", step)
        return control


#: What loosens each stop target, named by the budget-exhausted warning.
LOOSER_TARGET = {
    "alpha": "a larger stop_alpha, or a calibration_dataset with stop_target='calibration'",
    "calibration": "a larger calibration_slack",
    "membership": "a larger calibration_auc_slack",
}


def warn_budget_ended(stop_reason: str, stop_target: str) -> None:
    """The warning of a run that stops itself but ran out of steps first, with what would let it stop."""
    logger.warning(
        f"Unlearning ended without meeting its stopping rule: {stop_reason}. To let it stop itself, give it more "
        "steps (max_steps), a larger learning_rate or forget_weight, or a looser target "
        f"({LOOSER_TARGET.get(stop_target, 'stop_alpha')})."
    )


def stop_kind(stopping: Any, state: Any) -> str | None:
    """'target', 'utility_floor', 'budget' (all steps ran), 'other' (another callback, an interruption), or None
    before training."""
    if stopping.stop_kind is not None:
        return stopping.stop_kind
    if state.max_steps and state.global_step >= state.max_steps:
        return "budget"
    return None if state.global_step == 0 else "other"


def _target_reason(stopping: Any, args: Any, last: dict[str, Any]) -> str:
    """The sentence of a run that met its target."""
    trained = (
        f"a fixed sample of up to {args.probe_size} forget answers trained on"
        if args.stop_probe == "train"
        else "the held-out forget answers"
    )
    if stopping.target == "membership":
        return (
            f"target reached: at step {stopping.stop_step} Min-K% told {trained} from never-seen data no better than "
            f"AUC {auc_with_interval(last)} >= {stopping.threshold(last):g}, both read at "
            f"the step's weights (calibration gap {last.get('calibration_gap', float('nan')):.3f} logits; violation "
            f"rate {stopping.last_violation_rate:.3f})"
        )
    if stopping.target == "calibration":
        return (
            f"target reached: at step {stopping.stop_step} {trained} looked no more familiar than never-seen data, "
            f"both read at the step's weights (calibration gap {last.get('calibration_gap', float('nan')):.3f} <= "
            f"{stopping.calibration_slack:g} logits; violation rate {stopping.last_violation_rate:.3f}, never-seen "
            f"{last.get('violation_rate_calibration', float('nan')):.3f})"
        )
    bounded = args.violation_bound_delta is not None
    measure = "upper confidence bound of the violation rate" if bounded else "violation rate"
    return (
        f"target reached: the {measure} of the {args.stop_probe} probe fell to alpha = {stopping.alpha:g} at "
        f"step {stopping.stop_step} (rate {stopping.last_violation_rate:.3f})"
    )


def _budget_reason(stopping: Any, state: Any, args: Any, history: list[dict[str, Any]], restored: str) -> str:
    """The sentence of a run whose steps ran out, with what the rule last read against its target (a calibrated
    target: its last exact read)."""
    if not (args.stop_at_target and args.probe_interval > 0):
        return f"budget exhausted: all {state.max_steps} steps ran (no stopping rule){restored}"
    rate = stopping.last_violation_rate
    last = last_exact_read(history)
    if rate is None:
        measured = "never probed"
    elif stopping.target == "calibration" and "calibration_gap" in last:
        # the statistic the rule compares with its target: the gap, in logits, not the violation rate
        measured = (
            f"last calibration gap {last['calibration_gap']:.3f} logits at step {last['step']}, violation "
            f"rate {rate:.3f}"
        )
    else:
        measured = f"last violation rate {rate:.3f}"
    threshold = last.get("stop_threshold")
    target = "" if threshold is None or stopping.target == "membership" else f", target {threshold:.3f}"
    if stopping.target == "membership" and "calibration_min_k_auc" in last:
        target += (
            f"; Min-K% AUC against never-seen data {auc_with_interval(last)} at step {last['step']}, "
            f"target >= {0.5 - stopping.calibration_auc_slack:g}"
        )
    return (
        f"budget exhausted: all {state.max_steps} steps ran without meeting the stopping rule "
        f"({measured}{target}){restored}"
    )


def stop_reason(stopping: Any, state: Any, args: Any, restored_step: int | None) -> str:
    """Why the run ended, in a sentence the report and the model card quote (:class:`ViolationStoppingCallback`'s
    state and history, ``state`` Trainer's)."""
    kind = stop_kind(stopping, state)
    restored = f"; the weights of step {restored_step} were restored" if restored_step is not None else ""
    last = stopping.history[-1] if stopping.history else {}
    if kind == "target":
        return _target_reason(stopping, args, last)
    if kind == "utility_floor":
        return (
            f"stopped: utility floor. At step {stopping.stop_step} the retain answer probability fell to "
            f"{last.get('retain_probability', float('nan')):.4g}, under {stopping.utility_floor:g} x its start "
            f"value {stopping.start_retain_probability:.4g}{restored}"
        )
    if kind == "budget":
        return _budget_reason(stopping, state, args, stopping.history, restored)
    if kind is None:
        return "not trained yet"
    return f"stopped at step {state.global_step} of {state.max_steps} by another callback or an interruption{restored}"
