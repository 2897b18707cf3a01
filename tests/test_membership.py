"""Membership attacks and PrivLeak: each attack against a hand computation on a tiny model, MUSE's AUC orientation
and token count, and batched scoring equal to one text at a time."""

import math
import zlib

import pytest
import torch

from hf_unlearn.benchmarks import build_tokenizer, generate_benchmark, tiny_model
from hf_unlearn.evaluation.membership import (
    ATTACKS,
    membership_auc,
    membership_scores,
    min_k_percent,
    min_k_plus_plus,
    privleak,
    token_statistics,
)

TEXTS = ["Question: who?\nAnswer: nobody at all", "short", "A somewhat longer text about an author and a book."]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(generate_benchmark(num_authors=8), vocab_size=512)


def test_min_k_takes_museS_int_of_k_n_lowest_tokens():
    log_probs = torch.tensor([-0.1, -5.0, -0.2, -3.0, -0.3])
    # int(0.4 * 5) = 2 lowest: -5 and -3.
    assert min_k_percent(log_probs, 0.4) == pytest.approx(-4.0)
    # int(0.5 * 5) = 2 (MUSE truncates; ceil would take 3).
    assert min_k_percent(log_probs, 0.5) == pytest.approx(-4.0)
    assert min_k_percent(log_probs, 0.7) == pytest.approx((-5.0 - 3.0 - 0.3) / 3)
    assert min_k_percent(log_probs, 1.0) == pytest.approx(log_probs.mean().item())
    assert min_k_percent(torch.tensor([-2.0, -1.0]), 0.4) == pytest.approx(-2.0)  # int(0.8) = 0: at least one
    with pytest.raises(ValueError, match="k must be in"):
        min_k_percent(log_probs, 0.0)


def test_min_k_plus_plus_standardises_before_selecting():
    log_probs = torch.tensor([-1.0, -2.0, -3.0, -1.0, -1.0])
    mean = torch.tensor([-1.5, -1.0, -4.0, -1.0, -2.0])
    std = torch.tensor([0.5, 1.0, 2.0, 1.0, 1.0])
    # z = [1.0, -1.0, 0.5, 0.0, 1.0]; the lowest int(0.4 * 5) = 2 are -1.0 and 0.0.
    assert min_k_plus_plus(log_probs, mean, std, 0.4) == pytest.approx(-0.5)


def test_auc_and_privleak_in_museS_orientation():
    """Forget texts are labelled 0, holdout texts 1: AUC = P(holdout score > forget score). A model that still
    remembers the forget set (forget scores above every holdout score) has AUC 0 and PrivLeak -100 against a
    retrained model at 0.5; MUSE's reading: strongly negative is under-unlearning."""
    forget, holdout = [0.9, 0.8, 0.3], [0.5, 0.2]
    pairs = [(h > f) + 0.5 * (h == f) for f in forget for h in holdout]
    assert membership_auc(forget, holdout) == pytest.approx(sum(pairs) / len(pairs)) == pytest.approx(1 / 6)
    remembered = membership_auc([-0.1, -0.2, -0.3], [-2.0, -3.0, -2.5])
    assert remembered == 0.0
    assert privleak(remembered, 0.5) == -100.0
    over_unlearned = membership_auc([-9.0, -8.0], [-2.0, -3.0])
    assert over_unlearned == 1.0 and privleak(over_unlearned, 0.5) == 100.0
    assert membership_auc([1.0, 1.0], [1.0]) == pytest.approx(0.5)
    assert privleak(0.5, 0.5) == 0.0
    with pytest.raises(ValueError, match="at least one forget score"):
        membership_auc([], [0.1])


