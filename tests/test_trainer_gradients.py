"""The gradient the trainer hands to the optimizer, checked against autograd on the same batch.

Every check captures ``p.grad`` at ``on_pre_optimizer_step`` (after accumulation, the DDP all-reduce and the
gradient surgery, before the optimizer) with clipping off, and compares it with an independent computation:
``torch.autograd.grad`` of each objective on the whole batch, combined with ``combine_gradients`` and forget and
retain weights other than 1.
"""

import pytest
import torch
from conftest import make_tiny_model, make_varied_example, memorize
from transformers import TrainerCallback

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.data.pairing import pad_examples
from hf_unlearn.objectives import FORGET_OBJECTIVES, RETAIN_OBJECTIVES, LossInputs
from hf_unlearn.objectives.registry import resolve_hyperparameters, resolve_objectives
from hf_unlearn.surgery.combine import STRATEGIES, combine_gradients

FORGET = [make_varied_example(i) for i in range(8)]
RETAIN = [make_varied_example(100 + i) for i in range(8)]


@pytest.fixture(scope="module")
def memorized_state():
    model = memorize(make_tiny_model("gpt2"), FORGET + RETAIN, steps=80, lr=2e-2)
    return {k: v.clone() for k, v in model.state_dict().items()}


def fresh(state):
    """The memorised model in float64: the comparisons below are of summation orders (micro-batches against one
    batch, the trainer's two backward passes against autograd), which float64 keeps at ~1e-16. In float32 SAGO's
    per-coordinate sign test flipped on a near-zero coordinate under torch's DEFAULT CPU kernels (1 of 1024). GPT-2,
    because Llama's and Qwen2's RMSNorm compute in float32 whatever the model's dtype."""
    model = make_tiny_model("gpt2").double()
    model.load_state_dict(state)
    return model


class CaptureGradients(TrainerCallback):
    def __init__(self, model):
        self.model = model
        self.grads = []

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.grads.append([None if p.grad is None else p.grad.detach().clone() for p in self.model.parameters()])


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path),
        max_steps=1,
        probe_interval=0,
        stop_at_target=False,
        max_grad_norm=0.0,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        logging_steps=1,
        per_device_train_batch_size=8,
    )
    values.update(overrides)
    return UnlearnConfig(**values)


def run_one_step(model, args):
    trainer = UnlearnTrainer(model=model, args=args, train_dataset=FORGET, retain_dataset=RETAIN)
    capture = CaptureGradients(trainer.model)
    trainer.add_callback(capture)
    trainer.train()
    return trainer, capture.grads[0]


def autograd_gradient(model, objective, examples, args, reference_model=None):
    """Gradient of one objective's mean over ``examples`` in one batch (no trainer involved)."""
    batch = pad_examples(examples, 0)
    params = [p for p in model.parameters() if p.requires_grad]
    needs_hidden = objective.needs_hidden_states
    outputs = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=needs_hidden
    )
    reference = None
    if objective.needs_reference(args):
        with torch.no_grad():
            reference = reference_model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=needs_hidden
            )
    inputs = LossInputs(
        logits=outputs.logits,
        labels=batch["labels"],
        config=args,
        reference_logits=None if reference is None else reference.logits,
        attention_mask=batch["attention_mask"],
        hidden_states=outputs.hidden_states if needs_hidden else None,
        reference_hidden_states=reference.hidden_states if needs_hidden and reference is not None else None,
        hyperparameters=_hyperparameters(objective, args),
    )
    return list(torch.autograd.grad(objective.fn(inputs), params, allow_unused=True))


def _hyperparameters(objective, args):
    """The values the trainer gives ``objective`` under ``args``: its part's kwargs when it is one of the run's
    objectives, else its declared defaults."""
    forget, retain, values = resolve_objectives(args)
    if objective is forget:
        return values["forget"]
    if objective is retain:
        return values["retain"]
    return resolve_hyperparameters(objective, None, "hyperparameters")


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_surgery_in_the_trainer_equals_combine_gradients_of_autograd_gradients(tmp_path, memorized_state, strategy):
    """Forget weight 0.3 and retain weight 2.0, every strategy: the optimizer gets exactly
    combine_gradients(g_f, g_r, strategy, 0.3, 2.0). Protecting the forget gradient instead of the retain one, or
    applying a weight twice, changes it."""
    gamma, alpha = 0.3, 2.0
    args = config(tmp_path, method="graddiff", gradient_surgery=strategy, forget_weight=gamma, retain_weight=alpha)
    trainer, got = run_one_step(fresh(memorized_state), args)
    retain_batch = [trainer.train_dataset[i]["retain"] for i in range(len(FORGET))]
    start = fresh(memorized_state)
    forget_grad = autograd_gradient(start, FORGET_OBJECTIVES["ga"], FORGET, args)
    retain_grad = autograd_gradient(start, RETAIN_OBJECTIVES["nll"], retain_batch, args)
    expected = combine_gradients(forget_grad, retain_grad, strategy, forget_weight=gamma, retain_weight=alpha)
    for name, g, e in zip([n for n, _ in start.named_parameters()], got, expected):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(
    ("method", "surgery"),
    [("masc", "sum"), ("npo_klr", "sum"), ("simnpo", "sago"), ("rmu", "sum"), ("undial", "pcgrad_global")],
)
def test_variable_length_micro_batches_accumulate_to_the_big_batch(tmp_path, memorized_state, method, surgery):
    """4 micro-batches of 2 examples of different lengths give the gradient of one batch of 8: each objective
    divides by its unit (answer tokens, sequences, attended tokens) counted over the whole window, as Trainer does
    with num_items_in_batch. A per-micro-batch mean would weight short answers up."""
    common = dict(method=method, gradient_surgery=surgery, forget_weight=0.5, retain_weight=1.5)
    if method == "rmu":
        common.update(forget_loss_kwargs={"layer": 0, "steering_coefficient": 4.0})
    _, single = run_one_step(fresh(memorized_state), config(tmp_path / "one", **common))
    _, accumulated = run_one_step(
        fresh(memorized_state),
        config(tmp_path / "acc", per_device_train_batch_size=2, gradient_accumulation_steps=4, **common),
    )
    compared = 0
    for a, b in zip(accumulated, single):
        if a is None and b is None:
            continue
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)  # float64 sums in another order
        compared += 1
    assert compared > 0 and any(g is not None and g.abs().sum() > 0 for g in single)


