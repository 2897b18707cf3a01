import math

import pytest
import torch
from conftest import ARCHITECTURES, forget_set, make_example, make_tiny_model, memorize, retain_set
from peft import LoraConfig
from transformers import TrainerCallback

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.data.pairing import pad_examples

FORGET, RETAIN = forget_set(), retain_set()
LORA_TARGETS = {"llama": ["q_proj", "v_proj"], "qwen2": ["q_proj", "v_proj"], "gpt2": ["c_attn"]}


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path),
        max_steps=12,
        probe_interval=4,
        learning_rate=3e-3,
        forget_weight=1.0,
        stop_alpha=0.0,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        logging_steps=4,
    )
    values.update(overrides)
    return UnlearnConfig(**values)


def answer_probability(model, examples):
    batch = pad_examples(examples, 0)
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    mask = labels != -100
    log_probs = torch.log_softmax(logits, -1).gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.exp((log_probs * mask).sum() / mask.sum()).item()


def snapshot(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_masc_full_finetuning_forgets_and_keeps(tmp_path, architecture):
    model = memorize(make_tiny_model(architecture), FORGET + RETAIN, steps=60, lr=2e-2)
    forget_before, retain_before = answer_probability(model, FORGET), answer_probability(model, RETAIN)
    assert forget_before > 0.9
    before = snapshot(model)
    trainer = UnlearnTrainer(model=model, args=config(tmp_path), train_dataset=FORGET, retain_dataset=RETAIN)
    rate_before = trainer.probe()["violation_rate"]
    trainer.train()
    changed = [name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])]
    assert len(changed) == len(before)
    rate_after = trainer.stopping_callback.last_violation_rate
    assert rate_after < rate_before
    assert answer_probability(trainer.model, FORGET) < 0.5 * forget_before
    assert answer_probability(trainer.model, RETAIN) > 0.5 * retain_before


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_masc_lora_changes_only_adapters_and_uses_base_as_reference(tmp_path, architecture):
    model = memorize(make_tiny_model(architecture), FORGET + RETAIN, steps=60, lr=2e-2)
    batch = pad_examples(RETAIN[:4], 0)
    with torch.no_grad():
        base_logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS[architecture], task_type="CAUSAL_LM")
    trainer = UnlearnTrainer(
        model=model,
        args=config(tmp_path, learning_rate=1e-2),
        train_dataset=FORGET,
        retain_dataset=RETAIN,
        peft_config=lora,
    )
    assert trainer.ref_model is None  # no copy of the weights: adapters are disabled instead
    before = snapshot(trainer.model)
    forget_before = answer_probability(trainer.model, FORGET)
    trainer.train()
    changed = {name for name, p in trainer.model.named_parameters() if not torch.equal(p, before[name])}
    assert changed and all("lora_" in name for name in changed)
    assert answer_probability(trainer.model, FORGET) < forget_before
    reference = trainer.reference_logits(trainer.model, batch)
    torch.testing.assert_close(reference, base_logits)


def test_held_out_forget_examples_never_reach_a_training_batch(tmp_path):
    forget = [make_example(i) for i in range(20)]
    trainer = UnlearnTrainer(
        model=make_tiny_model(),
        args=config(tmp_path, stop_probe="holdout", holdout_fraction=0.25, num_train_epochs=3, max_steps=-1),
        train_dataset=forget,
        retain_dataset=RETAIN,
    )
    held_out = {tuple(e["input_ids"]) for e in trainer.probes.sets.holdout}
    assert len(held_out) == 5
    seen = set()
    for epoch in range(3):
        trainer.train_dataset.set_epoch(epoch)
        for batch in trainer.get_train_dataloader():
            for row, mask in zip(batch["forget"]["input_ids"].tolist(), batch["forget"]["attention_mask"].tolist()):
                seen.add(tuple(token for token, keep in zip(row, mask) if keep))
    assert len(seen) == 15
    assert not seen & held_out
    measured = trainer.probe()
    assert {"violation_rate_train", "violation_rate_holdout", "violation_rate"} <= measured.keys()
    assert measured["violation_rate"] == measured["violation_rate_holdout"]


