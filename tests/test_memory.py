"""The per-parameter memory prediction (hf_unlearn.training.memory) against the tensors a live trainer holds."""

import pytest
import torch
from conftest import make_tiny_model, make_varied_example, tiny_model_folder, unlearn_config
from peft import LoraConfig
from transformers import LlamaConfig, LlamaForCausalLM

from hf_unlearn import UnlearnTrainer
from hf_unlearn.training.memory import (
    NF4_BYTES,
    StateBytesCallback,
    lora_parameter_count,
    parameter_counts,
    predicted_state_bytes,
)

FORGET = [make_varied_example(i) for i in range(4)]
RETAIN = [make_varied_example(100 + i) for i in range(4)]


def trained(tmp_path, model, **overrides):
    """A trainer after two optimizer steps (gradients and AdamW moments exist)."""
    args = unlearn_config(
        tmp_path, max_steps=2, probe_interval=0, stop_at_target=False, per_device_train_batch_size=2, **overrides
    )
    trainer = UnlearnTrainer(model, args, FORGET, RETAIN)
    return held_while_training(trainer)


def held_while_training(trainer):
    """The largest count of held bytes, taken before each optimizer step (AdamW's moments exist from step 2)."""
    counter = StateBytesCallback(trainer)
    trainer.add_callback(counter)
    trainer.train()
    return counter.peak


@pytest.mark.parametrize(
    ("surgery", "retain_loss", "reference_dtype"),
    [("sum", "kl", None), ("sago", "kl", None), ("pcgrad", "nll", None), ("sum", "kl", "bfloat16")],
)
def test_full_fine_tuning_holds_what_is_predicted(tmp_path, surgery, retain_loss, reference_dtype):
    model = make_tiny_model("llama")
    counts = parameter_counts(model)
    measured = trained(
        tmp_path, model, gradient_surgery=surgery, retain_loss=retain_loss, reference_dtype=reference_dtype
    ).as_dict()
    predicted = predicted_state_bytes(
        counts, surgery=surgery != "sum", needs_reference=retain_loss == "kl", reference_dtype=reference_dtype
    ).as_dict()
    assert measured == predicted
    # Surgery's one extra buffer is a gradient's size; the reference is one (or half a) model.
    assert measured["surgery"] == (measured["gradients"] if surgery != "sum" else 0)


def test_lora_holds_the_base_once_and_adapter_states(tmp_path):
    model = make_tiny_model("llama")
    counts = parameter_counts(model)
    adapters = lora_parameter_count(model, r=4, target_modules=["q_proj", "v_proj"])
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = unlearn_config(
        tmp_path,
        max_steps=2,
        probe_interval=0,
        stop_at_target=False,
        per_device_train_batch_size=2,
        gradient_surgery="sago",
    )
    trainer = UnlearnTrainer(model, args, FORGET, RETAIN, peft_config=lora)
    measured = held_while_training(trainer).as_dict()
    predicted = predicted_state_bytes(counts, adapter="lora", surgery=True, lora_parameters=adapters).as_dict()
    assert measured == predicted
    assert measured["reference"] == 0 and measured["optimizer"] == 2 * 4 * adapters


def test_qlora_weights_are_nf4_plus_the_rest(tmp_path):
    from hf_unlearn.jobs import load_model_and_tokenizer

    tiny_model_folder(tmp_path / "base", "llama", hidden_size=64, num_layers=2, num_heads=2)
    full, _ = load_model_and_tokenizer(str(tmp_path / "base"))
    counts = parameter_counts(full)
    model, _ = load_model_and_tokenizer(str(tmp_path / "base"), load_in_4bit=True)
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    adapters = lora_parameter_count(full, r=4, target_modules=["q_proj", "v_proj"])
    args = unlearn_config(
        tmp_path / "out", max_steps=2, probe_interval=0, stop_at_target=False, per_device_train_batch_size=2
    )
    trainer = UnlearnTrainer(model, args, FORGET, RETAIN, peft_config=lora)  # token ids < 64 < the vocabulary
    measured = held_while_training(trainer)
    predicted = predicted_state_bytes(counts, adapter="qlora", lora_parameters=adapters)
    assert measured.weights == pytest.approx(predicted.weights, rel=1e-9)
    assert measured.optimizer == predicted.optimizer and measured.reference == 0
    # The decoder's linear weights really are ~0.56 bytes each: 4 bits plus one fp32 scale per 64.
    assert (measured.weights - counts["other"] * 4 - adapters * 4) / counts["linear"] == pytest.approx(NF4_BYTES)


def test_sharding_divides_and_counts_come_from_a_meta_model():
    config = LlamaConfig(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    counts = parameter_counts(model)
    assert 8.0e9 < counts["total"] < 8.1e9  # Llama-3.1-8B
    assert counts["other"] == 2 * 128256 * 4096 + (2 * 32 + 1) * 4096
    # bf16 weights, gradient, two moments, reference and surgery buffer: 2 + 2 + 4 + 2 + 2 bytes per parameter;
    # sharded over 8 processes, an eighth of each (what each process holds is measured in test_distributed.py).
    assert predicted_state_bytes(counts, dtype="bfloat16", surgery=True).total == 12 * counts["total"]
    eight = predicted_state_bytes(counts, dtype="bfloat16", surgery=True, processes=8, sharded=True)
    assert eight.total == 1.5 * counts["total"]
    with pytest.raises(ValueError, match="adapter must be"):
        predicted_state_bytes(counts, adapter="dora")