def _hand_log_probs(model, ids, start=1):
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].double(), dim=-1)
    targets = torch.tensor(ids[1:])
    chosen = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return chosen[start - 1 :], log_probs[start - 1 :]


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_every_attack_equals_a_hand_computation(tokenizer, architecture):
    model = tiny_model(tokenizer, architecture, hidden_size=32, num_layers=2, num_heads=2)
    reference = tiny_model(tokenizer, architecture, seed=1, hidden_size=32, num_layers=2, num_heads=2)
    prompts = ["Question: who?\nAnswer:", "Q:", "Tell me:"]
    texts = [" nobody at all", " short", " a somewhat longer text about an author and a book."]
    scores = membership_scores(
        model, tokenizer, texts, k=0.4, batch_size=3, prompts=prompts, attacks=ATTACKS, reference_model=reference
    )
    assert set(scores) == set(ATTACKS)
    for i, (prompt, text) in enumerate(zip(prompts, texts, strict=True)):
        head = tokenizer(prompt)["input_ids"]
        ids = head + tokenizer(text, add_special_tokens=False)["input_ids"]
        chosen, log_probs = _hand_log_probs(model, ids, start=len(head))
        n = chosen.numel()
        assert scores["loss"][i] == pytest.approx(chosen.mean().item(), abs=1e-3)
        assert scores["zlib"][i] == pytest.approx(chosen.sum().item() / len(zlib.compress(text.encode())), abs=1e-3)
        lowest = torch.sort(chosen).values[: max(1, int(0.4 * n))]
        assert scores["min_k"][i] == pytest.approx(lowest.mean().item(), abs=1e-3)
        probs = log_probs.exp()
        mu = (probs * log_probs).sum(-1)
        sigma = (probs * (log_probs - mu.unsqueeze(-1)).square()).sum(-1).sqrt()
        z = torch.sort((chosen - mu) / sigma).values[: max(1, int(0.4 * n))]
        assert scores["min_k_plus_plus"][i] == pytest.approx(z.mean().item(), abs=1e-3)
        reference_chosen, _ = _hand_log_probs(reference, ids, start=len(head))
        assert scores["reference"][i] == pytest.approx(chosen.mean().item() - reference_chosen.mean().item(), abs=1e-3)
        # GradNorm: the gradient of the mean NLL of the text's tokens, all parameters, one L2 norm.
        model.zero_grad()
        labels = torch.tensor([[-100] * len(head) + ids[len(head) :]])
        model(input_ids=torch.tensor([ids]), labels=labels).loss.backward()
        norm = math.sqrt(sum(p.grad.double().square().sum().item() for p in model.parameters() if p.grad is not None))
        assert scores["gradnorm"][i] == pytest.approx(-norm, rel=1e-4)
        model.zero_grad()
    assert all(p.grad is None for p in model.parameters())  # GradNorm leaves no gradients behind
    # A frozen model (a merged adapter, a reference) is attacked on its weights too, and stays frozen.
    model.requires_grad_(False)
    frozen = membership_scores(model, tokenizer, texts, prompts=prompts, attacks=["gradnorm"])["gradnorm"]
    assert frozen == pytest.approx(scores["gradnorm"], rel=1e-4)
    assert not any(p.requires_grad for p in model.parameters())


def test_unknown_attack_and_reference_without_model_are_named(tokenizer):
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2)
    with pytest.raises(ValueError, match="Unknown membership attack"):
        membership_scores(model, tokenizer, ["x"], attacks=["lira"])
    with pytest.raises(ValueError, match="pass reference_model"):
        membership_scores(model, tokenizer, ["x"], attacks=["reference"])


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_batched_token_statistics_match_one_text_at_a_time(tokenizer, architecture):
    model = tiny_model(tokenizer, architecture, hidden_size=32, num_layers=2, num_heads=2)
    batched = token_statistics(model, tokenizer, TEXTS, batch_size=3)
    for text, got in zip(TEXTS, batched, strict=True):
        ids = tokenizer(text)["input_ids"]
        expected, log_probs = _hand_log_probs(model, ids)
        assert torch.allclose(got["log_prob"].double(), expected, atol=1e-4)
        probs = log_probs.exp()
        mean = (probs * log_probs).sum(-1)
        std = ((probs * (log_probs - mean.unsqueeze(-1)).square()).sum(-1)).sqrt()
        assert torch.allclose(got["mean"].double(), mean, atol=1e-4)
        assert torch.allclose(got["std"].double(), std, atol=1e-4)