def test_stops_at_the_first_probe_at_or_under_alpha(tmp_path, memorized_llama_state):
    def run(alpha, stop=True):
        model = make_tiny_model("llama")
        model.load_state_dict(memorized_llama_state)
        args = config(
            tmp_path / f"{alpha}-{stop}", stop_alpha=alpha, stop_at_target=stop, probe_interval=3, max_steps=30,
            utility_floor=None,
        )  # fmt: skip
        trainer = UnlearnTrainer(model=model, args=args, train_dataset=FORGET, retain_dataset=RETAIN)
        trainer.train()
        return trainer

    # The same run measured without stopping: the violation rate at each probe (steps 3, 6, ..., 30).
    rates = {h["step"]: h["violation_rate"] for h in run(0.0, stop=False).stopping_callback.history if h["step"]}
    # alpha = a later probe's rate that is below every earlier one: the first probe at or under it is that one.
    steps = sorted(rates)
    target = next(s for i, s in enumerate(steps) if i > 0 and rates[s] < min(rates[t] for t in steps[:i]))
    trainer = run(rates[target])
    assert trainer.stopping_callback.stop_step == target > 3 and trainer.state.global_step == target
    assert trainer.stopping_callback.last_violation_rate == rates[target]  # at, not only under, alpha stops
    assert any("violation_rate" in log for log in trainer.state.log_history)
    # Just under that rate the same probe does not stop the run.
    below = run(math.nextafter(rates[target], -math.inf))
    assert below.stopping_callback.stop_step != target


def test_without_reaching_alpha_the_budget_is_used(tmp_path, memorized_llama):
    trainer = UnlearnTrainer(
        model=memorized_llama,
        args=config(tmp_path, stop_alpha=0.0, forget_weight=1e-6, max_steps=8),
        train_dataset=FORGET,
        retain_dataset=RETAIN,
    )
    trainer.train()
    assert not trainer.stopping_callback.stopped_early
    assert trainer.state.global_step == 8
    assert trainer.stopping_callback.probes_done == 2