def test_objective_means_follow_the_window_count(tmp_path, memorized_state):
    """The unit counts the trainer hands to the objectives, on a window of micro-batches."""
    args = config(tmp_path, method="npo_klr", per_device_train_batch_size=2, gradient_accumulation_steps=4)
    trainer = UnlearnTrainer(model=fresh(memorized_state), args=args, train_dataset=FORGET, retain_dataset=RETAIN)
    batches = list(trainer.get_train_dataloader())
    counts = trainer._get_num_items_in_batch(batches, torch.device("cpu"))
    answer_tokens = sum(sum(label != -100 for label in e["labels"][1:]) for e in FORGET)
    attended = sum(len(e["input_ids"]) for e in FORGET)
    assert counts["forget"].tolist() == [answer_tokens, 8, attended]
    assert counts["retain"][1] == 8


def test_surgery_statistics_follow_trainers_logging_schedule(tmp_path, memorized_state):
    """logging_strategy='epoch' logs the surgery statistics at each epoch end, averaged over the epoch's steps."""
    args = config(
        tmp_path,
        method="graddiff",
        gradient_surgery="sago",
        max_steps=-1,
        num_train_epochs=2,
        per_device_train_batch_size=4,
        logging_strategy="epoch",
    )
    trainer = UnlearnTrainer(model=fresh(memorized_state), args=args, train_dataset=FORGET, retain_dataset=RETAIN)
    trainer.train()
    logged = [log for log in trainer.state.log_history if "surgery/cos_update_retain" in log]
    assert [log["step"] for log in logged] == [2, 4]
    assert all(0 <= log["surgery/conflict_fraction"] <= 1 and log["surgery/cos_update_retain"] >= 0 for log in logged)
    assert all("forget_loss" in log and "retain_loss" in log for log in logged)
    assert [entry["step"] for entry in trainer.record.surgery_history] == [2, 4]


def test_logged_part_losses_are_the_window_means(tmp_path, memorized_state):
    """forget_loss / retain_loss in the logs are the objectives' values on the window, whatever the accumulation."""
    args = config(
        tmp_path, method="graddiff", per_device_train_batch_size=2, gradient_accumulation_steps=4, learning_rate=0.0
    )
    trainer, _ = run_one_step(fresh(memorized_state), args)
    (log,) = [log for log in trainer.state.log_history if "forget_loss" in log]
    retain_batch = [trainer.train_dataset[i]["retain"] for i in range(len(FORGET))]
    model = fresh(memorized_state)
    with torch.no_grad():
        for part, examples, objective in (
            ("forget", FORGET, FORGET_OBJECTIVES["ga"]),
            ("retain", retain_batch, RETAIN_OBJECTIVES["nll"]),
        ):
            batch = pad_examples(examples, 0)
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            value = objective.fn(LossInputs(logits=logits, labels=batch["labels"], config=args)).item()
            assert log[f"{part}_loss"] == pytest.approx(value, rel=1e-5)
    assert log["loss"] == pytest.approx(log["forget_loss"] + log["retain_loss"], rel=1e-5)


@pytest.mark.parametrize("surgery", ["sum", "sago", "pcgrad_global"])
def test_training_steps_read_the_device_once_per_optimizer_step(tmp_path, memorized_state, surgery, monkeypatch):
    """On a GPU every value read back to the host stalls the step. Between logs, the package's own code reads one
    flag per optimizer step (the non-finite-loss check, before the update) and nothing per micro-batch: losses and
    surgery statistics stay on the device until Trainer logs."""
    import traceback

    reads = []
    for name in ("item", "__bool__", "__float__", "__int__", "tolist"):
        original = getattr(torch.Tensor, name)

        def counting(self, *args, _original=original, _name=name, **kwargs):
            caller = traceback.extract_stack(limit=2)[0]
            if "hf_unlearn" in caller.filename and "tests" not in caller.filename:
                reads.append(f"{caller.name}:{_name}")
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counting)
    args = config(
        tmp_path,
        method="masc",
        gradient_surgery=surgery,
        max_steps=6,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=2,
        logging_steps=1000,
    )
    trainer = UnlearnTrainer(model=fresh(memorized_state), args=args, train_dataset=FORGET, retain_dataset=RETAIN)
    reads.clear()  # what the constructor read while checking the data
    original_step = UnlearnTrainer.training_step
    inside = []

    def step(self, *a, **k):
        start = len(reads)
        result = original_step(self, *a, **k)
        inside.extend(reads[start:])
        return result

    monkeypatch.setattr(UnlearnTrainer, "training_step", step)
    trainer.train()
    assert inside == ["end_of_step:__bool__"] * 6  # LossTracker.end_of_step: the non-finite-loss check
