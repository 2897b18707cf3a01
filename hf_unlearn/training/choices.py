"""The vocabulary of :class:`~hf_unlearn.training.config.UnlearnConfig`: the methods (from the objectives'
registrations), the allowed values of the string options, and the one error for
gradient surgery under a backend that cannot run it. MASC's own options are in
:mod:`hf_unlearn.objectives.masc.options`."""

from __future__ import annotations

from typing import Any

from transformers.utils import logging

# The methods (method -> (forget objective, retain objective)) are declared by the forget objectives' registrations.
from ..objectives.registry import (
    CUSTOM_METHOD,
    DEFAULT_REFUSALS,
    FORGET_OBJECTIVES,
    METHODS,
    RETAIN_OBJECTIVES,
    resolve_hyperparameters,
    resolve_objectives,
)

logger = logging.get_logger(__name__)

FORGET_SCORINGS = ("answer", "continuation")
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
    (``forget_loss_kwargs`` / ``retain_loss_kwargs``: a key the objective did not declare, or a bad value, is
    refused by name), and the
    defaults the forget objective registered for ``forget_weight``, ``retain_weight`` and ``stop_at_target``."""
    if config.method is None:
        config.method = CUSTOM_METHOD if config.forget_loss else "masc"
        if config.forget_loss:
            logger.warning(
                f"UnlearnConfig: forget_loss={config.forget_loss!r} without a method, so method={CUSTOM_METHOD!r}: "
                f"retain objective {config.retain_loss or 'none'!r}, stop_at_target="
                f"{bool(config.stop_at_target)} (set method, retain_loss or stop_at_target to choose)."
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
    if config.stop_at_target is None:
        config.stop_at_target = config.method in METHODS and FORGET_OBJECTIVES[METHODS[config.method][0]].stops_itself


__all__ = [
    "BASELINES",
    "CUSTOM_METHOD",
    "DEFAULT_REFUSALS",
    "FORGET_OBJECTIVES",
    "FORGET_SCORINGS",
    "METHODS",
    "check_surgery_backend",
    "resolve_method",
    "sharded_surgery_error",
]
