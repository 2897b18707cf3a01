"""Bad input fails with a message that names the problem, before any weight changes."""

import pytest
import torch
from conftest import make_example, make_tiny_model
from transformers import TrainerCallback

from hf_unlearn import UnlearnConfig, UnlearnTrainer

FORGET = [make_example(i) for i in range(8)]
RETAIN = [make_example(1000 + i) for i in range(8)]


def args(tmp_path, **overrides):
    values = dict(output_dir=str(tmp_path), max_steps=3, report_to="none", save_strategy="no", use_cpu=True)
    values.update(overrides)
    return UnlearnConfig(**values)


def build(tmp_path, model=None, forget=FORGET, retain=RETAIN, **overrides):
    return UnlearnTrainer(
        model=model or make_tiny_model(), args=args(tmp_path, **overrides), train_dataset=forget, retain_dataset=retain
    )


def test_empty_forget_set(tmp_path):
    with pytest.raises(ValueError, match="forget set is empty"):
        build(tmp_path, forget=[])


def test_forget_labels_all_masked(tmp_path):
    masked = [dict(e, labels=[-100] * len(e["labels"])) for e in FORGET]
    with pytest.raises(ValueError, match="Every label of the forget set is -100"):
        build(tmp_path, forget=masked)


def test_some_examples_without_answer_tokens(tmp_path):
    forget = list(FORGET)
    forget[3] = dict(forget[3], labels=[-100] * 12)
    with pytest.raises(
        ValueError, match=r"1 forget example\(s\) have no answer tokens \(all labels -100\), e.g. indices \[3\]"
    ):
        build(tmp_path, forget=forget)


def test_k_not_smaller_than_vocabulary(tmp_path):
    with pytest.raises(ValueError, match="masc_k=64 is not smaller than the vocabulary size 64"):
        build(tmp_path, masc_k=64)


@pytest.mark.parametrize("method", ["masc", "graddiff", "npo_klr"])
def test_method_with_retain_term_needs_retain_data(tmp_path, method):
    with pytest.raises(ValueError, match=f"Method '{method}' has the retain term .* needs a retain_dataset"):
        build(tmp_path, retain=None, method=method)


def test_method_without_retain_term_runs_without_retain_data(tmp_path):
    trainer = build(tmp_path, retain=None, method="masc", retain_loss="none", probe_interval=0, stop_at_target=False)
    trainer.train()
    assert trainer.state.global_step == 3


def test_untokenized_data_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"lack \['input_ids', 'labels'\].*build_qa_dataset"):
        build(tmp_path, forget=[{"question": "q", "answer": "a"}])


def test_unknown_method_and_probe():
    with pytest.raises(ValueError, match="Unknown method 'forgetful'"):
        UnlearnConfig(output_dir="x", method="forgetful")
    with pytest.raises(ValueError, match="stop_probe must be one of"):
        UnlearnConfig(output_dir="x", stop_probe="sometimes")
    with pytest.raises(ValueError, match="reference_cache_gb must be >= 0"):
        UnlearnConfig(output_dir="x", reference_cache_gb=-1)
    with pytest.raises(ValueError, match=r"violation_bound_delta .* must be in \(0, 1\), got 5"):
        UnlearnConfig(output_dir="x", violation_bound_delta=5)
    with pytest.raises(ValueError, match="stop_target='membership' does not read it"):
        UnlearnConfig(output_dir="x", violation_bound_delta=0.05, stop_target="membership")


def test_model_without_trainable_parameters(tmp_path):
    model = make_tiny_model().requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        build(tmp_path, model=model)


def test_nan_loss_stops_before_the_update_and_names_the_step(tmp_path):
    model = make_tiny_model()
    with torch.no_grad():
        model.model.embed_tokens.weight[FORGET[0]["input_ids"][0]] = float("nan")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = build(tmp_path, model=model, probe_interval=0, stop_at_target=False, dataloader_drop_last=False)
    with pytest.raises(FloatingPointError, match=r"forget loss \(masc\) is nan at step 1"):
        trainer.train()
    for name, p in trainer.model.named_parameters():
        torch.testing.assert_close(p, before[name], equal_nan=True)


