"""MUSE's VerbMem and KnowMem (the membership attacks and PrivLeak: tests/test_membership.py)."""

import math

import pytest

from hf_unlearn.benchmarks import build_tokenizer, generate_benchmark, tiny_model
from hf_unlearn.metrics import rouge_l_f1
from hf_unlearn.muse import knowmem, verbmem


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(generate_benchmark(num_authors=8), vocab_size=512)


def test_rouge_l_f1_hand_values():
    # LCS("the cat sat", "the cat ran away") = 2; precision 2/3, recall 2/4.
    (score,) = rouge_l_f1(["the cat sat"], ["the cat ran away"])
    assert score == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert rouge_l_f1(["same words here"], ["same words here"]) == [1.0]


def test_verbmem_and_knowmem_score_generations(tokenizer):
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    value = verbmem(model, tokenizer, ["Question: who\nAnswer:"], ["nobody"], max_new_tokens=4)
    assert 0.0 <= value <= 1.0
    value = knowmem(model, tokenizer, ["who?"], ["nobody"], icl_examples=[{"question": "a?", "answer": "b"}])
    assert 0.0 <= value <= 1.0
    assert math.isnan(verbmem(model, tokenizer, [], []))
    with pytest.raises(ValueError, match="1 prompts but 0 continuations"):
        verbmem(model, tokenizer, ["x"], [])
