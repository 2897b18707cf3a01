"""Does the forgetting survive quantization? Reload the unlearned model in 4-bit and 8-bit and measure again.

Zhang et al., "Catastrophic Failure of LLM Unlearning via Quantization" (ICLR 2025): after 4-bit quantization,
knowledge that GA/NPO-style methods had "forgotten" came back (21% -> 83% retained in their study), because the
unlearning update was smaller than the quantization step. This module re-runs the forget and retain metrics on
NF4, FP4 and 8-bit reloads (bitsandbytes) and flags a forget metric that moved back towards the original.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers.utils import logging

from ..evaluation.metrics import evaluate_qa
from ..training.adapters import keep_4bit_layers_trainable

logger = logging.get_logger(__name__)

QUANTIZATION_MODES = ("nf4", "fp4", "int8")
# A forget metric that rises by more than this after quantization counts as knowledge coming back.
RETURN_THRESHOLD = 0.05
#: A mode that quantized fewer than this share of the linear layers (outside transformers' default list, the output
#: embedding) measured a mostly full-precision model: it is "not measured", never "passed".
MIN_QUANTIZED_SHARE = 0.5
# bitsandbytes' 4-bit inference layout for CPUs with AVX-512 BF16 packs output features in blocks of 32 and regroups
# each row's quantization scales, one per block of 64 input features (its 4-bit blocksize); it converts at the first
# eval-mode forward without gradients and fails there on any other shape (bitsandbytes 0.49-0.50).
CPU_PACKING_OUT_MULTIPLE = 32
CPU_PACKING_IN_MULTIPLE = 64
CPU_PACKING_REASON = (
    f"bitsandbytes' 4-bit CPU kernel for AVX-512 BF16 needs out features in multiples of {CPU_PACKING_OUT_MULTIPLE} "
    f"and in features in multiples of {CPU_PACKING_IN_MULTIPLE}"
)


def quantization_config(mode: str, skip_modules: list[str] | None = None) -> Any:
    """bitsandbytes' config for ``mode``; ``skip_modules`` (full module names) stay in full precision, in place of
    transformers' default list (the output embedding), so pass that too (:func:`modules_to_keep_for_cpu`)."""
    from transformers import BitsAndBytesConfig

    if mode in ("nf4", "fp4"):
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=mode,
            bnb_4bit_compute_dtype=torch.float32,
            llm_int8_skip_modules=skip_modules,
        )
    if mode == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    raise ValueError(f"Unknown quantization mode {mode!r}; choose from {QUANTIZATION_MODES}.")


def repacks_4bit_on_this_cpu() -> bool:
    """Whether bitsandbytes repacks 4-bit weights into its AVX-512 BF16 inference layout on this CPU."""
    try:
        from bitsandbytes.functional import has_avx512bf16
    except ImportError:  # no bitsandbytes, or one without that kernel
        return False
    return bool(has_avx512bf16())


def linear_layers(config: Any) -> tuple[list[str], dict[str, list[int]]]:
    """transformers' default list of modules kept in full precision for a model of ``config`` (the output
    embedding), and the ``[out, in]`` shape of every other linear layer: the layers bitsandbytes quantizes. Built on
    the meta device (no weights are read)."""
    from transformers import AutoModelForCausalLM
    from transformers.pytorch_utils import Conv1D
    from transformers.quantizers.base import get_keys_to_not_convert

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    default = get_keys_to_not_convert(model)
    shapes: dict[str, list[int]] = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear):
            out_features, in_features = module.out_features, module.in_features
        elif isinstance(module, Conv1D):  # GPT-2's transposed linear layers
            in_features, out_features = module.weight.shape
        else:
            continue
        if not any(name == key or name.startswith(key + ".") for key in default):
            shapes[name] = [out_features, in_features]
    return default, shapes