@pytest.mark.parametrize("surgery", ["sum", "sago"])
def test_resume_restores_the_stopping_state_and_stops_at_the_same_step(tmp_path, memorized_llama_state, surgery):
    def fresh_model():
        model = make_tiny_model("llama")
        model.load_state_dict(memorized_llama_state)
        return model

    common = dict(
        stop_alpha=0.3, probe_interval=2, max_steps=40, save_strategy="steps", save_steps=2, gradient_surgery=surgery
    )
    uninterrupted = UnlearnTrainer(
        model=fresh_model(), args=config(tmp_path / "a", **common), train_dataset=FORGET, retain_dataset=RETAIN
    )
    uninterrupted.train()
    stop = uninterrupted.stopping_callback.stop_step
    assert stop is not None and stop >= 4, uninterrupted.stopping_callback.history

    resumed = UnlearnTrainer(
        model=fresh_model(), args=config(tmp_path / "b", **common), train_dataset=FORGET, retain_dataset=RETAIN
    )
    checkpoint = tmp_path / "a" / f"checkpoint-{stop - 2}"
    resumed.train(resume_from_checkpoint=str(checkpoint))
    callback = resumed.stopping_callback
    assert callback.stop_step == stop
    assert callback.probes_done == uninterrupted.stopping_callback.probes_done
    assert [h["step"] for h in callback.history] == [h["step"] for h in uninterrupted.stopping_callback.history]
    for a, b in zip(uninterrupted.model.parameters(), resumed.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", ["sago", "pcgrad"])
def test_surgery_sees_gradients_accumulated_over_the_whole_window(tmp_path, memorized_llama_state, strategy):
    """Accumulating 4 micro-batches of 2 must give the same step as one batch of 8 (the combination is
    nonlinear, so combining per micro-batch would not)."""

    def run(batch_size, accumulation):
        model = make_tiny_model("llama")
        model.load_state_dict(memorized_llama_state)
        args = config(
            tmp_path / f"{batch_size}",
            gradient_surgery=strategy,
            retain_loss="nll",  # KL is exactly 0 at the start, so its gradient is all noise
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            max_steps=1,
            probe_interval=0,
            stop_at_target=False,
            max_grad_norm=0.0,
            logging_steps=1,
        )
        trainer = UnlearnTrainer(model=model, args=args, train_dataset=FORGET, retain_dataset=RETAIN)
        trainer.train()
        return trainer

    accumulated, single = run(2, 4), run(8, 1)
    for a, b in zip(accumulated.model.parameters(), single.model.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    logged = [log for log in accumulated.state.log_history if "surgery/cos_update_retain" in log]
    assert logged and logged[0]["surgery/cos_update_retain"] >= 0


def test_surgery_needs_a_retain_term():
    with pytest.raises(ValueError, match="retain objective is 'none'"):
        UnlearnConfig(output_dir="x", gradient_surgery="sago", retain_loss="none")


def test_reference_copy_does_not_follow_the_trained_weights(tmp_path):
    """A model whose forward was patched on the instance (as a previous Trainer can leave it) still gets a
    reference that computes with the start weights."""
    import functools

    model = make_tiny_model("llama")
    original_forward = model.forward
    model.forward = functools.wraps(original_forward)(lambda *a, **k: original_forward(*a, **k))
    trainer = UnlearnTrainer(model=model, args=config(tmp_path), train_dataset=FORGET, retain_dataset=RETAIN)
    batch = pad_examples(RETAIN[:2], 0)
    start = trainer.reference_logits(trainer.model, batch)
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.mul_(0.5)
    torch.testing.assert_close(trainer.reference_logits(trainer.model, batch), start)


def test_surgery_with_lora_bf16_and_clipping_changes_only_adapters(tmp_path, memorized_llama):
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    args = config(
        tmp_path,
        gradient_surgery="sago_prefer_retain",
        retain_loss="nll",
        bf16=True,
        max_grad_norm=0.5,
        learning_rate=1e-2,
        logging_steps=2,
        max_steps=6,
    )
    trainer = UnlearnTrainer(
        model=memorized_llama, args=args, train_dataset=FORGET, retain_dataset=RETAIN, peft_config=lora
    )
    before = snapshot(trainer.model)
    stepped = []  # the norm of the gradient each optimizer step is given, after Trainer's clipping

    class GradientNorm(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            grads = [p.grad.float() for p in model.parameters() if p.requires_grad and p.grad is not None]
            stepped.append(math.sqrt(sum((g * g).sum().item() for g in grads)))

    trainer.add_callback(GradientNorm())
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all("lora_" in n for n in changed)
    logged = [log for log in trainer.state.log_history if "surgery/cos_update_retain" in log]
    assert logged and all(log["surgery/cos_update_retain"] >= -1e-6 for log in logged)
    # Clipping: the surgery's update exceeds max_grad_norm (the logged norm is taken before clipping), and what the
    # optimizer steps with is that update scaled down to the norm 0.5.
    assert len(stepped) == 6
    norms = [log["grad_norm"] for log in trainer.state.log_history if "grad_norm" in log]
    assert len(norms) == 3 and max(norms) > 0.5
    assert all(norm <= 0.5 * (1 + 1e-3) for norm in stepped) and max(stepped) == pytest.approx(0.5, rel=1e-3)


def test_a_half_precision_reference_copy_halves_its_memory_and_trains(tmp_path, memorized_llama_state):
    model = make_tiny_model("llama")
    model.load_state_dict(memorized_llama_state)
    trainer = UnlearnTrainer(
        model, config(tmp_path, method="npo_klr", max_steps=3, reference_dtype="bfloat16"), FORGET, RETAIN
    )
    reference = trainer.ref_model
    assert all(p.dtype == torch.bfloat16 for p in reference.parameters())
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    full = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
    assert sum(p.numel() * p.element_size() for p in reference.parameters()) == full // 2
    trainer.train()
    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])
    with pytest.raises(ValueError, match="reference_dtype must be"):
        config(tmp_path, reference_dtype="int8")
