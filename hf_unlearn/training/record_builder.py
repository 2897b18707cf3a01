"""The run record from the trainer's state: pure functions of the configuration, the objectives, Trainer's state and
the stopping rule. The trainer calls :func:`build_record` at construction, with each checkpoint and once at the end of
``train()``; report, model card, checks and CLI read the record and never reach back into the trainer."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from ..data.pairing import continuation_options
from ..objectives.masc.stopping import stop_kind, stop_reason
from ..objectives.registry import objective_hyperparameters
from ..surgery import SURGERY_PAPER
from .record import UnlearnRecord
from .sharpness import SAM_PAPER

# Training settings that shape every run, recorded next to each objective's own hyperparameters.
TRAINING_HYPERPARAMETERS = (
    "learning_rate",
    "lr_scheduler_type",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "max_grad_norm",
    "optim",
    "weight_decay",
    "seed",
    "bf16",
    "forget_weight",
    "retain_weight",
    "gradient_surgery",
)
STOPPING_HYPERPARAMETERS = (
    "stop_target",
    "stop_alpha",
    "calibration_slack",
    "calibration_auc_slack",
    "probe_interval",
    "stop_probe",
    "holdout_fraction",
    "probe_size",
    "violation_bound_delta",
)
GUARD_HYPERPARAMETERS = ("utility_floor", "restore_on_failure")
CONTINUATION_HYPERPARAMETERS = ("forget_scoring", "forget_scoring_kwargs")


def hyperparameters(args: Any, objectives: Sequence[Any]) -> dict[str, Any]:
    """The settings that shaped the run: training's, each objective's own (its config fields, the data columns or
    refusals it reads, and the values of the hyperparameters it declared, as ``forget_loss_kwargs`` /
    ``retain_loss_kwargs``), and those of the stopping rule, the guards and continuation scoring where they are in
    use. Enum settings (scheduler, optimizer) by their value."""
    names = list(TRAINING_HYPERPARAMETERS)
    if getattr(args, "sam_rho", 0):  # sharpness-aware forgetting: recorded when on
        names.append("sam_rho")
    for objective in objectives:
        names += objective.hyperparameters
    if args.stop_at_target:
        names += STOPPING_HYPERPARAMETERS
    if args.probe_interval > 0:
        names += GUARD_HYPERPARAMETERS
    values = {name: getattr(getattr(args, name), "value", getattr(args, name)) for name in names}
    if args.forget_scoring != "answer":  # the cut's options, defaults included
        values.update(dict(zip(CONTINUATION_HYPERPARAMETERS, (args.forget_scoring, continuation_options(
            args.forget_scoring_kwargs
        )))))  # fmt: skip
    for part, objective in zip(("forget", "retain"), objectives):
        if objective.declared:  # the values its declared hyperparameters had, defaults included
            values[f"{part}_loss_kwargs"] = objective_hyperparameters(args, part)
    return values


def papers(objectives: Sequence[Any], gradient_surgery: str, sam_rho: float = 0.0) -> list[dict[str, Any]]:
    """The papers behind the run's objectives (and the surgery paper when surgery combines the gradients, the
    Unlearn-Smooth paper with ``sam_rho`` > 0)."""
    cited = [objective.paper for objective in objectives if objective.paper is not None]
    result = [{"title": p.title, "url": p.url, "authors": p.authors} for p in dict.fromkeys(cited)]
    if gradient_surgery != "sum":
        result.append(dict(zip(("title", "url", "authors"), SURGERY_PAPER)))
    if sam_rho:
        result.append(dict(zip(("title", "url", "authors"), SAM_PAPER)))
    return result


def surgery_history(log_history: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The gradient-surgery statistics of every training log, with their step."""
    return [
        {"step": log["step"], **{k: v for k, v in log.items() if k.startswith("surgery/")}}
        for log in log_history
        if any(k.startswith("surgery/") for k in log)
    ]


def beyond_paper(args: Any, objectives: Sequence[Any]) -> list[str]:
    """The run's settings that depart from its papers, in words: each objective's (its registration's
    ``beyond_paper``), then the stopping rule's (MASC's stop, §3, is a violation rate under alpha)."""
    departures = [departure for objective in objectives for departure in objective.beyond_paper(args)]
    if not (args.stop_at_target and args.probe_interval > 0):
        return departures
    if args.stop_target == "membership":
        departures.append(
            f"stop_target='membership': the run stops once a Min-K% attack reads the forget answers like never-seen "
            f"ones (AUC >= {0.5 - args.calibration_auc_slack:g}), not on the violation rate"
        )
    elif args.stop_target == "calibration":
        departures.append("stop_target='calibration': the run stops on the calibration gap, not on the violation rate")
    return departures


def build_record(
    args: Any,
    objectives: Sequence[Any],
    state: Any,
    stopping: Any,
    model: Any,
    adapter: str | None,
    datasets: dict[str, Any],
    probe_seconds: float,
    probe_seconds_by_set: dict[str, float],
    restored_step: int | None,
    wall_seconds: float | None,
    forget_fingerprint: str,
    earlier_requests: Sequence[dict[str, Any]],
    objective_state: dict[str, Any],
    exact_reproduction_bound: dict[str, float] | None = None,
    previous: UnlearnRecord | None = None,
) -> UnlearnRecord:
    """The run record. ``model`` is the unwrapped base model (its config names it); ``exact_reproduction_bound`` is
    given once, at the end of ``train()`` (it needs forward passes), which makes the record complete. Measurements
    added from outside to ``previous`` (before/after, quantization, extra) carry over."""
    forget, retain = objectives[0], objectives[1] if len(objectives) > 1 else None
    final = exact_reproduction_bound is not None
    record = UnlearnRecord(
        method=args.method,
        forget_objective=forget.name,
        retain_objective=retain.name if retain is not None else "none",
        gradient_surgery=args.gradient_surgery,
        hyperparameters=hyperparameters(args, objectives),
        papers=papers(objectives, args.gradient_surgery, getattr(args, "sam_rho", 0.0)),
        beyond_paper=beyond_paper(args, objectives),
        base_model=getattr(model.config, "_name_or_path", None) or None,
        adapter=adapter,
        stopping_rule=bool(args.stop_at_target and args.probe_interval > 0),
        stopped_early=stopping.stopped_early,
        stop_kind=stop_kind(stopping, state),
        stop_reason=stop_reason(stopping, state, args, restored_step),
        stop_step=stopping.stop_step,
        restored_step=restored_step,
        probe_seconds=probe_seconds,
        probe_seconds_by_set=dict(probe_seconds_by_set),
        global_step=state.global_step,
        max_steps=state.max_steps,
        violation_rate=stopping.last_violation_rate,
        probe_history=list(stopping.history),
        surgery_history=surgery_history(state.log_history),
        exact_reproduction_bound=exact_reproduction_bound,
        wall_seconds=wall_seconds,
        complete=final,
        forget_fingerprint=forget_fingerprint,
        finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds") if final else None,
        earlier_requests=list(earlier_requests),
        objective_state=objective_state,
        **datasets,
    )
    if previous is not None:
        record.update(
            before=previous.before,
            after=previous.after,
            evaluation=previous.evaluation,
            quantization=previous.quantization,
            extra=previous.extra,
            base_model_weights=previous.base_model_weights,
        )
    return record
