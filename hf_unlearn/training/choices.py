"""The vocabulary of :class:`~hf_unlearn.training.config.UnlearnConfig`: the methods (from the objectives'
registrations), the refusals, the allowed values of the string options, and the one error for
gradient surgery under a backend that cannot run it."""

from __future__ import annotations

import copy
import math
from typing import Any

from transformers.utils import logging

# The methods (method -> (forget objective, retain objective)) are declared by the forget objectives' registrations.
from ..objectives.registry import (
    CUSTOM_METHOD,
    FORGET_OBJECTIVES,
    METHODS,
    RETAIN_OBJECTIVES,
    resolve_hyperparameters,
    resolve_objectives,
)
from .callbacks import DEFAULT_MEMBERSHIP_AUC_SLACK
from .deprecated import merge_aliases, warn_auc_slack_with_gap

logger = logging.get_logger(__name__)

DEFAULT_REFUSALS = (
    "I don't know.",
    "I'm not sure about that.",
    "I have no information about that.",
    "That is something I cannot answer.",
)
STOP_PROBES = ("train", "holdout")
FORGET_SCORINGS = ("answer", "continuation")
STOP_TARGETS = ("auto", "alpha", "calibration", "membership")
MASC_THRESHOLDS = ("auto", "rho", "calibration")
MASC_HINGES = ("one_sided", "two_sided")
CALIBRATION_MATCHES = ("rank", "token", "prompt", "token_spread", "id_spread")
RETAIN_PROBES = ("screen", "every_probe")
CALIBRATION_REFERENCES = ("start", "current")
#: Every registered method that does not stop itself, in registration order: `hf-unlearn compare`'s baselines (MASC
#: is raced on its own).
BASELINES = [method for method, (forget, _) in METHODS.items() if not FORGET_OBJECTIVES[forget].stops_itself]


def sharded_surgery_error(strategy: str, backend: str) -> ValueError:
    """The one message for gradient surgery under a backend whose gradients it cannot reach tensor by tensor."""
    why = {
        "DeepSpeed": "DeepSpeed ZeRO moves every gradient into its own flat, partitioned buffers during the backward "
        "(param.grad stays empty), so the forget and the retain gradient cannot be kept apart per tensor",
        "FSDP1": "FSDP1 flattens each wrapped module's parameters into one FlatParameter, so per-tensor (per-module) "
        "dot products and norms are not available",
    }[backend]
    return ValueError(
        f"gradient_surgery={strategy!r} is not available with {backend}: {why}. Use FSDP2 (fsdp_config "
        "{'version': 2}, the default of transformers 5; surgery is combined shard by shard there), DDP (plain "
        "`accelerate launch` or torchrun), or gradient_surgery='sum'."
    )


def check_surgery_backend(strategy: str, deepspeed: bool, fsdp1: bool) -> None:
    """Refuse gradient surgery under DeepSpeed or FSDP1, which may come from an accelerate config rather than from
    the arguments (those are checked in ``UnlearnConfig``)."""
    if strategy != "sum" and deepspeed:
        raise sharded_surgery_error(strategy, "DeepSpeed")
    if strategy != "sum" and fsdp1:
        raise sharded_surgery_error(strategy, "FSDP1")


