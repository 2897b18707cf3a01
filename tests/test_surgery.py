import pytest
import torch

from hf_unlearn.surgery.combine import STRATEGIES, combine_gradients, combine_gradients_

RETENTION_FIRST = ("pcgrad", "pcgrad_global", "sago", "sago_prefer_retain")
SHAPES = [(7,), (3, 5), (2, 3, 4), (1,)]


def random_grads(seed):
    g = torch.Generator().manual_seed(seed)
    forget, retain = [], []
    for i, shape in enumerate(SHAPES):
        f = torch.randn(shape, generator=g, dtype=torch.float64)
        r = torch.randn(shape, generator=g, dtype=torch.float64)
        # Sprinkle exact zeros, an all-zero tensor, and exactly opposite tensors.
        f[torch.rand(shape, generator=g) < 0.2] = 0
        r[torch.rand(shape, generator=g) < 0.2] = 0
        if seed % 5 == 0 and i == 1:
            r = torch.zeros(shape, dtype=torch.float64)
        if seed % 7 == 0 and i == 2:
            f = -2.0 * r
        forget.append(f)
        retain.append(r)
    return forget, retain


def flat(tensors):
    return torch.cat([t.reshape(-1) for t in tensors])


def reference_loop(forget, retain, strategy, gamma, alpha):
    """Coordinate-by-coordinate transcription of the formulas of arXiv 2604.14808 §3 with Python floats."""
    out = []
    global_dot = sum(float(a) * float(b) for f, r in zip(forget, retain) for a, b in zip(f.reshape(-1), r.reshape(-1)))
    global_rr = sum(float(b) ** 2 for r in retain for b in r.reshape(-1))
    global_ff = sum(float(a) ** 2 for f in forget for a in f.reshape(-1))
    for f, r in zip(forget, retain):
        fs, rs = [float(x) for x in f.reshape(-1)], [float(x) for x in r.reshape(-1)]
        dot = sum(a * b for a, b in zip(fs, rs))
        rr = sum(b * b for b in rs)
        ff = sum(a * a for a in fs)
        u = []
        for a, b in zip(fs, rs):
            conflict = (a > 0 and b < 0) or (a < 0 and b > 0)
            if strategy == "sum":
                u.append(gamma * a + alpha * b)
            elif strategy in ("pcgrad", "pcgrad_global"):
                d, n = (global_dot, global_rr) if strategy == "pcgrad_global" else (dot, rr)
                a2 = a - d / (n + 1e-10) * b if d < 0 else a
                u.append(gamma * a2 + alpha * b)
            elif strategy == "sago":
                u.append(alpha * b if conflict else gamma * a)
            elif strategy == "sago_prefer_retain":
                u.append(alpha * b + (0.0 if conflict else gamma * a))
            elif strategy == "blur_per_tensor":
                u.append(alpha * (b - dot / (ff + 1e-10) * a) + gamma * a)
            elif strategy == "blur":  # SAGO's BLUR: one coefficient over all parameters
                u.append(alpha * (b - global_dot / (global_ff + 1e-10) * a) + gamma * a)
        out.append(torch.tensor(u, dtype=torch.float64).reshape(f.shape))
    return out


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(12))
def test_each_strategy_equals_the_plain_loop_reference(strategy, seed):
    forget, retain = random_grads(seed)
    gamma, alpha = (0.5, 2.0) if seed % 2 else (1.0, 1.0)
    got = combine_gradients(forget, retain, strategy, forget_weight=gamma, retain_weight=alpha)
    expected = reference_loop(forget, retain, strategy, gamma, alpha)
    assert [g.shape for g in got] == [e.shape for e in expected]
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("strategy", RETENTION_FIRST)
@pytest.mark.parametrize("seed", range(40))
def test_update_never_opposes_the_retain_gradient(strategy, seed):
    forget, retain = random_grads(seed)
    update = combine_gradients(forget, retain, strategy, forget_weight=3.0, retain_weight=0.5)
    assert torch.dot(flat(update), flat(retain)) >= -1e-12


