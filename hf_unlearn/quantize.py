"""Does the forgetting survive quantization? Reload the unlearned model in 4-bit and 8-bit and measure again.

Zhang et al., "Catastrophic Failure of LLM Unlearning via Quantization" (ICLR 2025): after 4-bit quantization,
knowledge that GA/NPO-style methods had "forgotten" came back (21% -> 83% retained in their study), because the
unlearning update was smaller than the quantization step. This module re-runs the forget and retain metrics on
NF4, FP4 and 8-bit reloads (bitsandbytes) and flags a forget metric that moved back towards the original.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any

import torch

from .metrics import evaluate_qa

QUANTIZATION_MODES = ("nf4", "fp4", "int8")
# A forget metric that rises by more than this after quantization counts as knowledge coming back.
RETURN_THRESHOLD = 0.05


def quantization_config(mode: str) -> Any:
    from transformers import BitsAndBytesConfig

    if mode in ("nf4", "fp4"):
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=mode, bnb_4bit_compute_dtype=torch.float32)
    if mode == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"Unknown quantization mode {mode!r}; choose from {QUANTIZATION_MODES}.")


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


def save_for_quantization(model: Any, path: str) -> str:
    """Save a full-precision copy that bitsandbytes can reload: LoRA adapters merged into the base first."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        import copy

        model = copy.deepcopy(model).merge_and_unload()
    model.save_pretrained(path)
    return path


def check_quantization_robustness(
    model_or_path: Any,
    tokenizer: Any,
    forget_records: Any,
    retain_records: Any | None = None,
    modes: tuple[str, ...] = QUANTIZATION_MODES,
    full_precision: dict | None = None,
    prompt_template: str | None = None,
) -> dict:
    """Measure forget/retain metrics in full precision and after each quantization ``mode``, with the questions in
    ``prompt_template`` (the format of fine-tuning, :mod:`hf_unlearn.prompts`).

    Returns ``{"full_precision": {...}, "nf4": {"forget": ..., "retain": ..., "change": ..., "knowledge_returned":
    bool, "quantized_layers": int}, ...}``; ``change`` is quantized minus full precision for every metric.
    """
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as scratch:
        if isinstance(model_or_path, str | os.PathLike):
            path = str(model_or_path)
            reference_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        else:
            reference_model = model_or_path
            path = save_for_quantization(model_or_path, os.path.join(scratch, "model"))
        if full_precision is None:
            full_precision = _measure(reference_model, tokenizer, forget_records, retain_records, prompt_template)
        result: dict[str, Any] = {"full_precision": full_precision}
        for mode in modes:
            # bitsandbytes warns once per 8-bit matmul that it casts fp32 inputs to fp16; that is expected here.
            logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
            quantized = AutoModelForCausalLM.from_pretrained(
                path, quantization_config=quantization_config(mode), device_map="cpu"
            )
            layers = sum(1 for m in quantized.modules() if type(m).__name__ in ("Linear4bit", "Linear8bitLt"))
            measured = _measure(quantized, tokenizer, forget_records, retain_records, prompt_template)
            change = {
                side: {
                    k: measured[side][k] - full_precision[side][k]
                    for k in ("rouge_l_recall", "probability", "exact_match")
                }
                for side in measured
            }
            returned = any(change["forget"][k] > RETURN_THRESHOLD for k in ("rouge_l_recall", "exact_match"))
            result[mode] = {**measured, "change": change, "knowledge_returned": returned, "quantized_layers": layers}
            del quantized
    return result


def _measure(
    model: Any, tokenizer: Any, forget_records: Any, retain_records: Any | None, prompt_template: str | None
) -> dict:
    measured = {"forget": evaluate_qa(model, tokenizer, forget_records, prompt_template=prompt_template)}
    if retain_records is not None:
        measured["retain"] = evaluate_qa(model, tokenizer, retain_records, prompt_template=prompt_template)
    return measured


def quantization_table(result: dict) -> str:
    """Markdown table: each metric in full precision and after each mode, with the change."""
    modes = [m for m in result if m != "full_precision"]
    lines = [
        "| split | metric | full precision | " + " | ".join(modes) + " |",
        "|---|---|---|" + "---|" * len(modes),
    ]
    for side in result["full_precision"]:
        for metric in ("rouge_l_recall", "probability", "exact_match"):
            cells = [f"{result[m][side][metric]:.3f} ({result[m]['change'][side][metric]:+.3f})" for m in modes]
            lines.append(
                f"| {side} | {metric} | {result['full_precision'][side][metric]:.3f} | " + " | ".join(cells) + " |"
            )
    flagged = [m for m in modes if result[m]["knowledge_returned"]]
    lines.append("")
    lines.append(
        f"Forgotten knowledge came back after: {', '.join(flagged)}."
        if flagged
        else "No forgotten knowledge came back after quantization (forget ROUGE-L / exact match within "
        f"+{RETURN_THRESHOLD})."
    )
    return "\n".join(lines)
