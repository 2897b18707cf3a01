"""The checks of :class:`~hf_unlearn.training.config.UnlearnConfig`, one function per group of parameters its docstring
names, called from its ``__post_init__``. Each refuses a bad value with an error naming the field, and fills in the
defaults that depend on other fields. The budgets and the distributed backends are checked before
``TrainingArguments.__post_init__`` reads them; everything else after it."""

from __future__ import annotations

import json
import os
from typing import Any

from transformers.utils import logging

from ..data.pairing import continuation_options
from ..objectives.registry import check_one_of
from ..surgery.combine import STRATEGIES
from .choices import FORGET_SCORINGS, resolve_method, sharded_surgery_error
from .sharpness import check_sam_config

logger = logging.get_logger(__name__)


def fsdp_version(fsdp_config: Any) -> int:
    """The FSDP version an fsdp_config asks for (a dict or a JSON file; transformers' default is 2)."""
    if isinstance(fsdp_config, str) and os.path.isfile(fsdp_config):
        with open(fsdp_config) as f:
            fsdp_config = json.load(f)
    if not isinstance(fsdp_config, dict):
        return 2
    return int(fsdp_config.get("version", fsdp_config.get("fsdp_version", 2)))


def check_backends(config: Any) -> None:
    """Gradient surgery and ``sam_rho`` under DeepSpeed or FSDP1, checked before TrainingArguments sets up either
    backend, so the message names the real conflict (a backend chosen by an accelerate config file is checked by the
    trainer)."""
    if config.gradient_surgery != "sum" and config.deepspeed:
        raise sharded_surgery_error(config.gradient_surgery, "DeepSpeed")
    if config.gradient_surgery != "sum" and config.fsdp and fsdp_version(config.fsdp_config) == 1:
        raise sharded_surgery_error(config.gradient_surgery, "FSDP1")
    check_sam_config(config)


def check_budget(config: Any) -> None:
    """Budgets, checked before TrainingArguments reads them: Trainer would take one step for max_steps=0 and save an
    untouched copy for zero epochs."""
    if config.max_steps == 0 or (config.max_steps < -1):
        raise ValueError(
            f"max_steps={config.max_steps} is not a budget: give a positive number of optimizer steps, or -1 (the "
            "default) to budget by num_train_epochs."
        )
    if config.self_stop_max_steps < 1:
        raise ValueError(f"self_stop_max_steps must be a positive number of steps, got {config.self_stop_max_steps}.")
    if config.num_train_epochs is not None and not config.num_train_epochs > 0 and config.max_steps < 0:
        raise ValueError(
            f"num_train_epochs={config.num_train_epochs} would train nothing: give a positive number of epochs, or "
            "max_steps."
        )


def check_method(config: Any) -> None:
    """The method group: the method and objectives resolved (:func:`~hf_unlearn.training.choices.resolve_method`),
    the weights, the reference's dtype."""
    resolve_method(config)
    for name in ("forget_weight", "retain_weight"):
        value = getattr(config, name)
        if value is not None and not value >= 0:  # also catches NaN
            raise ValueError(
                f"{name} must be >= 0, got {value}: it scales a loss that is minimised, so a negative weight "
                "would train the opposite of what the objective means."
            )
    if not config.reference_cache_gb >= 0:
        raise ValueError(f"reference_cache_gb must be >= 0 (GiB of host memory), got {config.reference_cache_gb!r}.")
    if config.reference_dtype not in (None, "bfloat16", "float16", "float32"):
        raise ValueError(
            f"reference_dtype must be None, 'bfloat16', 'float16' or 'float32', got {config.reference_dtype!r}."
        )


def check_gradients(config: Any) -> None:
    """How the forget and retain gradients combine: a known strategy, and a retain gradient for surgery."""
    check_one_of(config, (("gradient_surgery", STRATEGIES),))
    if config.gradient_surgery != "sum" and config.objectives[1] == "none":
        raise ValueError(
            f"gradient_surgery={config.gradient_surgery!r} combines a forget and a retain gradient, but the "
            "retain objective is 'none'. Set retain_loss='nll' or 'kl', or gradient_surgery='sum'."
        )


def check_forget_scoring(config: Any) -> None:
    """Which forget tokens are scored, and continuation scoring's cut."""
    check_one_of(config, (("forget_scoring", FORGET_SCORINGS),))
    given = config.forget_scoring_kwargs
    if given is not None and not isinstance(given, dict):
        raise ValueError(
            f"""forget_scoring_kwargs must be a dict or a JSON object such as '{{"min_prefix_tokens": 8}}', got """
            f"{given!r}."
        )
    continuation_options(config.forget_scoring_kwargs)


def check_outputs(config: Any) -> None:
    """A Hub push during the run: ``push_to_hub`` with a ``hub_strategy`` other than ``'end'`` uploads checkpoints
    while the run goes on, before anything has judged whether the forget set was forgotten, which the trainer's own
    ``push_to_hub`` refuses without ``push_unverified``."""
    if config.push_to_hub and config.hub_strategy != "end" and not config.push_unverified:
        strategy = getattr(config.hub_strategy, "value", config.hub_strategy)
        raise ValueError(
            f"push_to_hub=True with hub_strategy={strategy!r} uploads checkpoints during the run, before anything "
            "has judged whether the forget set was forgotten. Use hub_strategy='end' (save_model and push_to_hub "
            "then push once, after checking the run's record), or push_unverified=True to publish unjudged weights."
        )


def complete_budget(config: Any) -> None:
    """``num_train_epochs=None``: 3 epochs, or for a run that stops itself without ``max_steps``,
    ``max_steps = self_stop_max_steps``."""
    if config.num_train_epochs is None:
        config.num_train_epochs = 3.0
        if config.stop_at_target and config.max_steps <= 0:
            # A run that stops itself needs room to get there: 3 epochs of a 10-example forget set are 9 steps.
            config.max_steps = config.self_stop_max_steps
            logger.info(
                f"UnlearnConfig: the run stops itself, so its budget is max_steps={config.max_steps} "
                "(self_stop_max_steps) rather than 3 epochs."
            )
