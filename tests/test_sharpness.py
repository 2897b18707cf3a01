"""Sharpness-aware unlearning (``sam_rho``, Unlearn-Smooth, arXiv 2502.05374) checked against a hand computation.

The hand computation follows the reference code's ``SAMTrainer``: the forget objective's gradient ``g`` at the
weights ``w`` (autograd, no trainer), the weights moved to ``w + rho * g / ||g||``, the forget gradient taken there,
the weights put back; the retain gradient at ``w``. The trainer's gradient is captured before the optimizer step
(``on_pre_optimizer_step``), as in test_trainer_gradients.
"""

import pytest
import torch
from conftest import make_tiny_model
from test_trainer_gradients import FORGET, RETAIN, CaptureGradients, autograd_gradient, config, fresh, run_one_step

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.objectives import FORGET_OBJECTIVES, RETAIN_OBJECTIVES
from hf_unlearn.surgery.combine import combine_gradients

RHO = 0.1
GA = FORGET_OBJECTIVES["ga"]


@pytest.fixture(scope="module")
def memorized_state():
    from conftest import memorize

    model = memorize(make_tiny_model("gpt2"), FORGET + RETAIN, steps=80, lr=2e-2)
    return {k: v.clone() for k, v in model.state_dict().items()}


def hand_sam_gradient(state, forget, examples, args, model_of=fresh):
    """The forget gradient at the worst nearby weights, by hand: perturb, take the gradient, restore."""
    model, reference = model_of(state), model_of(state).requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    g = autograd_gradient(model, forget, examples, args, reference_model=reference)
    norm = torch.sqrt(sum((x.double() ** 2).sum() for x in g if x is not None))
    with torch.no_grad():
        for p, x in zip(params, g):
            if x is not None:
                p.add_(RHO / norm * x)
    return autograd_gradient(model, forget, examples, args, reference_model=reference)


@pytest.mark.parametrize(
    ("method", "surgery"),
    [("graddiff", "sum"), ("npo_klr", "sum"), ("masc", "sum"), ("masc", "pcgrad"), ("graddiff", "sago")],
)
def test_sam_gradient_equals_the_hand_computation(tmp_path, memorized_state, method, surgery):
    """The optimizer gets forget_weight * g_f(w + e) + retain_weight * g_r(w) (or SAGO's combination of the two):
    dropping the perturbation, perturbing the other way, or keeping the first pass's gradient changes it."""
    gamma, alpha = 0.5, 1.5
    args = config(
        tmp_path, method=method, gradient_surgery=surgery, forget_weight=gamma, retain_weight=alpha, sam_rho=RHO
    )
    trainer, got = run_one_step(fresh(memorized_state), args)
    forget_objective, retain_objective = FORGET_OBJECTIVES[trainer.forget_objective.name], trainer.retain_objective
    retain_batch = [trainer.train_dataset[i]["retain"] for i in range(len(FORGET))]
    forget_grad = hand_sam_gradient(memorized_state, forget_objective, FORGET, args)
    start = fresh(memorized_state)
    retain_grad = autograd_gradient(start, RETAIN_OBJECTIVES[retain_objective.name], retain_batch, args, start)
    if surgery == "sum":
        expected = [None if f is None else gamma * f + alpha * r for f, r in zip(forget_grad, retain_grad)]
    else:
        expected = combine_gradients(forget_grad, retain_grad, surgery, forget_weight=gamma, retain_weight=alpha)
    for name, g, e in zip([n for n, _ in start.named_parameters()], got, expected):
        torch.testing.assert_close(g, e, rtol=1e-8, atol=1e-11, msg=lambda m, name=name: f"{name}: {m}")


def test_sam_step_restores_the_weights_exactly(tmp_path, memorized_state):
    """After a step at learning rate 0 the weights are bit for bit the start's: the perturbation is undone from a
    copy, not by subtracting it again. The gradient differs from the one without SAM (the second pass ran at the
    perturbed weights)."""
    grads = {}
    for rho in (0.0, RHO):
        args = config(tmp_path / str(rho), method="npo_klr", learning_rate=0.0, sam_rho=rho)
        trainer, grads[rho] = run_one_step(fresh(memorized_state), args)
        for name, value in trainer.model.state_dict().items():
            assert torch.equal(value, memorized_state[name]), name
    assert any(not torch.allclose(a, b) for a, b in zip(grads[0.0], grads[RHO]) if a is not None)


