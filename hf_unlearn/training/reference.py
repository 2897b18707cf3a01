"""The frozen reference model (the start of unlearning) and its placement next to the trained model.

NPO, the KL retain term, IdkDPO, UNDIAL and MASC's teacher competitors compare the trained model with the model before
unlearning. For a PEFT model that is the base with its adapters disabled (no copy); otherwise a frozen copy made before
training, placed like the trained model: sharded with the same plan under FSDP2, partitioned by an inference-only
DeepSpeed engine under ZeRO-3 (TRL's ``prepare_deepspeed``/``prepare_fsdp`` recipe, written anew), whole on the device
otherwise.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers.utils import logging

logger = logging.get_logger(__name__)

# Placeholder for a reference copy of a ZeRO-3-partitioned model, made once DeepSpeed is set up.
ZERO3_COPY = nn.Identity()


def zero3_partitioned(model: nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 partitioned the model's weights (loaded under zero.Init, or prepared)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def zero_stage(accelerator: Any) -> int | None:
    """The DeepSpeed ZeRO stage the accelerator runs, or ``None`` without DeepSpeed."""
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return None if plugin is None else int(plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0))


def frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy for the reference model that really runs on its own weights.

    A model that went through another Trainer (e.g. SFTTrainer) can carry a ``forward`` patched onto the
    instance and bound to the original object; deep-copying keeps that binding, so the "copy" would silently
    compute with the weights being trained. Dropping instance-level forwards restores the class's forward.
    """
    reference = copy.deepcopy(model)
    for module in reference.modules():
        module.__dict__.pop("forward", None)
    return reference


def make_reference(model: nn.Module, is_peft: bool, reference_dtype: str | None) -> nn.Module | None:
    """The reference an objective that needs one gets by default, before Trainer is set up: ``None`` for a PEFT
    model (its base with the adapters off), :data:`ZERO3_COPY` for weights ZeRO-3 partitioned at load time (they
    cannot be deep-copied; :func:`prepare_reference` copies them partition-wise), else a frozen copy, in
    ``reference_dtype`` when given (half the memory for full fine-tuning; the objectives upcast its logits)."""
    if is_peft:
        if reference_dtype is not None:
            logger.warning(
                "UnlearnTrainer: reference_dtype is ignored for a PEFT model, whose reference is its own base "
                "with the adapters off (no copy is made)."
            )
        return None
    if zero3_partitioned(model):
        return ZERO3_COPY
    reference = frozen_copy(model)
    if reference_dtype is not None:
        reference.to(getattr(torch, reference_dtype))
    return reference


def zero3_copy(model: nn.Module, accelerator: Any, reference_dtype: str | None = None) -> nn.Module:
    """A copy of a model whose weights ZeRO-3 partitioned at load time: the same class built under ``zero.Init``
    (partitioned from the start) and filled one gathered parameter at a time, so no process ever holds two whole
    models. (A deep copy would copy the empty placeholders.)"""
    import deepspeed
    from transformers.integrations import is_deepspeed_zero3_enabled

    dtype = getattr(torch, reference_dtype) if reference_dtype else next(model.parameters()).dtype
    if is_deepspeed_zero3_enabled():  # transformers builds it under zero.Init itself (and skips the random init)
        reference = model.__class__._from_config(model.config, dtype=dtype)
    else:
        with deepspeed.zero.Init(config_dict_or_path=accelerator.state.deepspeed_plugin.deepspeed_config):
            reference = model.__class__._from_config(model.config, dtype=dtype)
    with torch.no_grad():
        for source, target in zip(model.parameters(), reference.parameters(), strict=True):
            with deepspeed.zero.GatheredParameters([source, target], modifier_rank=0):
                target.data.copy_(source.data)
    return reference


def deepspeed_reference(reference: nn.Module, accelerator: Any) -> nn.Module:
    """A frozen reference partitioned by ZeRO-3 like the trained model, through an inference-only DeepSpeed engine
    (the way TRL prepares reference models): the training configuration without optimizer or scheduler, and the
    size-dependent settings left 'auto' set from the model's hidden size (DeepSpeed rejects 'auto')."""
    import deepspeed

    config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    for section in ("optimizer", "scheduler"):
        config.pop(section, None)
    zero = config.setdefault("zero_optimization", {})
    hidden = getattr(getattr(reference, "config", None), "hidden_size", None) or 1024
    sizes = {
        "reduce_bucket_size": hidden * hidden,
        "stage3_param_persistence_threshold": 10 * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
    }
    for key, value in sizes.items():
        if zero.get(key, "auto") == "auto":
            zero[key] = value
    zero.pop("offload_optimizer", None)
    config = {key: value for key, value in config.items() if value != "auto"}
    config.setdefault("train_micro_batch_size_per_gpu", 1)
    engine, *_ = deepspeed.initialize(model=reference, config=config)
    return engine


def prepare_reference(
    reference: nn.Module,
    trained: nn.Module,
    accelerator: Any,
    device: torch.device,
    fsdp2: bool,
    zero3: bool,
    reference_dtype: str | None,
) -> nn.Module:
    """The separate frozen reference, placed like the trained model (``trained``, unwrapped): under FSDP2 sharded
    with the same plan (every process holds its shards and gathers a layer at a time); under DeepSpeed ZeRO-3
    partitioned by an inference-only engine; otherwise whole on ``device``."""
    if fsdp2 and reference is not ZERO3_COPY:
        from accelerate.utils.fsdp_utils import fsdp2_prepare_model

        # No .to(device) first: fully_shard moves each process's shards itself (and with
        # cpu_ram_efficient_loading the weights of ranks > 0 are on the meta device until rank 0's are broadcast).
        reference = fsdp2_prepare_model(accelerator, reference)
    elif zero3:
        if reference is ZERO3_COPY:
            reference = zero3_copy(trained, accelerator, reference_dtype)
        reference = deepspeed_reference(reference, accelerator)
    elif reference is ZERO3_COPY:
        raise ValueError(
            "The model's weights are partitioned by DeepSpeed ZeRO-3 (loaded under zero.Init), but this Trainer "
            "does not run ZeRO-3: pass the same DeepSpeed configuration (deepspeed=... or the accelerate config) "
            "that was active when the model was loaded."
        )
    else:
        reference = reference.to(device)
    reference.eval()  # (DeepSpeed's engine returns None here)
    reference.requires_grad_(False)
    return reference


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """A PEFT model with its adapters disabled and in eval mode: the frozen start model without a copy."""
    was_training = model.training
    model.eval()
    try:
        with model.disable_adapter():
            yield model
    finally:
        model.train(was_training)
