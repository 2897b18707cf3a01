import math

import pytest
import torch

from hf_unlearn.objectives.masc.calibration import NeverSeenLevels, calibration_gap
from hf_unlearn.objectives.masc.margin import (
    MarginResult,
    exact_reproduction_bound,
    masc_hinge,
    restricted_margin,
    threshold_from_probability,
    violation_fractions,
)
from hf_unlearn.objectives.masc.stopping import hoeffding_upper_bound


def brute_force_margin(logits, labels, k, beta, teacher=None, delta=None):
    """Plain loop over positions: sort the non-target tokens, take k, apply the delta filter."""
    out = torch.full(labels.shape, float("nan"), dtype=torch.float64)
    chooser = logits if teacher is None else teacher
    for index in torch.cartesian_prod(*[torch.arange(s) for s in labels.shape]).reshape(-1, labels.dim()):
        index = tuple(index.tolist())
        y = labels[index].item()
        if y == -100:
            continue
        scores = chooser[index].double()
        others = [v for v in scores.argsort(descending=True).tolist() if v != y][:k]
        if teacher is not None and delta is not None:
            best = scores[others[0]].item()
            others = [v for v in others if scores[v].item() >= best - delta]
        z = logits[index].double()
        out[index] = beta * z[y] - torch.logsumexp(beta * z[others], dim=0)
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("k,beta", [(1, 1.0), (3, 1.0), (10, 5.0)])
def test_margin_matches_brute_force(seed, k, beta):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, 5, 17, generator=generator) * 3
    labels = torch.randint(0, 17, (2, 5), generator=generator)
    labels[0, :2] = -100
    # Make the target the top logit at some positions and absent from the top k+1 at others.
    labels[1, 0] = logits[1, 0].argmax()
    labels[1, 1] = logits[1, 1].argmin()
    result = restricted_margin(logits, labels, k=k, beta=beta)
    expected = brute_force_margin(logits, labels, k, beta)
    active = labels != -100
    assert torch.equal(result.mask, active)
    torch.testing.assert_close(result.margins[active].double(), expected[active], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("delta", [None, 0.5, 2.0])
def test_teacher_competitors_and_delta_filter_match_brute_force(delta):
    generator = torch.Generator().manual_seed(7)
    logits = torch.randn(3, 4, 13, generator=generator)
    teacher = torch.randn(3, 4, 13, generator=generator)
    labels = torch.randint(0, 13, (3, 4), generator=generator)
    result = restricted_margin(logits, labels, k=4, beta=1.0, teacher_logits=teacher, delta=delta)
    expected = brute_force_margin(logits, labels, 4, 1.0, teacher=teacher, delta=delta)
    torch.testing.assert_close(result.margins.double(), expected, rtol=1e-5, atol=1e-5)


def test_sigmoid_of_margin_is_restricted_posterior():
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0]])
    labels = torch.tensor([0])
    margin = restricted_margin(logits, labels, k=2).margins
    posterior = math.exp(2.0) / (math.exp(2.0) + math.exp(1.0) + math.exp(0.5))
    assert torch.sigmoid(margin).item() == pytest.approx(posterior, rel=1e-6)


def test_k_must_be_smaller_than_vocabulary():
    with pytest.raises(ValueError, match="vocabulary size"):
        restricted_margin(torch.randn(1, 2, 5), torch.tensor([[1, 2]]), k=5)


def test_threshold_from_probability():
    assert threshold_from_probability(0.5) == 0.0
    assert threshold_from_probability(0.7) == pytest.approx(0.8473, abs=1e-4)
    with pytest.raises(ValueError, match="rho"):
        threshold_from_probability(1.0)


def test_hinge_and_its_gradient_vanish_below_tau_minus_eta():
    tau, eta = threshold_from_probability(0.7), 0.25
    # Target logit far below every competitor: margin well under tau - eta.
    logits = torch.tensor([[[-5.0, 3.0, 2.0, 1.0, 0.0]]], requires_grad=True)
    labels = torch.tensor([[0]])
    result = restricted_margin(logits, labels, k=3)
    assert result.margins.item() < tau - eta
    loss = masc_hinge(result, tau, eta)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.count_nonzero(logits.grad) == 0


def test_hinge_above_threshold_is_linear_and_pushes_the_target_down():
    tau, eta = 0.0, 0.5
    logits = torch.tensor([[[4.0, 1.0, 0.0, -1.0]]], requires_grad=True)
    result = restricted_margin(logits, torch.tensor([[0]]), k=2)
    loss = masc_hinge(result, tau, eta)
    assert loss.item() == pytest.approx((result.margins.item() - (tau - eta)) / eta)
    loss.backward()
    assert logits.grad[0, 0, 0] > 0  # gradient descent lowers the target logit
    assert logits.grad[0, 0, 1] < 0 and logits.grad[0, 0, 2] < 0  # and raises the competitors
    assert logits.grad[0, 0, 3] == 0  # outside the competitor set