class RecordingTrainer(UnlearnTrainer):
    """Keeps the forget micro-batches it trains on, in order."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        self.seen = getattr(self, "seen", []) + [inputs["forget"]]
        return super().training_step(model, inputs, num_items_in_batch)


def test_sam_accumulates_per_micro_batch(tmp_path, memorized_state):
    """With 2 micro-batches of 4, each micro-batch is perturbed by its own forget gradient and the window's gradient
    is the sum of the two micro-batches' gradients at their own perturbed weights, each weighted by its share of the
    window's answer tokens (GA only: no retain part). A perturbation from the accumulated gradient, or gradients of
    earlier micro-batches left in the first pass, changes it."""
    args = config(tmp_path, method="ga", per_device_train_batch_size=4, gradient_accumulation_steps=2, sam_rho=RHO)
    trainer = RecordingTrainer(model=fresh(memorized_state), args=args, train_dataset=FORGET)
    capture = CaptureGradients(trainer.model)
    trainer.add_callback(capture)
    trainer.train()
    assert len(trainer.seen) == 2
    total = sum(int((batch["labels"][:, 1:] != -100).sum()) for batch in trainer.seen)
    expected = None
    for batch in trainer.seen:
        keep = batch["attention_mask"].bool()
        tensors = ("input_ids", "attention_mask", "labels")
        examples = [{k: batch[k][i][keep[i]].tolist() for k in tensors} for i in range(len(keep))]
        share = int((batch["labels"][:, 1:] != -100).sum()) / total
        grad = [None if g is None else share * g for g in hand_sam_gradient(memorized_state, GA, examples, args)]
        expected = grad if expected is None else [a if b is None else a + b for a, b in zip(expected, grad)]
    for g, e in zip(capture.grads[0], expected):
        if e is not None:
            torch.testing.assert_close(g, e, rtol=1e-8, atol=1e-11)


def test_sam_with_lora_perturbs_and_restores_only_the_adapter(tmp_path, memorized_state):
    """With LoRA only the adapter weights move: the gradient equals the hand computation on the LoRA parameters
    (base weights fixed), and after a step at learning rate 0 every weight, base and adapter, is the start's."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], init_lora_weights=False)

    def lora_model(state):
        torch.manual_seed(7)
        return get_peft_model(fresh(state), lora)

    args = config(tmp_path, method="ga", sam_rho=RHO, learning_rate=0.0)
    model = lora_model(memorized_state)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = UnlearnTrainer(model=model, args=args, train_dataset=FORGET)
    capture = CaptureGradients(trainer.model)
    trainer.add_callback(capture)
    trainer.train()
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(value, start[name]), name
    got = [g for g, p in zip(capture.grads[0], trainer.model.parameters()) if p.requires_grad]
    expected = hand_sam_gradient(memorized_state, GA, FORGET, args, model_of=lora_model)
    assert len(got) == len(expected) > 0
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-8, atol=1e-11)


def test_sam_logs_the_forget_loss_at_the_unperturbed_weights(tmp_path, memorized_state):
    """forget_loss in the logs is the first pass's (at the weights), the same as without SAM; only Trainer's
    ``loss`` comes from the perturbed pass, as in the reference code."""
    logs = {}
    for rho in (0.0, RHO):
        args = config(tmp_path / str(rho), method="ga", learning_rate=0.0, sam_rho=rho)
        trainer, _ = run_one_step(fresh(memorized_state), args)
        (logs[rho],) = [log for log in trainer.state.log_history if "forget_loss" in log]
    assert logs[RHO]["forget_loss"] == pytest.approx(logs[0.0]["forget_loss"], rel=1e-12)
    assert logs[RHO]["loss"] > logs[0.0]["loss"]  # the perturbation ascends the forget objective


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sam_rho": -0.1}, "sam_rho must be a finite number >= 0"),
        ({"sam_rho": float("nan")}, "sam_rho must be a finite number >= 0"),
        ({"sam_rho": 0.1, "fsdp": "full_shard"}, "sam_rho is not available with FSDP"),
        (
            {"sam_rho": 0.1, "deepspeed": {"zero_optimization": {"stage": 3}}},
            "sam_rho is not available with DeepSpeed",
        ),
    ],
)
def test_sam_refusals_name_the_problem(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        UnlearnConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **overrides)


def test_sam_refused_under_a_backend_from_the_accelerate_config():
    """The trainer's own check (DeepSpeed or FSDP chosen by an accelerate config, not by the arguments)."""
    from hf_unlearn.training.sharpness import ForgetSAM

    for backend in ("deepspeed", "fsdp"):
        with pytest.raises(ValueError, match="sam_rho is not available with"):
            ForgetSAM(0.1, **{backend: True})
        assert ForgetSAM(0.0, **{backend: True}).rho == 0.0


def test_sam_is_in_the_run_record_and_the_model_card(tmp_path, memorized_state):
    from hf_unlearn.outputs.model_card import build_model_card

    args = config(tmp_path, method="ga", sam_rho=RHO)
    trainer, _ = run_one_step(fresh(memorized_state), args)
    assert trainer.record.hyperparameters["sam_rho"] == RHO
    assert any("Sharpness-Aware" in paper["title"] for paper in trainer.record.papers)
    assert "Sharpness-aware forgetting" in str(build_model_card(trainer.record, "out"))
    off, _ = run_one_step(fresh(memorized_state), config(tmp_path / "off", method="ga"))
    assert "sam_rho" not in off.record.hyperparameters
    assert "Sharpness-aware" not in str(build_model_card(off.record, "out"))