def test_sum_can_oppose_retain_which_is_why_surgery_exists():
    forget, retain = [torch.tensor([-3.0, 0.0])], [torch.tensor([1.0, 0.0])]
    assert torch.dot(combine_gradients(forget, retain, "sum")[0], retain[0]) < 0


def test_sum_equals_the_gradient_of_the_summed_loss():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x_forget, x_retain = torch.randn(5, 4), torch.randn(6, 4)

    def forget_loss():
        return -model(x_forget).pow(2).mean()

    def retain_loss():
        return model(x_retain).abs().mean()

    gamma, alpha = 0.3, 1.7
    forget_grads = torch.autograd.grad(forget_loss(), list(model.parameters()))
    retain_grads = torch.autograd.grad(retain_loss(), list(model.parameters()))
    summed = torch.autograd.grad(gamma * forget_loss() + alpha * retain_loss(), list(model.parameters()))
    combined = combine_gradients(forget_grads, retain_grads, "sum", forget_weight=gamma, retain_weight=alpha)
    for c, s in zip(combined, summed):
        torch.testing.assert_close(c, s)


def test_in_place_variant_writes_into_retain_tensors_and_reports_statistics():
    forget = [torch.tensor([1.0, -1.0, 2.0, 0.0])]
    retain = [torch.tensor([1.0, 1.0, -1.0, 3.0])]
    target = retain[0]
    updates, stats = combine_gradients_(forget, retain, "sago")
    assert updates[0] is target
    assert target.tolist() == [1.0, 1.0, -1.0, 0.0]
    assert stats["conflict_fraction"] == 0.5
    assert stats["cos_update_retain"] >= 0


def test_missing_gradients_count_as_zero_and_bad_input_is_named():
    forget = [None, torch.tensor([1.0, 2.0])]
    retain = [torch.tensor([1.0]), None]
    updates = combine_gradients(forget, retain, "pcgrad")
    assert updates[0].tolist() == [1.0] and updates[1].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="Unknown gradient surgery 'magic'"):
        combine_gradients([torch.ones(1)], [torch.ones(1)], "magic")
    with pytest.raises(ValueError, match="shapes differ"):
        combine_gradients([torch.ones(2)], [torch.ones(3)], "sum")


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("seed", range(6))
def test_statistics_equal_a_direct_computation_on_the_update(strategy, seed):
    """The logged cosines come from closed forms (linear strategies) or in-block sums (SAGO): check both against
    the cosines of the update the pure function returns."""
    forget, retain = random_grads(seed)
    gamma, alpha = 0.7, 1.3
    expected_update = combine_gradients(forget, retain, strategy, forget_weight=gamma, retain_weight=alpha)
    _, stats = combine_gradients_(
        [f.clone() for f in forget], [r.clone() for r in retain], strategy, forget_weight=gamma, retain_weight=alpha
    )
    u, f, r = flat(expected_update), flat(forget), flat(retain)
    cosine = torch.nn.functional.cosine_similarity
    assert stats["cos_update_retain"].item() == pytest.approx(cosine(u, r, dim=0).item(), abs=1e-6)
    assert stats["cos_forget_retain"].item() == pytest.approx(cosine(f, r, dim=0).item(), abs=1e-6)
    conflicts = {
        "sago": (torch.sign(f) * torch.sign(r) < 0).double().mean().item(),
        "sago_prefer_retain": (torch.sign(f) * torch.sign(r) < 0).double().mean().item(),
        "pcgrad": sum(float(torch.dot(a.reshape(-1), b.reshape(-1)) < 0) for a, b in zip(forget, retain)) / 4,
        "pcgrad_global": float(torch.dot(f, r) < 0),
    }
    assert stats["conflict_fraction"].item() == pytest.approx(conflicts.get(strategy, 0.0))