def test_two_sided_hinge_stops_at_the_counterpart_and_pulls_back_what_fell_below():
    """Per-token thresholds (never-seen counterparts): zero on [tau - eta, tau], the push above tau, a pull below."""
    eta = 0.5
    margins = torch.tensor([[2.0, 0.9, 0.7, -0.6, 0.3]], requires_grad=True)
    tau = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0]])
    result = MarginResult(margins=margins, mask=torch.tensor([[True, True, True, True, False]]))
    loss = masc_hinge(result, tau, eta, two_sided=True)
    # 2.0: 1.0 above its counterpart; 0.9 and 0.7 inside the band; -0.6: 0.1 below the band's floor -0.5; 0.3 unscored
    assert loss.item() == pytest.approx((1.0 / eta + 0.1 / eta) / 4)
    loss.backward()
    assert margins.grad[0, 0] > 0 and margins.grad[0, 3] < 0  # descent pushes the first down, pulls the fourth up
    assert margins.grad[0, 1] == 0 and margins.grad[0, 2] == 0 and margins.grad[0, 4] == 0
    # the paper's one-sided hinge pushes the band's tokens down too, and leaves the fallen one where it is
    one_sided = masc_hinge(MarginResult(margins.detach(), result.mask), tau, eta)
    assert one_sided.item() == pytest.approx((2.0 - 0.5 + 0.9 - 0.5 + 0.7 - 0.5) / eta / 4)


def test_id_matched_counterparts_hold_shared_words_to_their_own_never_seen_level():
    """calibration_match='id_spread': ids the forget answers share with the never-seen answers get that id's mean
    never-seen margin plus its own never-seen deviation at their rank (one occurrence: the median); the forget
    answers' own words are matched by rank to the never-seen answers' own words."""
    from hf_unlearn.objectives.masc.calibration import calibration_gap, matched_thresholds, spread_by_id, token_levels

    never_seen = torch.tensor([5.0, 7.0, -4.0, 8.0, -6.0, -2.0])
    never_seen_ids = torch.tensor([10, 10, 30, 11, 31, 32])  # 10 "was" twice, 11 the end of turn, 30-32 their names
    shared_ids = torch.tensor([10, 11, 12, 20, 21])
    ids, levels, own = token_levels(never_seen, never_seen_ids, shared_ids=shared_ids)
    assert ids.tolist() == [10, 11] and levels.tolist() == [6.0, 8.0] and own.tolist() == [-6.0, -4.0, -2.0]
    spread, offsets = spread_by_id(never_seen, never_seen_ids, ids, levels)
    assert spread.tolist() == [-1.0, 1.0, 0.0] and offsets.tolist() == [0, 2, 3]  # "was" at 5 and 7 around 6
    matched = NeverSeenLevels(ids, levels, spread, offsets)
    forget = torch.tensor([-1.0, 3.0, 0.5, -3.0])
    forget_ids = torch.tensor([10, 11, 20, 21])  # "was" fell to -1 (its level 6), the end to 3 (level 8)
    thresholds = matched_thresholds(forget, own, forget_ids, matched)
    assert thresholds.tolist() == [6.0, 8.0, -2.0, -6.0]  # own words by rank: 0.5 the higher gets -2, -3 gets -6
    by_rank = matched_thresholds(forget, never_seen.sort().values)
    assert by_rank.tolist() != thresholds.tolist()
    # the one-sided gap sees the own words' excess (2.5 and 3.0) and nothing of the fallen shared words
    assert calibration_gap(forget, own, forget_ids, matched) == pytest.approx((2.5 + 3.0) / 4)
    # "was" twice, 7 and 5 under its level: ranked among themselves, against its never-seen deviations -1 and +1
    twice = matched_thresholds(torch.tensor([-1.0, 1.0]), own, torch.tensor([10, 10]), matched)
    assert twice.tolist() == [5.0, 7.0]


def test_hinge_rejects_batches_without_answer_tokens():
    result = restricted_margin(torch.randn(1, 3, 8), torch.full((1, 3), -100), k=2)
    with pytest.raises(ValueError, match="no answer tokens"):
        masc_hinge(result, 0.0, 0.5)


