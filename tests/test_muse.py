"""MUSE metrics: Min-K% and Min-K%++ on crafted sequences, the AUC and PrivLeak formulas, and batched scoring
equal to a per-example loop."""

import math

import pytest
import torch

from hf_unlearn.benchmarks import build_tokenizer, generate_benchmark, tiny_model
from hf_unlearn.metrics import rouge_l_f1
from hf_unlearn.muse import (
    knowmem,
    membership_auc,
    membership_scores,
    min_k_percent,
    min_k_plus_plus,
    privleak,
    token_statistics,
    verbmem,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(generate_benchmark(num_authors=8), vocab_size=512)


def test_min_k_percent_averages_the_lowest_tokens():
    log_probs = torch.tensor([-0.1, -5.0, -0.2, -3.0, -0.3])
    # k = 0.4 of 5 tokens = 2 lowest: -5 and -3.
    assert min_k_percent(log_probs, 0.4) == pytest.approx(-4.0)
    # ceil(0.5 * 5) = 3 lowest: -5, -3, -0.3.
    assert min_k_percent(log_probs, 0.5) == pytest.approx((-5.0 - 3.0 - 0.3) / 3)
    assert min_k_percent(log_probs, 1.0) == pytest.approx(log_probs.mean().item())
    assert min_k_percent(torch.tensor([-2.0]), 0.01) == pytest.approx(-2.0)  # at least one token
    with pytest.raises(ValueError, match="k must be in"):
        min_k_percent(log_probs, 0.0)


def test_min_k_plus_plus_standardises_before_selecting():
    log_probs = torch.tensor([-1.0, -2.0, -3.0])
    mean = torch.tensor([-1.5, -1.0, -4.0])
    std = torch.tensor([0.5, 1.0, 2.0])
    # z = [1.0, -1.0, 0.5]; the lowest ceil(0.4 * 3) = 2 are -1.0 and 0.5.
    assert min_k_plus_plus(log_probs, mean, std, 0.4) == pytest.approx(-0.25)


def test_membership_auc_counts_ordered_pairs_and_privleak_is_relative():
    members, others = [0.9, 0.8, 0.3], [0.5, 0.2]
    pairs = [(m > o) + 0.5 * (m == o) for m in members for o in others]
    assert membership_auc(members, others) == pytest.approx(sum(pairs) / len(pairs))
    assert membership_auc([1.0, 1.0], [1.0]) == pytest.approx(0.5)
    assert privleak(0.75, 0.5) == pytest.approx(50.0)
    assert privleak(0.5, 0.5) == 0.0
    with pytest.raises(ValueError, match="at least one member"):
        membership_auc([], [0.1])


def test_rouge_l_f1_hand_values():
    # LCS("the cat sat", "the cat ran away") = 2; precision 2/3, recall 2/4.
    (score,) = rouge_l_f1(["the cat sat"], ["the cat ran away"])
    assert score == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert rouge_l_f1(["same words here"], ["same words here"]) == [1.0]


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_batched_token_statistics_match_one_text_at_a_time(tokenizer, architecture):
    model = tiny_model(tokenizer, architecture, hidden_size=32, num_layers=2, num_heads=2)
    texts = ["Question: who?\nAnswer: nobody at all", "short", "A somewhat longer text about an author and a book."]
    batched = token_statistics(model, tokenizer, texts, batch_size=3)
    for text, got in zip(texts, batched, strict=True):
        ids = torch.tensor([tokenizer(text)["input_ids"]])
        with torch.no_grad():
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), dim=-1)
        expected = log_probs.gather(-1, ids[0, 1:].unsqueeze(-1)).squeeze(-1)
        assert torch.allclose(got["log_prob"].double(), expected, atol=1e-4)
        probs = log_probs.exp()
        mean = (probs * log_probs).sum(-1)
        std = ((probs * (log_probs - mean.unsqueeze(-1)).square()).sum(-1)).sqrt()
        assert torch.allclose(got["mean"].double(), mean, atol=1e-4)
        assert torch.allclose(got["std"].double(), std, atol=1e-4)
    scores = membership_scores(model, tokenizer, texts, k=0.4)
    assert scores["min_k"][0] == pytest.approx(min_k_percent(batched[0]["log_prob"], 0.4))
    assert all(math.isfinite(s) for s in scores["min_k_plus_plus"])


def test_verbmem_and_knowmem_score_generations(tokenizer):
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    value = verbmem(model, tokenizer, ["Question: who\nAnswer:"], ["nobody"], max_new_tokens=4)
    assert 0.0 <= value <= 1.0
    value = knowmem(model, tokenizer, ["who?"], ["nobody"], icl_examples=[{"question": "a?", "answer": "b"}])
    assert 0.0 <= value <= 1.0
    assert math.isnan(verbmem(model, tokenizer, [], []))
    with pytest.raises(ValueError, match="1 prompts but 0 continuations"):
        verbmem(model, tokenizer, ["x"], [])
