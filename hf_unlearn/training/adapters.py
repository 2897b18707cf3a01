"""The LoRA adapter the commands and the embedded benchmarks build (PEFT's ``LoraConfig``): alpha = 2 r, as in the MASC
reference runs (r 16, alpha 32, dropout 0.05 on q, k, v, o; arXiv 2606.02920 §5); the other PEFT helpers, and the model
as the trainer trains it (:func:`prepare_model`)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def is_peft_model(model: Any) -> bool:
    """Whether ``model`` is a PEFT model (adapters on a base); False when PEFT is not installed."""
    from transformers.utils import is_peft_available

    if not is_peft_available():  # pragma: no cover - peft is a dependency, kept optional for users who strip it
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def lora_config(rank: int, target_modules: Any = DEFAULT_LORA_TARGETS, dropout: float = 0.05) -> Any:
    """A causal-LM LoRA adapter of ``rank`` on ``target_modules`` (a list of names, or ``"all-linear"``), or ``None``
    for full fine-tuning (rank 0). ``dropout`` 0 keeps training-mode forwards deterministic (the running probe needs
    that)."""
    if rank <= 0:
        return None
    from peft import LoraConfig

    modules = list(target_modules) if isinstance(target_modules, (list, tuple)) else target_modules
    return LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=dropout, target_modules=modules, task_type="CAUSAL_LM")


@contextmanager
def without_checkpointing_warning() -> Iterator[None]:
    """Without the FutureWarning transformers raises when PEFT reads the deprecated ``is_gradient_checkpointing``
    property of a model (PEFT's own call, on every wrap and every adapter load; nothing a user can change)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
        yield


def with_adapter(model: Any, peft_config: Any) -> Any:
    """``peft.get_peft_model(model, peft_config)`` (:func:`without_checkpointing_warning`)."""
    from peft import get_peft_model

    with without_checkpointing_warning():
        return get_peft_model(model, peft_config)


def load_adapter(model: Any, folder: str) -> Any:
    """``peft.PeftModel.from_pretrained(model, folder)``: the adapter saved in ``folder`` on ``model``
    (:func:`without_checkpointing_warning`)."""
    from peft import PeftModel

    with without_checkpointing_warning():
        return PeftModel.from_pretrained(model, folder)


def check_causal_lm(model: Any) -> None:
    """Refuse, before anything else, a model name instead of a model and a model without a language-modelling head."""
    if isinstance(model, str):
        raise TypeError("Pass a loaded model; load it with AutoModelForCausalLM.from_pretrained(...) first.")
    if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
        raise ValueError(
            f"{type(model).__name__} has no language-modelling head: unlearning needs a causal LM "
            "(AutoModelForCausalLM)."
        )


def keep_4bit_layers_trainable(model: Any) -> int:
    """Stop bitsandbytes' CPU inference repacking of 4-bit weights, and undo it where it already happened.

    On CPUs with AVX512-BF16, bitsandbytes (0.50) repacks a ``Linear4bit`` weight into an inference-only layout on
    the first forward in eval mode (a probe, an evaluation, the reference pass); its kernel has no backward, so
    every later training step would silently get no gradient through those layers (QLoRA adapters below them stop
    learning). Returns the number of layers touched.
    """
    touched = 0
    for module in model.modules():
        if not hasattr(module, "support_avx512bf16_for_cpu"):
            continue
        module.support_avx512bf16_for_cpu = False
        state = getattr(module.weight, "quant_state", None)
        if state is not None and getattr(state, "packing_format_for_cpu", False):
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

            module.weight.data, module.weight.quant_state = _convert_weight_packed_for_cpu_inverse(
                module.weight.data, state
            )
        touched += 1
    return touched


def prepare_model(model: Any, args: Any, peft_config: Any, objectives: list[Any]) -> Any:
    """The model as it trains: each objective's preparation (RMU freezes all but some layers), the PEFT wrapper for
    ``peft_config``, trainable 4-bit layers; refused when nothing can change."""
    for objective in objectives:
        if objective.prepare is not None:
            objective.prepare(model, args)
    if peft_config is not None:
        if is_peft_model(model):
            raise ValueError("The model is already a PEFT model; pass peft_config=None or the base model.")
        model = with_adapter(model, peft_config)
    if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_quantized", False):
        keep_4bit_layers_trainable(model)
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError("The model has no trainable parameters (all requires_grad=False): nothing can change.")
    return model