def test_violation_fractions_per_example():
    logits = torch.zeros(2, 3, 6)
    labels = torch.tensor([[1, 2, -100], [3, -100, -100]])
    logits[0, 0, 1] = 5.0  # violates (target far above competitors)
    logits[1, 0, 3] = 5.0
    result = restricted_margin(logits, labels, k=2)
    fractions, lengths = violation_fractions(result, tau=0.0)
    assert lengths.tolist() == [2, 1]
    assert fractions.tolist() == [0.5, 1.0]


def test_exact_reproduction_bound_is_rho_to_the_non_violating_tokens():
    bound = exact_reproduction_bound(torch.tensor([0.0, 0.5, 1.0]), torch.tensor([4, 4, 4]), rho=0.5)
    assert bound.tolist() == pytest.approx([0.5**4, 0.5**2, 1.0])


def test_hoeffding_bound():
    # delta_0 = 6 * 0.05 / pi^2
    expected = 0.3 + math.sqrt(math.log(math.pi**2 / (6 * 0.05)) / (2 * 50))
    assert hoeffding_upper_bound(0.3, 50, 0, 0.05) == pytest.approx(expected)
    assert hoeffding_upper_bound(0.3, 50, 5, 0.05) > hoeffding_upper_bound(0.3, 50, 0, 0.05)


@pytest.mark.parametrize("k", [2, 10])
def test_bf16_margins_equal_the_float32_computation_on_the_same_logits(k):
    """bf16 logits around 20-38 (a real model's range): the margin must be computed as in float32 (the MASC
    reference upcasts); subtracting and log-sum-exping in bf16 is off by up to ~0.15."""
    generator = torch.Generator().manual_seed(0)
    logits = (20 + 18 * torch.rand(4, 16, 512, generator=generator)).to(torch.bfloat16)
    labels = torch.randint(0, 512, (4, 16), generator=generator)
    labels[:, :3] = -100
    reference = restricted_margin(logits.float(), labels, k=k)
    result = restricted_margin(logits, labels, k=k)
    active = labels != -100
    torch.testing.assert_close(result.margins[active].float(), reference.margins[active], rtol=0, atol=1e-5)
    hinge = masc_hinge(result, 0.0, 0.5).float()
    torch.testing.assert_close(hinge, masc_hinge(reference, 0.0, 0.5), rtol=0, atol=1e-6)
    assert result.margins.dtype == torch.float32


def test_bf16_teacher_competitors_are_upcast_too():
    generator = torch.Generator().manual_seed(1)
    logits = (20 + 18 * torch.rand(2, 8, 256, generator=generator)).to(torch.bfloat16)
    teacher = (20 + 18 * torch.rand(2, 8, 256, generator=generator)).to(torch.bfloat16)
    labels = torch.randint(0, 256, (2, 8), generator=generator)
    reference = restricted_margin(logits.float(), labels, k=3, beta=5.0, teacher_logits=teacher.float(), delta=0.5)
    result = restricted_margin(logits, labels, k=3, beta=5.0, teacher_logits=teacher, delta=0.5)
    torch.testing.assert_close(result.margins.float(), reference.margins, rtol=0, atol=1e-5)


def test_calibration_gap_is_the_mean_excess_over_never_seen_quantiles():
    never_seen = torch.tensor([-10.0, -6.0, -2.0, 2.0, 6.0])
    # Four forget margins, ranks 0..3, take the quantiles 0, 1/3, 2/3, 1 of never_seen: -10, -14/3, 2/3, 6.
    forget = torch.tensor([5.0, -9.0, 0.5, -4.0])
    expected = (max(-9 - -10, 0) + max(-4 - -14 / 3, 0) + max(0.5 - 2 / 3, 0) + max(5 - 6, 0)) / 4
    assert calibration_gap(forget, never_seen) == pytest.approx(expected)
    assert calibration_gap(never_seen - 0.1, never_seen) == 0.0  # everywhere below never-seen data
    assert calibration_gap(never_seen, never_seen) == pytest.approx(0.0, abs=1e-6)  # no excess over itself
    assert calibration_gap(never_seen + 1.0, never_seen) == pytest.approx(1.0)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_the_probe_measures_hand_margins_with_the_lm_head_on_the_answers_only(architecture):
    """The stopping probe's measurement (measure_violations) against margins and probabilities by hand, on
    examples whose prompts differ in length; the LM head ran from the batch's earliest answer prediction on."""
    from conftest import (
        hand_answer_log_probs,
        hand_answer_probability,
        hand_margins,
        make_tiny_model,
        make_varied_example,
    )

    from hf_unlearn.objectives.masc.margin import measure_violations

    model = make_tiny_model(architecture).eval()
    examples = [make_varied_example(seed) for seed in (3, 8, 13)]  # prompts of 5, 2 and 3 tokens
    kept = []
    model.register_forward_pre_hook(lambda _, a, kwargs: kept.append(kwargs.get("logits_to_keep")), with_kwargs=True)
    measured = measure_violations(model, examples, 0, k=3, tau=0.0, batch_size=8)
    longest = max(len(e["input_ids"]) for e in examples)
    assert kept == [longest - 1]  # the earliest answer token is at position 2, predicted from position 1
    expected = [m for e in examples for m in hand_margins(model, e, k=3)]
    assert sorted(measured["margins"].tolist()) == pytest.approx(sorted(expected), abs=1e-5)
    fractions = [sum(m > 0 for m in hand_margins(model, e, k=3)) / len(hand_margins(model, e, k=3)) for e in examples]
    assert measured["fractions"].tolist() == pytest.approx(fractions)
    probabilities = [hand_answer_probability(model, e) for e in examples]
    assert measured["probabilities"].tolist() == pytest.approx(probabilities, rel=1e-5)
    # Min-K% Prob (k 0.4, MUSE's count int(0.4 n), at least one) of each answer: what the calibrated stop's
    # membership condition reads
    lowest = [
        sorted(hand_answer_log_probs(model, e))[: max(1, int(0.4 * len(hand_margins(model, e, k=3))))]
        for e in examples
    ]
    assert measured["min_k"].tolist() == pytest.approx([sum(v) / len(v) for v in lowest], rel=1e-5)