def test_sequences_longer_than_the_context(tmp_path):
    long = [dict(make_example(1, length=80, prompt=10))] + FORGET  # the tiny models have 64 positions
    with pytest.raises(ValueError, match="1 forget example\\(s\\) are longer than the model's context of 64 tokens"):
        build(tmp_path, forget=long)


def test_non_causal_model_is_refused(tmp_path):
    from transformers import BertConfig, BertModel

    encoder = BertModel(
        BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32)
    )
    with pytest.raises(ValueError, match="BertModel has no language-modelling head.*AutoModelForCausalLM"):
        build(tmp_path, model=encoder)


def test_tokenizer_without_pad_token_gets_eos(tmp_path):
    from hf_unlearn.benchmarks import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.pad_token = None
    assert tokenizer.pad_token_id is None
    trainer = UnlearnTrainer(make_tiny_model(), args(tmp_path), FORGET, RETAIN, processing_class=tokenizer)
    assert tokenizer.pad_token == tokenizer.eos_token and trainer.pad_token_id == tokenizer.eos_token_id


def test_forget_set_too_small_for_the_held_out_probe(tmp_path):
    with pytest.raises(ValueError, match="too few to hold out"):
        build(tmp_path, forget=FORGET[:1], stop_probe="holdout")


def test_checkpoints_are_safetensors(tmp_path):
    trainer = build(tmp_path, save_strategy="steps", save_steps=3, probe_interval=0, stop_at_target=False)
    trainer.train()
    files = {p.name for p in (tmp_path / "checkpoint-3").iterdir()}
    assert "model.safetensors" in files and "pytorch_model.bin" not in files


class _DivergeAfter(TrainerCallback):
    """Simulates a run that diverges: after optimizer step ``step`` a weight becomes NaN."""

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step == self.step:
            with torch.no_grad():
                model.model.embed_tokens.weight.fill_(float("nan"))


def test_divergence_mid_run_names_the_step_and_keeps_the_last_good_checkpoint(tmp_path):
    from safetensors.torch import load_file

    trainer = build(tmp_path, max_steps=8, save_strategy="steps", save_steps=3, probe_interval=0, stop_at_target=False)
    trainer.add_callback(_DivergeAfter(4))
    with pytest.raises(FloatingPointError, match=r"is nan at step 5"):
        trainer.train()
    checkpoints = sorted(p.name for p in tmp_path.glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-3"]  # nothing written after the divergence
    weights = load_file(tmp_path / "checkpoint-3" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())
    resumed = build(tmp_path, max_steps=6, save_strategy="no", probe_interval=0, stop_at_target=False)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    assert resumed.state.global_step == 6
    assert all(torch.isfinite(p).all() for p in resumed.model.parameters())


@pytest.mark.parametrize(
    ("option", "backend", "why"),
    [
        ({"fsdp": "full_shard", "fsdp_config": {"version": 1}}, "FSDP1", "FlatParameter"),
        ({"deepspeed": {"zero_optimization": {"stage": 2}}}, "DeepSpeed", "param.grad stays empty"),
    ],
    ids=["fsdp1", "deepspeed"],
)
def test_gradient_surgery_where_gradients_are_out_of_reach_is_refused_at_configuration(tmp_path, option, backend, why):
    with pytest.raises(ValueError, match=rf"gradient_surgery='sago' is not available with {backend}: .*{why}.*FSDP2"):
        args(tmp_path, gradient_surgery="sago", **option)


def test_gradient_surgery_with_fsdp2_is_accepted(tmp_path):
    # transformers 5 means FSDP2 by default; the surgery runs shard by shard (tests/test_distributed.py).
    assert args(tmp_path, gradient_surgery="sago", fsdp="full_shard").gradient_surgery == "sago"
