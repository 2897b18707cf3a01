"""Each objective against a hand computation on a 2-token answer, and each baseline's defining behaviour."""

import json
import math
import types

import pytest
import torch
from conftest import forget_set, make_example, make_tiny_model, retain_set

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.benchmarks import build_tokenizer, tiny_model
from hf_unlearn.objectives import (
    FORGET_OBJECTIVES,
    RETAIN_OBJECTIVES,
    LossInputs,
    objective_hyperparameters,
    resolve_hyperparameters,
)
from hf_unlearn.objectives.classic import rmu_direction
from hf_unlearn.objectives.masc.loss import rival_kl

# One sequence: a prompt token, then a 2-token answer (labels 1 then 2). Position t predicts token t + 1.
LOGITS = torch.tensor([[[2.0, 1.0, 0.0, -1.0], [0.5, 0.0, 1.5, -0.5], [0.0, 0.0, 0.0, 0.0]]])
REFERENCE = torch.tensor([[[1.0, 1.0, 1.0, 1.0], [0.0, 1.0, 2.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
LABELS = torch.tensor([[-100, 1, 2]])
CONFIG = types.SimpleNamespace(
    masc_k=2,
    masc_beta=1.0,
    masc_tau=0.0,
    masc_eta=0.5,
    masc_threshold="rho",
    masc_hinge="one_sided",
    competitor_source="self",
    competitor_delta=None,
    masc_rival_kl=0.0,
    masc_rival_temperature=1.0,
    match_prompt_copies=False,
    seed=0,
)


def log_softmax(row):
    z = math.log(sum(math.exp(v) for v in row))
    return [v - z for v in row]


def token_log_probs(logits):
    return [log_softmax(logits[0][0].tolist())[1], log_softmax(logits[0][1].tolist())[2]]


LOGP = token_log_probs(LOGITS)
LOGP_REF = token_log_probs(REFERENCE)


def declared(registry, name, **given):
    """The hyperparameters the objective gets under the trainer: its declared defaults updated with ``given``."""
    return resolve_hyperparameters(registry[name], given, "kwargs")


def run(registry, name, hyperparameters=None, **extra):
    values = hyperparameters if hyperparameters is not None else declared(registry, name)
    inputs = LossInputs(
        logits=LOGITS, labels=LABELS, config=CONFIG, reference_logits=REFERENCE, hyperparameters=values, **extra
    )
    return registry[name].fn(inputs).item()


def test_ga_and_nll():
    nll = -(LOGP[0] + LOGP[1]) / 2
    assert run(FORGET_OBJECTIVES, "ga") == pytest.approx(-nll, rel=1e-6)
    assert run(RETAIN_OBJECTIVES, "nll") == pytest.approx(nll, rel=1e-6)


def test_npo():
    ratio = sum(LOGP) - sum(LOGP_REF)
    expected = -(2 / 0.1) * math.log(1 / (1 + math.exp(0.1 * ratio)))
    assert run(FORGET_OBJECTIVES, "npo") == pytest.approx(expected, rel=1e-6)


def test_simnpo():
    mean_nll = -sum(LOGP) / 2
    expected = -(2 / 4.5) * math.log(1 / (1 + math.exp(-4.5 * mean_nll)))
    assert run(FORGET_OBJECTIVES, "simnpo") == pytest.approx(expected, rel=1e-6)
    assert not FORGET_OBJECTIVES["simnpo"].needs_reference(CONFIG)


def test_kl_retain():
    expected = 0.0
    for position in (0, 1):
        p = [math.exp(v) for v in log_softmax(REFERENCE[0][position].tolist())]
        q = log_softmax(LOGITS[0][position].tolist())
        expected += sum(pi * (math.log(pi) - qi) for pi, qi in zip(p, q))
    assert run(RETAIN_OBJECTIVES, "kl") == pytest.approx(expected / 2, rel=1e-6)


def test_undial():
    expected = 0.0
    for position, target in ((0, 1), (1, 2)):
        adjusted = REFERENCE[0][position].tolist()
        adjusted[target] -= 10.0
        p = [math.exp(v) for v in log_softmax(adjusted)]
        q = log_softmax(LOGITS[0][position].tolist())
        expected += -sum(pi * qi for pi, qi in zip(p, q))
    assert run(FORGET_OBJECTIVES, "undial") == pytest.approx(expected / 2, rel=1e-6)


def test_masc_hinge():
    # k = 2 competitors from the current model; tau = 0, eta = 0.5: loss = mean relu(m + 0.5) / 0.5.
    expected = 0.0
    for position, target in ((0, 1), (1, 2)):
        row = LOGITS[0][position].tolist()
        others = sorted((v for i, v in enumerate(row) if i != target), reverse=True)[:2]
        margin = row[target] - math.log(sum(math.exp(v) for v in others))
        expected += max(margin + 0.5, 0.0) / 0.5
    assert run(FORGET_OBJECTIVES, "masc") == pytest.approx(expected / 2, rel=1e-6)


def hand_masc_margins() -> list[float]:
    """The restricted margins (k = 2 self competitors) of the two answer tokens of LOGITS, by hand."""
    margins = []
    for position, target in ((0, 1), (1, 2)):
        row = LOGITS[0][position].tolist()
        others = sorted((v for i, v in enumerate(row) if i != target), reverse=True)[:2]
        margins.append(row[target] - math.log(sum(math.exp(v) for v in others)))
    return margins


def test_masc_hinge_with_calibrated_thresholds():
    """Each answer token's threshold is the never-seen margin at its rank: of the two answer tokens, the lower
    margin gets the calibration set's minimum, the higher its maximum."""
    calibration = torch.tensor([-8.0, -4.0, 0.0, 2.0, 6.0])
    margins = hand_masc_margins()
    low, high = sorted(margins)
    expected = (max(low - (-8.0 - 0.5), 0.0) + max(high - (6.0 - 0.5), 0.0)) / 0.5 / 2
    assert expected > 0
    config = types.SimpleNamespace(**{**vars(CONFIG), "masc_threshold": "calibration"})
    inputs = LossInputs(logits=LOGITS, labels=LABELS, config=config, calibration_margins=calibration)
    assert FORGET_OBJECTIVES["masc"].fn(inputs).item() == pytest.approx(expected, rel=1e-6)
    assert FORGET_OBJECTIVES["masc"].needs_calibration(config) and not FORGET_OBJECTIVES["masc"].needs_calibration(
        CONFIG
    )


def test_two_sided_masc_hinge_pulls_back_a_token_below_its_counterpart():
    """masc_hinge='two_sided' with calibrated thresholds: the high token is pushed down to its counterpart (not to
    counterpart - eta), the low one, more than eta below its counterpart, is pulled back; with rho: one-sided."""
    margins = hand_masc_margins()
    low, high = sorted(margins)
    calibration = torch.tensor([low + 0.8, high - 0.4])  # low: 0.8 below its counterpart; high: 0.4 above its own
    expected = (0.4 + (0.8 - 0.5)) / 0.5 / 2
    config = types.SimpleNamespace(**{**vars(CONFIG), "masc_threshold": "calibration", "masc_hinge": "two_sided"})
    inputs = LossInputs(logits=LOGITS, labels=LABELS, config=config, calibration_margins=calibration)
    assert FORGET_OBJECTIVES["masc"].fn(inputs).item() == pytest.approx(expected, rel=1e-6)
    one_sided = types.SimpleNamespace(**{**vars(config), "masc_hinge": "one_sided"})
    inputs = LossInputs(logits=LOGITS, labels=LABELS, config=one_sided, calibration_margins=calibration)
    assert FORGET_OBJECTIVES["masc"].fn(inputs).item() == pytest.approx((0.4 + 0.5) / 0.5 / 2, rel=1e-6)
    rho = types.SimpleNamespace(**{**vars(CONFIG), "masc_hinge": "two_sided"})
    inputs = LossInputs(logits=LOGITS, labels=LABELS, config=rho)
    assert FORGET_OBJECTIVES["masc"].fn(inputs).item() == pytest.approx(run(FORGET_OBJECTIVES, "masc"), rel=1e-6)


def hand_rival_kl(position: int, target: int, logits: torch.Tensor = LOGITS, temperature: float = 1.0) -> float:
    """KL(reference || model) of the two distributions over the tokens other than ``target``, by definition; the
    reference's logits divided by ``temperature`` first."""

    def others(row):
        rest = [v for i, v in enumerate(row) if i != target]
        z = math.log(sum(math.exp(v) for v in rest))
        return [v - z for v in rest]

    p = others([v / temperature for v in REFERENCE[0][position].tolist()])
    q = others(logits[0][position].tolist())
    return sum(math.exp(a) * (a - b) for a, b in zip(p, q))


def test_masc_rival_kl_keeps_the_other_tokens_distribution_of_the_start_model():
    """masc_rival_kl (beyond the paper): hinge + weight * mean over answer tokens of KL(start || model) over the
    tokens other than the answer token, by hand; it needs the start model only when on; it leaves the answer token's
    own logit without gradient (the hinge alone moves it), and a shift of every other logit by one number costs
    nothing (only their shape is held)."""
    config = types.SimpleNamespace(**{**vars(CONFIG), "masc_rival_kl": 2.0})
    kl = (hand_rival_kl(0, 1) + hand_rival_kl(1, 2)) / 2
    assert kl > 0.05
    assert run(FORGET_OBJECTIVES, "masc") + 2.0 * kl == pytest.approx(
        FORGET_OBJECTIVES["masc"].fn(LossInputs(logits=LOGITS, labels=LABELS, config=config,
                                                reference_logits=REFERENCE)).item(), rel=1e-6)  # fmt: skip
    assert FORGET_OBJECTIVES["masc"].needs_reference(config) and not FORGET_OBJECTIVES["masc"].needs_reference(CONFIG)
    logits = LOGITS.clone().requires_grad_(True)
    rival_kl(logits[:, :-1], REFERENCE[:, :-1], LABELS[:, 1:]).backward()
    assert logits.grad[0, 0, 1].item() == 0.0 and logits.grad[0, 1, 2].item() == 0.0
    assert logits.grad[0, :2].abs().sum().item() > 0.01 and torch.isfinite(logits.grad).all()
    shifted = LOGITS.clone()
    shifted[0, 0, [0, 2, 3]] += 3.0
    assert rival_kl(shifted[:, :-1], REFERENCE[:, :-1], LABELS[:, 1:]).item() == pytest.approx(kl, rel=1e-5)
    assert hand_rival_kl(0, 1, REFERENCE) == pytest.approx(0.0, abs=1e-12)
    for dtype in (torch.float64, torch.bfloat16):  # a float64 model keeps its precision; bf16 logits are upcast
        value = rival_kl(LOGITS[:, :-1].to(dtype), REFERENCE[:, :-1].to(dtype), LABELS[:, 1:]).item()
        assert value == pytest.approx(kl, rel=1e-6 if dtype == torch.float64 else 2e-2)


def test_masc_rival_temperature_sharpens_the_start_distribution_the_kl_holds():
    """masc_rival_temperature (beyond the paper): the KL's target is the start model's distribution over the other
    tokens at temperature T, by hand; at T = 1 it is the plain rival KL, and a sharper target costs more here."""
    config = types.SimpleNamespace(**{**vars(CONFIG), "masc_rival_kl": 2.0, "masc_rival_temperature": 0.5})
    kl = (hand_rival_kl(0, 1, temperature=0.5) + hand_rival_kl(1, 2, temperature=0.5)) / 2
    plain = (hand_rival_kl(0, 1) + hand_rival_kl(1, 2)) / 2
    assert kl > plain + 0.05
    assert run(FORGET_OBJECTIVES, "masc") + 2.0 * kl == pytest.approx(
        FORGET_OBJECTIVES["masc"].fn(LossInputs(logits=LOGITS, labels=LABELS, config=config,
                                                reference_logits=REFERENCE)).item(), rel=1e-6)  # fmt: skip
    assert rival_kl(LOGITS[:, :-1], REFERENCE[:, :-1], LABELS[:, 1:], temperature=0.5).item() == pytest.approx(kl)


@pytest.mark.parametrize("temperature", [0.0, -0.5, float("nan"), float("inf")])
def test_a_rival_temperature_that_is_not_a_positive_number_is_refused(tmp_path, temperature):
    with pytest.raises(ValueError, match="masc_rival_temperature must be a finite number > 0"):
        UnlearnConfig(output_dir=str(tmp_path), report_to="none", masc_rival_temperature=temperature)


@pytest.mark.parametrize("weight", [-1.0, float("nan"), float("inf")])
def test_masc_rival_kl_refuses_a_weight_that_is_not_a_finite_number_at_least_zero(weight):
    with pytest.raises(ValueError, match="masc_rival_kl must be a finite number >= 0"):
        UnlearnConfig(output_dir="x", method="masc", masc_rival_kl=weight, report_to="none")


def test_idk_dpo():
    refusal_logits = torch.tensor([[[0.0, 0.0, 3.0, 0.0], [1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    refusal_labels = torch.tensor([[-100, 2, 1]])
    refusal = LossInputs(logits=refusal_logits, labels=refusal_labels, config=CONFIG, reference_logits=REFERENCE)
    chosen = (
        log_softmax(refusal_logits[0][0].tolist())[2]
        + log_softmax(refusal_logits[0][1].tolist())[1]
        - log_softmax(REFERENCE[0][0].tolist())[2]
        - log_softmax(REFERENCE[0][1].tolist())[1]
    )
    rejected = sum(LOGP) - sum(LOGP_REF)
    expected = -math.log(1 / (1 + math.exp(-0.1 * (chosen - rejected))))
    assert run(FORGET_OBJECTIVES, "idk_dpo", refusal=refusal) == pytest.approx(expected, rel=1e-6)


def rmu_reference_direction(size, seed):
    """RMU's fixed random unit vector u (Li et al., "The WMDP Benchmark", arXiv 2403.03218, §5): each coordinate
    drawn uniformly from [0, 1) (torch.rand, seeded with ``seed``), then the vector divided by its norm."""
    u = torch.rand(size, generator=torch.Generator().manual_seed(seed)).tolist()
    norm = math.sqrt(sum(v * v for v in u))
    return [v / norm for v in u]


def test_rmu_terms():
    hidden = (torch.zeros(1, 3, 4), torch.tensor([[[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0], [9.0, 9.0, 9.0, 9.0]]]))
    mask = torch.tensor([[1, 1, 0]])  # the third token is padding
    u = rmu_reference_direction(4, CONFIG.seed)
    assert rmu_direction(4, 0, torch.device("cpu")).tolist() == pytest.approx(u, rel=1e-6)
    assert rmu_direction(4, 1, torch.device("cpu")).tolist() != pytest.approx(u)  # the seed picks the direction
    # Forget term: the mean over unpadded tokens of mean_d (h_d - c u_d)^2, with the steering coefficient c = 2.
    rows = [[1.0, 0.0, 0.0, 0.0], [0.0, 2.0, 0.0, 0.0]]
    expected = sum(sum((h - 2.0 * ud) ** 2 for h, ud in zip(row, u)) / 4 for row in rows) / 2
    forget_values = declared(FORGET_OBJECTIVES, "rmu", layer=0, steering_coefficient=2.0)
    value = run(FORGET_OBJECTIVES, "rmu", forget_values, hidden_states=hidden, attention_mask=mask)
    assert value == pytest.approx(expected, rel=1e-6)
    reference = (hidden[0], torch.zeros(1, 3, 4))
    retain = run(
        RETAIN_OBJECTIVES, "rmu_retain", declared(RETAIN_OBJECTIVES, "rmu_retain", layer=0), hidden_states=hidden,
        reference_hidden_states=reference, attention_mask=mask,
    )  # fmt: skip
    assert retain == pytest.approx((0.25 + 1.0) / 2, rel=1e-6)


def test_npo_gradient_points_like_ga_at_the_start():
    """At theta = theta_ref NPO's gradient is the gradient of log pi(y|x): GA's direction (cosine 1)."""
    model = make_tiny_model()
    examples = [make_example(i) for i in range(4)]  # equal answer lengths: the scales differ by a constant
    from hf_unlearn.data.pairing import pad_examples

    batch = pad_examples(examples, 0)
    params = [p for p in model.parameters() if p.requires_grad]

    def gradient(name):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        inputs = LossInputs(
            logits=logits, labels=batch["labels"], config=CONFIG, reference_logits=logits.detach(),
            hyperparameters=declared(FORGET_OBJECTIVES, name),
        )  # fmt: skip
        grads = torch.autograd.grad(FORGET_OBJECTIVES[name].fn(inputs), params)
        return torch.cat([g.reshape(-1) for g in grads])

    npo, ga = gradient("npo"), gradient("ga")
    assert torch.nn.functional.cosine_similarity(npo, ga, dim=0).item() == pytest.approx(1.0, abs=1e-5)
    assert (npo.norm() / ga.norm()).item() == pytest.approx(6.0, rel=1e-4)  # 6 answer tokens per sequence


FORGET, RETAIN = forget_set(), retain_set()


def args(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path),
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        max_steps=10,
        learning_rate=3e-3,
        probe_interval=0,
        stop_at_target=False,
    )
    values.update(overrides)
    return UnlearnConfig(**values)


def test_simnpo_makes_no_reference_copy(tmp_path):
    trainer = UnlearnTrainer(make_tiny_model(), args(tmp_path, method="simnpo"), FORGET, RETAIN)
    assert trainer.ref_model is None and trainer.args.forget_weight == 0.125
    trainer.train()


def test_npo_stops_on_violation(tmp_path, memorized_llama):
    trainer = UnlearnTrainer(
        memorized_llama,
        # NPO has no retain term: at this learning rate it drags the retain probability to a quarter of its start,
        # which the default utility floor calls a failure (tested in test_stopping.py); here only the stop matters.
        args(
            tmp_path,
            method="npo",
            stop_at_target=True,
            probe_interval=2,
            stop_alpha=0.3,
            max_steps=60,
            utility_floor=None,
        ),  # fmt: skip
        FORGET,
        RETAIN,
    )
    trainer.train()
    callback = trainer.stopping_callback
    assert callback.stopped_early and trainer.state.global_step == callback.stop_step < 60
    assert callback.last_violation_rate <= 0.3


def test_idk_dpo_comes_to_prefer_the_refusal(tmp_path):
    tokenizer = build_tokenizer()
    from hf_unlearn.benchmarks import load_split
    from hf_unlearn.data import refusal_example
    from hf_unlearn.data.examples import build_qa_dataset

    forget = build_qa_dataset(load_split("forget05"), tokenizer)
    retain = build_qa_dataset(load_split("retain95").select(range(20)), tokenizer)
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    trainer = UnlearnTrainer(
        model, args(tmp_path, method="idk_dpo", max_steps=15), forget, retain, processing_class=tokenizer
    )

    def preference():
        from hf_unlearn.data.pairing import pad_examples
        from hf_unlearn.objectives import sequence_log_prob

        chosen = pad_examples([refusal_example(tokenizer, e, "I don't know.") for e in forget], tokenizer.pad_token_id)
        rejected = pad_examples([{k: e[k] for k in ("input_ids", "labels")} for e in forget], tokenizer.pad_token_id)
        with torch.no_grad():
            score = [
                sequence_log_prob(
                    trainer.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["labels"]
                )
                .mean()
                .item()
                for b in (chosen, rejected)
            ]
        return score[0] - score[1]

    before = preference()
    trainer.train()
    assert preference() > before + 1.0


def test_rmu_changes_only_the_configured_mlp_weights(tmp_path):
    model = make_tiny_model("llama")  # 2 layers: the layer defaults to 0, trainable layers [0]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = args(tmp_path, method="rmu")
    trainer = UnlearnTrainer(model, config, FORGET, RETAIN)
    # The layers chosen for the model are the values both terms read, and the record's; the caller's config is kept.
    assert trainer.objective_kwargs == {
        "forget": {"layer": 0, "trainable_layers": [0], "steering_coefficient": 6.5},
        "retain": {"layer": 0},
    }
    assert trainer.record.hyperparameters["forget_loss_kwargs"]["layer"] == 0 and config.forget_loss_kwargs is None
    trainer.train()
    changed = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {n for n in before if n.startswith("model.layers.0.mlp.")}


def test_rmu_on_gpt2_names_and_bad_layer(tmp_path):
    model = make_tiny_model("gpt2")
    trainer = UnlearnTrainer(
        model, args(tmp_path, method="rmu", forget_loss_kwargs={"trainable_layers": [1], "layer": 0}), FORGET, RETAIN
    )
    assert {n for n, p in trainer.model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if n.startswith("transformer.h.1.mlp.")
    }
    with pytest.raises(ValueError, match="RMU layer=5 but the model has 2 layers"):
        # given to the retain term, the layer is the forget term's too (RMU's terms share it)
        bad = args(tmp_path, method="rmu", retain_loss_kwargs={"layer": 5})
        UnlearnTrainer(make_tiny_model("gpt2"), bad, FORGET, RETAIN)


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_rmu_refuses_the_last_layer_whose_hidden_state_is_after_the_final_norm(tmp_path, architecture):
    """hidden_states[L] is the final-norm output, not decoder layer L-1's: steering it would steer the wrong thing."""
    model = make_tiny_model(architecture)  # 2 layers
    inputs = torch.tensor([[1, 2, 3, 4]])
    captured = {}
    layers = model.model.layers if architecture == "llama" else model.transformer.h
    hooks = [
        layer.register_forward_hook(lambda m, i, o, n=n: captured.__setitem__(n, o[0] if isinstance(o, tuple) else o))
        for n, layer in enumerate(layers)
    ]
    hidden = model(input_ids=inputs, output_hidden_states=True).hidden_states
    for hook in hooks:
        hook.remove()
    torch.testing.assert_close(hidden[1], captured[0])  # layer 0's output: what RMU steers for layer=0
    assert not torch.allclose(hidden[2], captured[1])  # the last entry is after the final norm
    with pytest.raises(ValueError, match="RMU layer=1 is the last decoder layer.*between 0 and 0"):
        UnlearnTrainer(model, args(tmp_path, method="rmu", forget_loss_kwargs={"layer": 1}), FORGET, RETAIN)


def test_a_registered_objective_runs_with_its_own_needs_and_lands_in_the_record(tmp_path, memorized_llama):
    """A user's objective: the trainer supplies what the registration asks for (reference logits, the sequence
    count of the window), calls its prepare hook, and records its hyperparameters and paper. No method name is
    spelled anywhere in the trainer."""
    from hf_unlearn.objectives import Paper, register_forget_objective, sequence_log_prob

    prepared, seen = [], []

    @register_forget_objective(
        "test_log_ratio",
        needs_reference=True,
        paper=Paper("A test objective", "https://example.org/paper"),
        hyperparameters={"beta": 0.1},
        normalized_by="sequences",
        prepare=lambda model, config: prepared.append(type(model).__name__),
    )
    def log_ratio(inputs):
        seen.append((inputs.reference_logits is not None, int(inputs.num_items), inputs.hyperparameters["beta"]))
        ratio = sequence_log_prob(inputs.logits, inputs.labels) - sequence_log_prob(
            inputs.reference_logits, inputs.labels
        )
        return ratio.sum() / inputs.num_items

    try:
        trainer = UnlearnTrainer(
            memorized_llama,
            args(tmp_path, forget_loss="test_log_ratio", retain_loss="none", max_steps=2,
                 forget_loss_kwargs={"beta": 0.3}, per_device_train_batch_size=4),
            FORGET,
        )  # fmt: skip
        trainer.train()
    finally:
        del FORGET_OBJECTIVES["test_log_ratio"]
    assert prepared == ["LlamaForCausalLM"]
    assert seen == [(True, 4, 0.3), (True, 4, 0.3)]  # reference logits, the window's sequence count, every step
    record = trainer.record
    assert record.forget_objective == "test_log_ratio" and record.hyperparameters["forget_loss_kwargs"] == {
        "beta": 0.3
    }
    assert {"title": "A test objective", "url": "https://example.org/paper", "authors": ""} in record.papers
    with pytest.raises(TypeError, match="Unknown objective option"):
        register_forget_objective("bad", normalised_by="sequences")
    with pytest.raises(ValueError, match="normalized_by must be one of"):
        register_forget_objective("bad", normalized_by="words")


# --- the 2025 methods (issue 17) ------------------------------------------------------------------------------


#: The values these tests give the 2025 methods' declared hyperparameters (not the defaults, so that each one shows).
NEW_VALUES = {
    "wga": {"beta": 2.0},
    "satimp": {"beta1": 3.0, "beta2": 2.0},
    "ce_u": {"ignore_first_n_answer_tokens": 0},
    "altpo": {"beta": 0.5},
    "pdu_dual": {"dual_init": 3.0, "dual_step": 2.0},
}


def new_config(**pdu_values):
    """A PDU run's configuration, as its state hooks read it: ``retain_loss_kwargs`` NEW_VALUES' updated with
    ``pdu_values``."""
    kwargs = {**NEW_VALUES["pdu_dual"], **pdu_values}
    return types.SimpleNamespace(
        **vars(CONFIG), objectives=("pdu", "pdu_dual"), forget_loss_kwargs=None, retain_loss_kwargs=kwargs
    )


def new_inputs(name, registry, config, hyperparameters, **extra):
    """The objective's inputs with its NEW_VALUES (PDU's retain term: its configuration's), or ``hyperparameters``."""
    config = config or new_config()
    if hyperparameters is None:
        hyperparameters = declared(registry, name, **NEW_VALUES.get(name, {}))
        if name == "pdu_dual":
            hyperparameters = objective_hyperparameters(config, "retain")
    return dict(config=config, reference_logits=REFERENCE, hyperparameters=hyperparameters, **extra)


def loss_and_grad(name, registry=FORGET_OBJECTIVES, config=None, hyperparameters=None, **extra):
    logits = LOGITS.clone().requires_grad_(True)
    inputs = LossInputs(logits=logits, labels=LABELS, **new_inputs(name, registry, config, hyperparameters, **extra))
    loss = registry[name].fn(inputs)
    loss.backward()
    return loss.item(), logits.grad


def softmax(row):
    return [math.exp(v) for v in log_softmax(row)]


def test_wga_weights_each_token_by_its_probability_without_gradient_through_the_weight():
    p = [math.exp(v) for v in LOGP]
    loss, grad = loss_and_grad("wga")
    assert loss == pytest.approx((p[0] ** 2 * LOGP[0] + p[1] ** 2 * LOGP[1]) / 2, rel=1e-6)
    # d/dz of sg(p)^beta log p = p^beta (onehot(y) - softmax(z)) / 2 per position: the weight carries no gradient.
    for position, target in ((0, 1), (1, 2)):
        q = softmax(LOGITS[0][position].tolist())
        expected = [p[position] ** 2 * ((v == target) - q[v]) / 2 for v in range(4)]
        assert grad[0][position].tolist() == pytest.approx(expected, rel=1e-5)


def test_satimp_weights_by_saturation_and_importance():
    p = [math.exp(v) for v in LOGP]
    expected = sum(p[i] ** 3 * (1 - p[i]) ** 2 * LOGP[i] for i in (0, 1)) / 2
    assert run_new("satimp") == pytest.approx(expected, rel=1e-6)
    # The paper's reference code weighs the retain term 0.1.
    assert UnlearnConfig(output_dir="x", method="satimp", report_to="none").retain_weight == 0.1
    assert UnlearnConfig(output_dir="x", method="satimp", report_to="none", retain_weight=2.0).retain_weight == 2.0


def run_new(name, registry=FORGET_OBJECTIVES, config=None, hyperparameters=None, **extra):
    inputs = LossInputs(logits=LOGITS, labels=LABELS, **new_inputs(name, registry, config, hyperparameters, **extra))
    return registry[name].fn(inputs).item()


def test_ce_u_is_cross_entropy_to_the_distribution_without_the_true_token():
    def position_loss(position, target):
        row = LOGITS[0][position].tolist()
        rest = [v if i != target else float("-inf") for i, v in enumerate(row)]
        z = math.log(sum(math.exp(v) for v in rest if v != float("-inf")))
        q = [0.0 if v == float("-inf") else math.exp(v - z) for v in rest]
        return -sum(qi * li for qi, li in zip(q, log_softmax(row))), q

    (first, q0), (second, q1) = position_loss(0, 1), position_loss(1, 2)
    loss, grad = loss_and_grad("ce_u")
    assert loss == pytest.approx((first + second) / 2, rel=1e-6)
    # Its gradient on the logits is (p - q) / 2 at each position: the true token's part is p_y, bounded.
    for position, q in ((0, q0), (1, q1)):
        p = softmax(LOGITS[0][position].tolist())
        assert grad[0][position].tolist() == pytest.approx([(pi - qi) / 2 for pi, qi in zip(p, q)], rel=1e-5)
    # The first answer token is skipped with ignore_first_n_answer_tokens=1 (the default).
    assert run_new("ce_u", hyperparameters=declared(FORGET_OBJECTIVES, "ce_u")) == pytest.approx(second, rel=1e-6)
    assert UnlearnConfig(output_dir="x", method="ce_u", report_to="none").objectives == ("ce_u", "none")


def test_altpo_prefers_the_alternate_answer():
    alternate_logits = torch.tensor([[[0.0, 0.0, 3.0, 0.0], [1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]])
    alternate_labels = torch.tensor([[-100, 2, 1]])
    alternate = LossInputs(logits=alternate_logits, labels=alternate_labels, config=CONFIG, reference_logits=REFERENCE)
    chosen = (
        log_softmax(alternate_logits[0][0].tolist())[2]
        + log_softmax(alternate_logits[0][1].tolist())[1]
        - log_softmax(REFERENCE[0][0].tolist())[2]
        - log_softmax(REFERENCE[0][1].tolist())[1]
    )
    rejected = sum(LOGP) - sum(LOGP_REF)
    expected = -(2 / 0.5) * math.log(1 / (1 + math.exp(-0.5 * (chosen - rejected))))
    assert run_new("altpo", refusal=alternate) == pytest.approx(expected, rel=1e-6)


def test_pdu_forget_flattens_the_logits_at_answer_positions():
    expected = sum((max(row) - sum(row) / 4) ** 2 for row in (LOGITS[0][0].tolist(), LOGITS[0][1].tolist())) / 2
    assert run_new("pdu") == pytest.approx(expected, rel=1e-6)


def test_pdu_dual_variable_scales_the_retain_term_and_ascends_on_the_constraint():
    objective = RETAIN_OBJECTIVES["pdu_dual"]
    config = new_config()
    state = objective.initial_state(config)
    nll = -(LOGP[0] + LOGP[1]) / 2
    assert run_new("pdu_dual", RETAIN_OBJECTIVES, config, state=state) == pytest.approx(3.0 * nll, rel=1e-6)
    run_new("pdu_dual", RETAIN_OBJECTIVES, config, state=state)  # a second micro-batch of the same step
    objective.update_state(state, config, 1, float)
    # epsilon defaults to 1.1 x the first step's retain loss, so lambda moves by 2 x (nll - 1.1 nll).
    assert state["epsilon"] == pytest.approx(1.1 * nll, rel=1e-6) and "_pending" not in state
    assert state["dual"] == pytest.approx(3.0 + 2.0 * (nll - 1.1 * nll), rel=1e-6)
    # Above the bound lambda grows; it never goes below 0; warmup steps leave it alone.
    state["epsilon"] = nll - 1.0
    run_new("pdu_dual", RETAIN_OBJECTIVES, config, state=state)
    before = state["dual"]
    objective.update_state(state, config, 2, float)
    assert state["dual"] == pytest.approx(before + 2.0, rel=1e-6)
    state["epsilon"] = nll + 100.0
    run_new("pdu_dual", RETAIN_OBJECTIVES, config, state=state)
    objective.update_state(state, config, 3, float)
    assert state["dual"] == 0.0
    warm = objective.initial_state(new_config(dual_warmup_steps=5))
    run_new("pdu_dual", RETAIN_OBJECTIVES, new_config(dual_warmup_steps=5), state=warm)
    objective.update_state(warm, new_config(dual_warmup_steps=5), 5, float)
    assert warm["dual"] == 3.0 and warm["epsilon"] is not None


def test_pdu_dual_variable_survives_a_resume(tmp_path, memorized_llama_state, forget_examples, retain_examples):
    """The dual variable is saved with each checkpoint: a run resumed at step 3 ends with the same lambda and
    weights as an uninterrupted one (restarting lambda from its initial value would not)."""
    forget, retain = forget_examples, retain_examples

    def trainer(output_dir):
        model = make_tiny_model()
        model.load_state_dict(memorized_llama_state)
        settings = dict(method="pdu", max_steps=6, save_strategy="steps", save_steps=3, learning_rate=1e-2)
        # A bound below the start's retain loss: the constraint is violated, so lambda climbs every step.
        return UnlearnTrainer(
            model, args(output_dir, **settings, retain_loss_kwargs={"epsilon": 0.0, "dual_step": 0.5}), forget, retain
        )

    uninterrupted = trainer(tmp_path / "a")
    uninterrupted.train()
    dual = uninterrupted.objective_state_callback.states["pdu_dual"]
    assert dual["updates"] == 6 and dual["dual"] > 1.0 + 6 * 0.5 * 0.001
    saved = json.loads((tmp_path / "a" / "checkpoint-3" / "trainer_state.json").read_text())
    saved_dual = saved["stateful_callbacks"]["ObjectiveStateCallback"]["attributes"]["states"]["pdu_dual"]
    assert 1.0 < saved_dual["dual"] < dual["dual"] and saved_dual["updates"] == 3

    resumed = trainer(tmp_path / "b")
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"))
    assert resumed.objective_state_callback.states["pdu_dual"]["dual"] == pytest.approx(dual["dual"], rel=1e-5)
    for a, b in zip(uninterrupted.model.parameters(), resumed.model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert resumed.record.hyperparameters["retain_loss_kwargs"]["dual_step"] == 0.5
    assert resumed.record.objective_state["pdu_dual"]["dual"] == pytest.approx(dual["dual"], rel=1e-5)


def test_altpo_takes_alternates_from_the_records_and_comes_to_prefer_them(tmp_path):
    from hf_unlearn.benchmarks import load_split
    from hf_unlearn.data import refusal_example
    from hf_unlearn.data.examples import build_qa_dataset
    from hf_unlearn.data.pairing import pad_examples
    from hf_unlearn.objectives import sequence_log_prob

    tokenizer = build_tokenizer()
    records = load_split("forget05")
    forget = build_qa_dataset(records, tokenizer)
    retain = build_qa_dataset(load_split("retain95").select(range(20)), tokenizer)
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    trainer = UnlearnTrainer(
        model, args(tmp_path, method="altpo", max_steps=15), forget, retain, processing_class=tokenizer
    )
    # Example i's alternate is its (i mod 3)-th perturbed answer.
    first = trainer.train_dataset.refusal[1]
    expected = refusal_example(tokenizer, forget[1], records[1]["perturbed_answer"][1])
    assert first["input_ids"] == expected["input_ids"]

    def preference():
        chosen = pad_examples(
            [refusal_example(tokenizer, e, r["perturbed_answer"][0]) for e, r in zip(forget, records)],
            tokenizer.pad_token_id,
        )
        rejected = pad_examples([{k: e[k] for k in ("input_ids", "labels")} for e in forget], tokenizer.pad_token_id)
        with torch.no_grad():
            return [
                sequence_log_prob(
                    trainer.model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits, b["labels"]
                )
                .mean()
                .item()
                for b in (chosen, rejected)
            ]

    before = preference()
    trainer.train()
    after = preference()
    assert after[0] - after[1] > before[0] - before[1] + 1.0
    # Without the column, the error names it before any weight changes.
    bare = build_qa_dataset(records.remove_columns(["perturbed_answer"]), tokenizer)
    with pytest.raises(ValueError, match="column 'perturbed_answer'"):
        UnlearnTrainer(model, args(tmp_path, method="altpo"), bare, retain, processing_class=tokenizer)


@pytest.mark.parametrize("method", ["wga", "satimp", "ce_u", "altpo", "pdu"])
def test_new_methods_run_under_lora_with_the_stopping_rule_and_surgery(tmp_path, method):
    from peft import LoraConfig

    from hf_unlearn.benchmarks import load_split
    from hf_unlearn.data.examples import build_qa_dataset

    tokenizer = build_tokenizer()
    forget = build_qa_dataset(load_split("forget05"), tokenizer)
    retain = build_qa_dataset(load_split("retain95").select(range(8)), tokenizer)
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    surgery = "sum" if method == "ce_u" else "sago"  # CE-U has no retain term to protect
    settings = dict(
        method=method, max_steps=4, probe_interval=2, stop_at_target=True, gradient_surgery=surgery, logging_steps=1
    )
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = UnlearnTrainer(
        model, args(tmp_path, **settings), forget, retain, processing_class=tokenizer, peft_config=lora
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert changed and all("lora_" in n for n in changed)
    assert trainer.record.method == method and trainer.record.adapter == "lora"
    assert trainer.record.probe_history and trainer.record.papers
    # The stopping rule ran and decided: probes at steps 0, 2, 4 until the first one (after the start) whose violation
    # rate is <= stop_alpha, where the run stopped; without one, the budget of 4 steps was used.
    history = trainer.record.probe_history
    alpha = trainer.args.stop_alpha
    met = [h["step"] for h in history if h["step"] > 0 and h["violation_rate"] <= alpha]
    stop = met[0] if met else 4
    assert [h["step"] for h in history] == list(range(0, stop + 1, 2))
    assert trainer.state.global_step == stop and trainer.record.stop_kind == ("target" if met else "budget")
    # The surgery ran on every step: SAGO keeps the retain gradient wherever the two conflict, so the update never
    # points against it (<u, g_r> = sum over conflicts of g_r^2 + sum elsewhere of g_f g_r >= 0).
    logged = [log for log in trainer.state.log_history if "loss" in log]
    assert [log["step"] for log in logged] == list(range(1, stop + 1))
    if surgery == "sago":
        assert all(0 < log["surgery/conflict_fraction"] < 1 for log in logged)
        assert all(log["surgery/cos_update_retain"] >= -1e-6 for log in logged)
    else:
        assert not any(key.startswith("surgery/") for log in logged for key in log)


def test_pdu_dual_update_sees_the_whole_accumulated_batch(
    tmp_path, memorized_llama_state, forget_examples, retain_examples
):
    """The retain loss that moves lambda is the step's: 2 micro-batches of 2 give what one batch of 4 gives."""
    forget, retain = forget_examples, retain_examples

    def first_update(batch_size, accumulation):
        model = make_tiny_model()
        model.load_state_dict(memorized_llama_state)
        settings = dict(
            method="pdu",
            max_steps=1,
            per_device_train_batch_size=batch_size,
            gradient_accumulation_steps=accumulation,
            retain_loss_kwargs={"epsilon": 0.0},
        )
        trainer = UnlearnTrainer(model, args(tmp_path / f"{batch_size}", **settings), forget, retain)
        trainer.train()
        return trainer.objective_state_callback.states["pdu_dual"]

    whole, accumulated = first_update(4, 1), first_update(2, 2)
    assert accumulated["last_retain_loss"] == pytest.approx(whole["last_retain_loss"], rel=1e-5)
    assert accumulated["dual"] == pytest.approx(whole["dual"], rel=1e-5) and whole["dual"] > 1.0


def test_the_preferred_answers_come_from_the_objectives_kwargs(tmp_path):
    """IdkDPO's refusals and AltPO's column are declared hyperparameters (forget_loss_kwargs, issue 56): a given
    value reaches the preferred batch, the record names it, and a bad one is refused by name before training."""
    from hf_unlearn.benchmarks import load_split
    from hf_unlearn.data import refusal_example
    from hf_unlearn.data.examples import build_qa_dataset

    tokenizer = build_tokenizer()
    records = load_split("forget05")
    records = records.add_column("other_answer", [f"Another answer {i}." for i in range(len(records))])
    forget = build_qa_dataset(records, tokenizer)
    retain = build_qa_dataset(load_split("retain95").select(range(8)), tokenizer)
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    refusals = ["No idea at all.", "Ask someone else."]
    trainer = UnlearnTrainer(
        model, args(tmp_path, method="idk_dpo", forget_loss_kwargs={"refusal_answers": refusals}), forget, retain,
        processing_class=tokenizer,
    )  # fmt: skip
    assert (
        trainer.train_dataset.refusal[3]["input_ids"]
        == refusal_example(tokenizer, forget[3], refusals[1])["input_ids"]
    )
    assert trainer._make_record(final=False).hyperparameters["forget_loss_kwargs"]["refusal_answers"] == refusals
    default = UnlearnTrainer(model, args(tmp_path, method="idk_dpo"), forget, retain, processing_class=tokenizer)
    assert (
        default.train_dataset.refusal[0]["input_ids"]
        == refusal_example(tokenizer, forget[0], "I don't know.")["input_ids"]
    )
    trainer = UnlearnTrainer(
        model, args(tmp_path, method="altpo", forget_loss_kwargs={"alternate_column": "other_answer"}), forget, retain,
        processing_class=tokenizer,
    )  # fmt: skip
    assert (
        trainer.train_dataset.refusal[2]["input_ids"]
        == refusal_example(tokenizer, forget[2], "Another answer 2.")["input_ids"]
    )
    for method, kwargs, named in (
        ("idk_dpo", {"refusal_answers": []}, "refusal_answers'] must be a non-empty list"),
        ("idk_dpo", {"refusal_answers": "I don't know."}, "refusal_answers'] must be a list"),
        ("altpo", {"alternate_column": ""}, "alternate_column'] must name a column"),
        ("altpo", {"alternate_column": "missing"}, "column 'missing'"),
    ):
        with pytest.raises(ValueError, match=named):
            UnlearnTrainer(
                model,
                args(tmp_path, method=method, forget_loss_kwargs=kwargs),
                forget,
                retain,
                processing_class=tokenizer,
            )
