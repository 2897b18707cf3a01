"""Fluency of generated answers: distinct-3 and the repetitive share by hand, the never-trained model's likelihood of
the answers against a forward pass done here, and the verdict against the never-trained level."""

import math

import pytest
import torch

from hf_unlearn.benchmarks import build_tokenizer, tiny_model
from hf_unlearn.data.examples import tokenize_qa
from hf_unlearn.evaluation.fluency import distinct_3, fluent_like, reference_nll, repetition


def test_distinct_3_counts_repeated_word_trigrams():
    assert distinct_3("190 190 190 190") == pytest.approx(1 / 2)  # (190,190,190) twice
    assert distinct_3("Jaime Vasquez was born in Santiago") == 1.0
    assert distinct_3("a b a b a b") == pytest.approx(2 / 4)  # (a,b,a) (b,a,b) (a,b,a) (b,a,b)
    assert distinct_3("too short") is None


def test_repetition_shares_by_hand():
    texts = ["190 190 190 190", "He was born in Chile and writes true crime", "", "yes"]
    measured = repetition(texts)
    assert measured["empty_share"] == pytest.approx(1 / 4)
    # of the three non-empty answers one is degenerate; "yes" has no trigram, so it is not counted as repetitive
    assert measured["repetitive_share"] == pytest.approx(1 / 3)
    assert measured["distinct_3"] == pytest.approx((0.5 + 1.0) / 2)


def test_reference_nll_is_the_mean_token_nll_of_each_answer_given_its_question():
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2).eval()
    questions = ["Where was Yabeel Crowsen born?", "What does Yabeel Crowsen write?"]
    answers = ["Yabeel Crowsen was born in Lima.", "thriller thriller thriller"]
    expected = []
    for question, answer in zip(questions, answers):
        example = tokenize_qa(tokenizer, question, answer)
        ids, labels = torch.tensor([example["input_ids"]]), torch.tensor([example["labels"]])
        with torch.no_grad():
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
        targets = labels[0, 1:]
        scored = targets != -100
        expected.append(-log_probs[scored, targets[scored]].mean().item())
    assert reference_nll(model, tokenizer, questions, [*answers]) == pytest.approx(sum(expected) / 2, rel=1e-5)
    # empty answers are left out, not scored as zero-length
    assert reference_nll(model, tokenizer, questions, [answers[0], " "]) == pytest.approx(expected[0], rel=1e-5)
    assert math.isnan(reference_nll(model, tokenizer, questions, ["", ""]))


def test_fluent_like_compares_with_the_never_trained_level():
    never = {"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 2.0}
    assert fluent_like({"repetitive_share": 0.05, "empty_share": 0.0, "reference_nll": 2.4}, never)
    assert not fluent_like({"repetitive_share": 0.5, "empty_share": 0.0, "reference_nll": 2.0}, never)
    assert not fluent_like({"repetitive_share": 0.0, "empty_share": 0.3, "reference_nll": 2.0}, never)
    assert not fluent_like({"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 3.0}, never)
    # The NLL level of fluent answers the never-trained model did not write itself (its own greedy answers score
    # far lower under it): within 0.5 of it passes, past it fails, and the never-trained shares still apply.
    assert fluent_like({"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 3.0}, never, fluent_nll=2.87)
    assert not fluent_like({"repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 3.4}, never, fluent_nll=2.87)
    assert not fluent_like({"repetitive_share": 0.4, "empty_share": 0.0, "reference_nll": 2.9}, never, fluent_nll=2.87)


def test_answer_fluency_reads_the_answers_evaluate_qa_generated():
    """One generation per measurement: the forget ROUGE-L's greedy answers are the ones measured for fluency."""
    from hf_unlearn.evaluation.fluency import answer_fluency
    from hf_unlearn.evaluation.metrics import evaluate_qa

    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2).eval()
    records = [
        {"question": "Where was Yabeel Crowsen born?", "answer": "Yabeel Crowsen was born in Lima."},
        {"question": "What does Yabeel Crowsen write?", "answer": "He writes thrillers set in Peru."},
    ]
    measured = evaluate_qa(model, tokenizer, records, return_predictions=True)
    assert len(measured["predictions"]) == 2 and "predictions" not in evaluate_qa(model, tokenizer, records)
    generated = answer_fluency(model, tokenizer, records, reference_model=model)
    reused = answer_fluency(model, tokenizer, records, reference_model=model, answers=measured["predictions"])
    # greedy decoding with the same length limit: the same answers, the same figures (NaN where no answer has 3 words)
    assert reused["examples"] == generated["examples"] == measured["predictions"]
    for key in ("empty_share", "repetitive_share", "distinct_3", "reference_nll"):
        assert reused[key] == pytest.approx(generated[key], nan_ok=True), key
    given = ["190 190 190 190", "He writes thrillers set in Peru."]
    assert answer_fluency(model, tokenizer, records, answers=given)["repetitive_share"] == pytest.approx(1 / 2)
    with pytest.raises(ValueError, match="1 answers for 2 questions"):
        answer_fluency(model, tokenizer, records, answers=given[:1])