def test_id_spread_finds_a_function_words_missing_low_tail():
    """calibration_match='id_spread' (beyond the paper) matches each shared word with its own id's never-seen spread,
    ranked among the call's tokens of that id. A forget set whose function word sits at its never-seen mean while
    its name piece has the spread the function word should have is not read as never-seen (pooled over ids, the
    name's tails stood in for the function word's: docs/studies/masc_landing.md). Never-seen answers matched against
    themselves have no excess."""
    from hf_unlearn.objectives.masc.calibration import calibration_gap, matched_thresholds, spread_by_id, token_levels

    never_seen = torch.tensor([-5.0, 7.0, 2.0, 2.0])
    never_seen_ids = torch.tensor([10, 10, 11, 11])  # "was": level 1, deviations -6, +6; a name piece: level 2, none
    ids, levels, own = token_levels(never_seen, never_seen_ids, torch.tensor([10, 11]))
    spread, offsets = spread_by_id(never_seen, never_seen_ids, ids, levels)
    assert spread.tolist() == [-6.0, 6.0, 0.0, 0.0] and offsets.tolist() == [0, 2, 4]
    per_id = NeverSeenLevels(ids, levels, spread, offsets)
    forget = torch.tensor([1.0, 1.0, -4.0, 8.0])  # "was" twice at its mean; the name piece spread -6, +6
    forget_ids = torch.tensor([10, 10, 11, 11])
    assert matched_thresholds(forget, own, forget_ids, per_id).tolist() == [-5.0, 7.0, 2.0, 2.0]
    assert calibration_gap(forget, own, forget_ids, per_id) == pytest.approx((6.0 + 6.0) / 4)
    assert calibration_gap(never_seen, own, never_seen_ids, per_id) == pytest.approx(0.0, abs=1e-6)
    # one occurrence of an id in the call: its never-seen median (deviation 0 here), whatever its own deviation
    assert matched_thresholds(torch.tensor([9.0]), own, torch.tensor([10]), per_id).tolist() == [1.0]


def test_the_probe_runs_a_shared_prefix_once_with_the_same_result(monkeypatch):
    """measure_violations (the stop's probe) runs the rows' shared leading tokens once (two forward calls a batch):
    every measured value equals the full forward's (the shared prefix switched off, one call a batch)."""
    from conftest import make_tiny_model
    from test_start_model_logits import prefixed_examples

    from hf_unlearn import forwards
    from hf_unlearn.objectives.masc.margin import measure_violations

    model = make_tiny_model("qwen2").eval()
    calls = []
    model.register_forward_pre_hook(lambda *_: calls.append(1))
    examples = prefixed_examples(6)
    shared = measure_violations(model, examples, 0, k=3, tau=0.0, batch_size=4)
    assert len(calls) == 4  # two batches, each the prefix and then the rows' continuations
    monkeypatch.setattr(forwards, "SHARED_PREFIX_MIN_TOKENS", 10**6)
    whole = measure_violations(model, examples, 0, k=3, tau=0.0, batch_size=4)
    assert len(calls) == 6
    for name, value in whole.items():
        torch.testing.assert_close(shared[name], value, rtol=1e-5, atol=1e-5, equal_nan=True, msg=name)