def modules_to_keep_for_cpu(config: Any, avx512_bf16: bool | None = None) -> tuple[list[str], dict[str, list[int]]]:
    """For a model of ``config`` quantized to 4 bits on this CPU: the modules to keep in full precision, and of those
    the ones kept only because their shape does not fit bitsandbytes' CPU layout (``{name: [out, in]}``).

    On a CPU with AVX-512 BF16, bitsandbytes fails (``N must be divisible by block_n``, or a reshape error) in the
    first forward of a layer whose shape its inference layout cannot hold (:data:`CPU_PACKING_REASON`); such layers
    are kept in full precision through bitsandbytes' own skip list. Elsewhere (other CPUs, GPUs) nothing is added to
    transformers' default list. ``avx512_bf16`` says whether that rule applies; ``None``: as on this CPU
    (:func:`repacks_4bit_on_this_cpu`)."""
    default, shapes = linear_layers(config)
    if avx512_bf16 is None:
        avx512_bf16 = repacks_4bit_on_this_cpu()
    unfit = {
        name: shape
        for name, shape in shapes.items()
        if avx512_bf16 and (shape[0] % CPU_PACKING_OUT_MULTIPLE or shape[1] % CPU_PACKING_IN_MULTIPLE)
    }
    return sorted(set(default) | set(unfit)), unfit


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
    avx512_bf16: bool | None = None,
) -> dict:
    """Measure forget/retain metrics in full precision and after each quantization ``mode``, with the questions in
    ``prompt_template`` (the format of fine-tuning, :mod:`hf_unlearn.data.prompts`). ``avx512_bf16``: whether the
    4-bit models keep the layers that bitsandbytes' AVX-512 BF16 CPU kernel cannot pack in full precision
    (:func:`modules_to_keep_for_cpu`); ``None``: as this CPU needs.

    Returns ``{"full_precision": {...}, "nf4": {"forget": ..., "retain": ..., "change": ..., "knowledge_returned":
    bool | None, "quantized_layers": int, "linear_layers": int, "measured": bool}, ...}``; ``change`` is quantized
    minus full precision for every metric. A mode that quantized fewer than :data:`MIN_QUANTIZED_SHARE` of the
    linear layers is not measured (``"not_measured"`` says why) and its ``knowledge_returned`` is ``None``.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

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
        saved_config = AutoConfig.from_pretrained(path)
        skip, unfit = modules_to_keep_for_cpu(saved_config, avx512_bf16)
        linear = len(linear_layers(saved_config)[1])
        # bitsandbytes quantizes 16- and 32-bit weights; a float64 model is quantized from its float32 rounding.
        load_dtype = {"dtype": torch.float32} if _saved_dtype(saved_config) == torch.float64 else {}
        if unfit and any(mode in ("nf4", "fp4") for mode in modes):
            logger.warning(
                f"Quantization check: {len(unfit)} layer(s) stay in full precision in the 4-bit models, "
                f"because {CPU_PACKING_REASON}: "
                + ", ".join(f"{name} ({out} x {inp})" for name, (out, inp) in unfit.items())
                + ". On a GPU or a CPU without AVX-512 BF16 they are quantized too."
            )
        for mode in modes:
            four_bit = mode in ("nf4", "fp4")
            with _quiet_8bit_casts():
                quantized = AutoModelForCausalLM.from_pretrained(
                    path,
                    quantization_config=quantization_config(mode, skip if four_bit and unfit else None),
                    device_map="cpu",
                    **load_dtype,
                )
                layers = sum(1 for m in quantized.modules() if type(m).__name__ in ("Linear4bit", "Linear8bitLt"))
                measured = _measure(quantized, tokenizer, forget_records, retain_records, prompt_template)
            del quantized
            result[mode] = {**measured, **_judged(measured, full_precision, layers, linear)}
            if four_bit and unfit:
                result[mode]["kept_in_full_precision"] = {"modules": unfit, "reason": CPU_PACKING_REASON}
                if not result[mode]["measured"]:
                    result[mode]["not_measured"] += (
                        f"; the others stayed in full precision, because {CPU_PACKING_REASON}"
                    )
            if not result[mode]["measured"]:
                logger.warning(f"Quantization check: {mode} not measured: {result[mode]['not_measured']}.")
    return result


def _judged(measured: dict, full_precision: dict, layers: int, linear: int) -> dict[str, Any]:
    """The change of every metric, the layer counts, and whether knowledge came back: ``None`` (not measured) when
    fewer than :data:`MIN_QUANTIZED_SHARE` of the ``linear`` layers were quantized."""
    change = {
        side: {
            k: measured[side][k] - full_precision[side][k] for k in ("rouge_l_recall", "probability", "exact_match")
        }
        for side in measured
    }
    judged: dict[str, Any] = {"change": change, "quantized_layers": layers, "linear_layers": linear}
    if layers == 0 or layers < MIN_QUANTIZED_SHARE * linear:
        judged.update(
            measured=False,
            knowledge_returned=None,
            not_measured=f"only {layers} of {linear} linear layers were quantized (fewer than "
            f"{MIN_QUANTIZED_SHARE:.0%})",
        )
    else:
        returned = any(change["forget"][k] > RETURN_THRESHOLD for k in ("rouge_l_recall", "exact_match"))
        judged.update(measured=True, knowledge_returned=returned)
    return judged


def _saved_dtype(config: Any) -> torch.dtype | None:
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    return getattr(torch, dtype) if isinstance(dtype, str) else dtype


@contextmanager
def _quiet_8bit_casts() -> Iterator[None]:
    """bitsandbytes warns at every 8-bit matmul that it casts float32 inputs to float16, as expected here: silence
    its logger for the check only, and give it back its level afterwards."""
    import logging as std_logging

    bnb_logger = std_logging.getLogger("bitsandbytes")
    level = bnb_logger.level
    bnb_logger.setLevel(std_logging.ERROR)
    try:
        yield
    finally:
        bnb_logger.setLevel(level)


def _measure(
    model: Any, tokenizer: Any, forget_records: Any, retain_records: Any | None, prompt_template: str | None
) -> dict:
    measured = {"forget": evaluate_qa(model, tokenizer, forget_records, prompt_template=prompt_template)}
    if retain_records is not None:
        measured["retain"] = evaluate_qa(model, tokenizer, retain_records, prompt_template=prompt_template)
    return measured


def mode_measured(entry: dict) -> bool:
    """Whether one mode's result of :func:`check_quantization_robustness` measured a quantized model (a record written
    before ``"measured"`` existed: whether any layer was quantized)."""
    return bool(entry.get("measured", entry.get("quantized_layers", 0) > 0))


def quantization_table(result: dict) -> str:
    """Markdown table: each metric in full precision and after each mode, with the change; then what came back, and
    which modes were not measured and why."""
    modes = [m for m in result if m != "full_precision"]
    unmeasured = [m for m in modes if not mode_measured(result[m])]
    lines = [
        "| split | metric | full precision | "
        + " | ".join(m + (" (not measured)" if m in unmeasured else "") for m in modes)
        + " |",
        "|---|---|---|" + "---|" * len(modes),
    ]
    for side in result["full_precision"]:
        for metric in ("rouge_l_recall", "probability", "exact_match"):
            cells = [f"{result[m][side][metric]:.3f} ({result[m]['change'][side][metric]:+.3f})" for m in modes]
            lines.append(
                f"| {side} | {metric} | {result['full_precision'][side][metric]:.3f} | " + " | ".join(cells) + " |"
            )
    kept = next((result[m]["kept_in_full_precision"] for m in modes if "kept_in_full_precision" in result[m]), None)
    if kept:
        names = ", ".join(f"`{name}` ({out} x {inp})" for name, (out, inp) in kept["modules"].items())
        lines += ["", f"In the 4-bit models, {len(kept['modules'])} layer(s) stayed in full precision: {names}; "
                  f"{kept['reason']}."]  # fmt: skip
    measured = [m for m in modes if m not in unmeasured]
    flagged = [m for m in measured if result[m]["knowledge_returned"]]
    lines.append("")
    if flagged:
        lines.append(f"Forgotten knowledge came back after: {', '.join(flagged)}.")
    elif measured:
        after = "quantization" if not unmeasured else ", ".join(measured)
        lines.append(
            f"No forgotten knowledge came back after {after} "
            f"(forget ROUGE-L / exact match within +{RETURN_THRESHOLD})."
        )
    for mode in unmeasured:
        reason = result[mode].get("not_measured", "no layer was quantized")
        lines.append(f"Not measured in {mode}: {reason}; its numbers are those of a mostly full-precision model.")
    return "\n".join(lines)


__all__ = [
    "QUANTIZATION_MODES",
    "check_quantization_robustness",
    "keep_4bit_layers_trainable",
    "quantization_config",
    "quantization_table",
]
