"""What an unlearning run holds in memory, per parameter: predicted from the settings, and counted on a live trainer.

The prediction follows what :class:`~hf_unlearn.training.trainer.UnlearnTrainer` allocates: the weights; for every
trainable parameter a gradient and AdamW's two moments (PyTorch keeps them in the parameter's dtype); with gradient
surgery a second gradient buffer (the forget gradient, kept while ``p.grad`` holds the retain one); and, when the
objectives compare with the start model (KL, NPO, ...) in full fine-tuning, a frozen reference copy
(``reference_dtype``). With LoRA/QLoRA the reference is the base with the adapters off and costs nothing. FSDP2 and
ZeRO-3 divide all of it by the number of processes. Activations, the probe's forwards and the allocator's slack are
not included: they depend on batch and sequence length, and are what the measured peaks add on top.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from transformers import TrainerCallback

#: Bytes per element of the dtypes a run can hold, by name.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: bitsandbytes NF4 (QLoRA): half a byte per weight plus one fp32 absmax per block of 64 (without double quantization).
NF4_BYTES = 0.5 + 4 / 64


@dataclass
class StateBytes:
    """Bytes held for the run, by kind (each the total over processes' shares of one process)."""

    weights: float = 0.0
    gradients: float = 0.0
    optimizer: float = 0.0
    reference: float = 0.0
    surgery: float = 0.0

    @property
    def total(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.reference + self.surgery

    def as_dict(self) -> dict[str, float]:
        return {**asdict(self), "total": self.total}


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """The model's parameters split as QLoRA quantizes them: ``linear`` (weights of ``nn.Linear`` layers inside the
    decoder, which bitsandbytes stores in 4 bits) and ``other`` (embeddings, norms, the output head, biases).
    Works on a model built on the meta device, so large architectures can be counted without their memory."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = 0
    for module in model.modules():
        if isinstance(module, nn.Linear) and module is not head:
            linear += module.weight.numel()
    total = sum(p.numel() for p in model.parameters())
    return {"linear": linear, "other": total - linear, "total": total}


def lora_parameter_count(model: nn.Module, r: int, target_modules: list[str] | None = None) -> int:
    """Parameters of LoRA adapters of rank ``r`` on the model's decoder ``nn.Linear`` layers (all of them, or
    those whose name ends with one of ``target_modules``): r x (in + out) each."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    count = 0
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or module is head:
            continue
        if target_modules and not any(name.endswith(target) for target in target_modules):
            continue
        count += r * (module.in_features + module.out_features)
    return count


def predicted_state_bytes(
    counts: dict[str, int],
    adapter: str = "full",
    dtype: str = "float32",
    surgery: bool = False,
    needs_reference: bool = True,
    reference_dtype: str | None = None,
    lora_parameters: int = 0,
    processes: int = 1,
    sharded: bool = False,
) -> StateBytes:
    """Bytes one process holds for a run (see the module docstring), from the parameter counts of
    :func:`parameter_counts`. ``adapter``: "full", "lora" or "qlora" (``lora_parameters`` trainable, kept in
    ``dtype``; QLoRA's decoder linear weights in NF4). ``sharded``: FSDP2 / ZeRO-3 over ``processes``."""
    if adapter not in ("full", "lora", "qlora"):
        raise ValueError(f"adapter must be 'full', 'lora' or 'qlora', got {adapter!r}.")
    width = DTYPE_BYTES[dtype]
    # PEFT keeps adapter weights in float32 whatever the base dtype (autocast_adapter_dtype), so their gradients
    # and moments are float32 too.
    trainable_width = width if adapter == "full" else DTYPE_BYTES["float32"]
    if adapter == "qlora":
        weights = counts["linear"] * NF4_BYTES + counts["other"] * width + lora_parameters * trainable_width
    else:
        weights = counts["total"] * width + (lora_parameters * trainable_width if adapter == "lora" else 0)
    trainable = counts["total"] if adapter == "full" else lora_parameters
    state = StateBytes(
        weights=weights,
        gradients=trainable * trainable_width,
        optimizer=2 * trainable * trainable_width,
        reference=(
            counts["total"] * DTYPE_BYTES[reference_dtype or dtype] if adapter == "full" and needs_reference else 0
        ),
        surgery=trainable * trainable_width if surgery else 0,
    )
    if sharded and processes > 1:
        state = StateBytes(**{key: value / processes for key, value in asdict(state).items()})
    return state


def _tensor_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def measured_state_bytes(trainer: Any) -> StateBytes:
    """Bytes this process holds for ``trainer`` right now, counted tensor by tensor: the model's parameters (a
    4-bit weight at its packed size), their gradients, the optimizer's state tensors, a separate reference model's
    parameters, and the stored forget gradients of gradient surgery. Shared storage (tied weights) counts once."""
    seen: set[tuple[int, int]] = set()

    def count(tensors: Any) -> int:
        total = 0
        for tensor in tensors:
            if tensor is None or not isinstance(tensor, torch.Tensor):
                continue
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            # The same memory counts once (tied weights); views into one buffer at different places count each
            # (FSDP2 keeps a unit's sharded gradients as views of one flat buffer).
            key = (local.data_ptr(), local.numel()) if local.numel() else (id(local), 0)
            if key in seen:
                continue
            seen.add(key)
            total += _tensor_bytes(local)
        return total

    model = trainer.accelerator.unwrap_model(trainer.model)
    params = list(model.parameters())
    # A 4-bit weight's block scales live beside it (bitsandbytes' quant_state), not as a parameter.
    scales = [getattr(getattr(p, "quant_state", None), "absmax", None) for p in params]
    optimizer = trainer.optimizer
    optimizer_tensors = []
    if optimizer is not None:
        for state in optimizer.state.values():
            optimizer_tensors.extend(value for value in state.values() if torch.is_tensor(value) and value.dim() > 0)
    reference = trainer.ref_model
    return StateBytes(
        weights=count(params) + count(scales),
        gradients=count(p.grad for p in params),
        optimizer=count(optimizer_tensors),
        reference=count(reference.parameters()) if isinstance(reference, nn.Module) else 0,
        surgery=count(trainer.surgery.stored if hasattr(trainer, "surgery") else []),
    )


class StateBytesCallback(TrainerCallback):
    """Counts :func:`measured_state_bytes` just before each optimizer step, when the gradients (and surgery's
    buffer) are all held at once, and keeps the largest count in ``peak``. Add it with ``trainer.add_callback``."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.peak: StateBytes | None = None

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        measured = measured_state_bytes(self.trainer)
        if self.peak is None or measured.total > self.peak.total:
            self.peak = measured


__all__ = [
    "StateBytesCallback",
    "DTYPE_BYTES",
    "NF4_BYTES",
    "StateBytes",
    "lora_parameter_count",
    "measured_state_bytes",
    "parameter_counts",
    "predicted_state_bytes",
]