def resolve_method(config: Any) -> None:
    """The method group of an ``UnlearnConfig``, checked and completed in place: ``method`` (None: 'masc', or
    'custom' when ``forget_loss`` is given, logged), the objectives' declared hyperparameters
    (``forget_loss_kwargs`` / ``retain_loss_kwargs``, with the values of the deprecated aliases such as ``npo_beta``
    moved into them: a key the objective did not declare, or a bad value, is refused by name), and the
    defaults the forget objective registered for ``forget_weight``, ``retain_weight`` and ``stop_on_violation``."""
    if config.method is None:
        config.method = CUSTOM_METHOD if config.forget_loss else "masc"
        if config.forget_loss:
            logger.warning(
                f"UnlearnConfig: forget_loss={config.forget_loss!r} without a method, so method={CUSTOM_METHOD!r}: "
                f"retain objective {config.retain_loss or 'none'!r}, stop_on_violation="
                f"{bool(config.stop_on_violation)} (set method, retain_loss or stop_on_violation to choose)."
            )
    if config.method == CUSTOM_METHOD and not config.forget_loss:
        raise ValueError(f"method={CUSTOM_METHOD!r} runs the objectives you name: set forget_loss (and retain_loss).")
    if config.method not in METHODS and config.method != CUSTOM_METHOD:
        raise ValueError(f"Unknown method {config.method!r}; choose one of {sorted(METHODS)} or {CUSTOM_METHOD!r}.")
    for option in ("forget_loss_kwargs", "retain_loss_kwargs"):
        given = getattr(config, option)
        if given is not None and not isinstance(given, dict):
            raise ValueError(
                f"""{option} must be a dict or a JSON object such as '{{"scale": 0.5}}', got {given!r}."""
            )
    merge_aliases(config)  # the baselines' deprecated flags, into the kwargs
    forget, retain = config.objectives
    if forget in FORGET_OBJECTIVES and (retain in RETAIN_OBJECTIVES or retain == "none"):
        resolve_objectives(config)
    else:  # an objective registered later is checked by the trainer
        for option, name, registry in (
            ("forget_loss_kwargs", forget, FORGET_OBJECTIVES),
            ("retain_loss_kwargs", retain, RETAIN_OBJECTIVES),
        ):
            if name in registry or name == "none":
                resolve_hyperparameters(registry.get(name), getattr(config, option), option)
    objective = FORGET_OBJECTIVES.get(forget)
    if config.forget_weight is None:
        config.forget_weight = objective.forget_weight if objective is not None else 1.0
    if config.retain_weight is None:
        config.retain_weight = objective.retain_weight if objective is not None else 1.0
    if config.stop_on_violation is None:
        config.stop_on_violation = (
            config.method in METHODS and FORGET_OBJECTIVES[METHODS[config.method][0]].stops_itself
        )


#: ``masc_rival_kl``'s weight with a calibrated threshold: 5 and 10 land the demo on 3 of 3 seeds (3 on 2, 20 and 30 do
#: not stop within the budget); with the Min-K% stop, 5 is the weight that landed TOFU (docs/studies/masc_landing.md,
#: sections 4 and 13-15).
DEFAULT_MASC_RIVAL_KL = 5.0

#: What ``'auto'`` resolves to with a calibration set: the Min-K% stop (beyond the paper), measured against the
#: calibration gap's stop in docs/studies/masc_landing.md sections 12-15.
AUTO_TARGETS = {"stop_target": "membership", "masc_threshold": "calibration"}
#: 'auto' takes the Min-K% stop only when its AUC can be read to within the never-trained region's tolerance (0.1):
#: with fewer answers (one author's five, a user's ten facts) the gap decides (docs/studies/masc_landing.md, 15).
MEMBERSHIP_AUC_MAX_SPREAD = 0.1


def membership_auc_spread(forget_size: int, calibration_size: int) -> float:
    """The standard deviation of an AUC between ``forget_size`` and ``calibration_size`` scores drawn from one
    distribution (Hanley & McNeil 1982, at AUC 0.5): how finely the Min-K% stop can read 'never seen' at all."""
    return math.sqrt((forget_size + calibration_size + 1) / (12 * forget_size * calibration_size))


