"""MUSE's VerbMem and KnowMem (the membership attacks and PrivLeak: tests/test_membership.py)."""

import math

import pytest
from conftest import hand_greedy, hand_rouge_l, train_on_answers

from hf_unlearn.benchmarks import build_tokenizer, generate_benchmark, tiny_model
from hf_unlearn.evaluation.metrics import rouge_l_f1
from hf_unlearn.evaluation.muse import knowmem, verbmem


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(generate_benchmark(num_authors=8), vocab_size=512)


def test_rouge_l_f1_hand_values():
    # LCS("the cat sat", "the cat ran away") = 2; precision 2/3, recall 2/4.
    (score,) = rouge_l_f1(["the cat sat"], ["the cat ran away"])
    assert score == pytest.approx(2 * (2 / 3) * (2 / 4) / (2 / 3 + 2 / 4))
    assert rouge_l_f1(["same words here"], ["same words here"]) == [1.0]


def partial_references(generations):
    """References that the generations match fully, in part (their first word among others), and not at all."""
    first = generations[1].split()[0]
    return [generations[0], f"{first} and then nobody else", "zzz qqq"]


def test_verbmem_and_knowmem_score_generations(tokenizer):
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    # A few steps on some of the benchmark's answers: it continues with the benchmark's words (a random model
    # repeats punctuation, whose ROUGE is 0 against anything).
    train_on_answers(model, tokenizer, generate_benchmark(num_authors=8)[:10], steps=20, lr=1e-2)
    # VerbMem (MUSE §3.1): mean ROUGE-L F1 of the greedy continuation of each prompt (decoded here by hand) against
    # the true continuation.
    prompts = ["Question: who\nAnswer:", "The author", "Where was Veloran Quist born?"]
    generated = [hand_greedy(model, tokenizer, tokenizer(p)["input_ids"], 4) for p in prompts]
    continuations = partial_references(generated)
    expected = sum(hand_rouge_l(g, c, "fmeasure") for g, c in zip(generated, continuations)) / 3
    assert 1 / 3 < expected < 2 / 3 and expected != pytest.approx(0.5)  # one full match, one partial, one none
    assert verbmem(model, tokenizer, prompts, continuations, max_new_tokens=4) == pytest.approx(expected)
    # KnowMem with in-context examples (MUSE's *_qa_icl): "Question: ...\nAnswer: ..." shots, a blank line after
    # each, then the question; the greedy answer (32 tokens) is cut at the first blank line or next "Question:".
    shots = "Question: a?\nAnswer: b\n\n"
    questions = ["who?", "Where was Veloran Quist born?", "What did the author write?"]
    answers = [
        hand_greedy(model, tokenizer, tokenizer(f"{shots}Question: {q}\nAnswer:")["input_ids"], 32)
        .split("\n\n")[0]
        .split("\nQuestion:")[0]
        .strip()
        for q in questions
    ]
    references = partial_references(answers)
    expected = sum(hand_rouge_l(a, r, "fmeasure") for a, r in zip(answers, references)) / 3
    assert 1 / 3 < expected < 2 / 3 and expected != pytest.approx(0.5)
    value = knowmem(model, tokenizer, questions, references, icl_examples=[{"question": "a?", "answer": "b"}])
    assert value == pytest.approx(expected)
    assert math.isnan(verbmem(model, tokenizer, [], []))
    with pytest.raises(ValueError, match="1 prompts but 0 continuations"):
        verbmem(model, tokenizer, ["x"], [])