def resolved_for_data(
    args: Any, has_calibration: bool, forget_size: int | None = None, calibration_size: int | None = None
) -> Any:
    """A copy of ``args`` with ``stop_target`` and ``masc_threshold`` resolved for the data a trainer got ('auto':
    'membership' / 'calibration' with a calibration set, else 'alpha' / 'rho'; the stop is the gap, 'calibration',
    when ``forget_size`` forget and ``calibration_size`` calibration answers read an AUC no finer than
    :data:`MEMBERSHIP_AUC_MAX_SPREAD`), and ``masc_rival_kl`` and ``calibration_auc_slack`` for them; the caller's
    config is left as it was, so it can be reused for another run with other data. 'calibration' or 'membership'
    without a calibration set is refused."""
    if args.stop_target in ("calibration", "membership") and not has_calibration:
        raise ValueError(
            f"stop_target={args.stop_target!r} compares the forget set with data the model never trained on: pass "
            "calibration_dataset=... (same kind of examples, tokenized the same way), or stop_target='alpha'."
        )
    if args.masc_threshold == "calibration" and not has_calibration:
        raise ValueError(
            "masc_threshold='calibration' takes each token's threshold from data the model never trained on: "
            "pass calibration_dataset=..., or masc_threshold='rho'."
        )
    resolved = copy.copy(args)
    spread = membership_auc_spread(forget_size, calibration_size) if forget_size and calibration_size else 0.0
    too_few = spread > MEMBERSHIP_AUC_MAX_SPREAD
    # The paper's threshold asked for by name is the paper's mode, whole: its stop is the violation rate too, and
    # it reads no calibration set (arXiv 2606.02920 §3).
    paper_mode = args.masc_threshold == "rho"
    for name, plain in (("stop_target", "alpha"), ("masc_threshold", "rho")):
        if getattr(args, name) == "auto":
            calibrated = "calibration" if name == "stop_target" and too_few else AUTO_TARGETS[name]
            setattr(resolved, name, calibrated if has_calibration and not paper_mode else plain)
            logger.info(f"UnlearnTrainer: {name}='auto' resolved to {getattr(resolved, name)!r}.")
    if args.stop_target == "auto" and has_calibration and too_few and not paper_mode:
        logger.warning(
            f"UnlearnTrainer: stop_target='auto' resolved to 'calibration' (the calibration gap), not the Min-K% stop "
            f"('membership'): {forget_size} forget and {calibration_size} calibration answers read its AUC only to "
            f"±{spread:.2f}, wider than {MEMBERSHIP_AUC_MAX_SPREAD}. More of either (or stop_target='membership') "
            "changes that."
        )
    if resolved.stop_target == "calibration" and args.stop_target == "auto" and args.calibration_auc_slack is not None:
        warn_auc_slack_with_gap()  # 'auto' took the gap: the slack becomes its retired second condition
    if resolved.stop_target == "membership" and args.calibration_auc_slack is None:
        resolved.calibration_auc_slack = DEFAULT_MEMBERSHIP_AUC_SLACK
        logger.info(f"UnlearnTrainer: calibration_auc_slack=None resolved to {DEFAULT_MEMBERSHIP_AUC_SLACK}.")
    if args.masc_rival_kl is None:
        # Measured with the calibrated threshold only (docs/studies/masc_landing.md, section 4); the paper's fixed tau
        # pushes every margin below it, which the KL slows by far (the paper's mode stays the paper's).
        resolved.masc_rival_kl = DEFAULT_MASC_RIVAL_KL if resolved.masc_threshold == "calibration" else 0.0
        if resolved.objectives[0] == "masc":
            logger.info(f"UnlearnTrainer: masc_rival_kl=None resolved to {resolved.masc_rival_kl}.")
    return resolved


__all__ = [
    "BASELINES",
    "CALIBRATION_MATCHES",
    "CALIBRATION_REFERENCES",
    "CUSTOM_METHOD",
    "DEFAULT_MASC_RIVAL_KL",
    "MEMBERSHIP_AUC_MAX_SPREAD",
    "DEFAULT_REFUSALS",
    "FORGET_OBJECTIVES",
    "FORGET_SCORINGS",
    "MASC_HINGES",
    "MASC_THRESHOLDS",
    "METHODS",
    "RETAIN_PROBES",
    "STOP_PROBES",
    "STOP_TARGETS",
    "check_surgery_backend",
    "membership_auc_spread",
    "resolve_method",
    "resolved_for_data",
    "sharded_surgery_error",
]
