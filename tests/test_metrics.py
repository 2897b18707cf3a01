"""Tests of the batched QA metrics against hand values and per-example loops."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import hand_answer_probability, hand_greedy, hand_rouge_l, train_on_answers

from hf_unlearn.benchmarks import build_tokenizer, generate_benchmark, tiny_model
from hf_unlearn.data.examples import tokenize_prompt, tokenize_qa
from hf_unlearn.evaluation.metrics import (
    answer_log_probs,
    answer_probability,
    default_max_new_tokens,
    evaluate_qa,
    exact_match,
    generate_answers,
    rouge_l_recall,
)

SMALL = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return generate_benchmark(num_authors=4, num_holdout_authors=0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(generate_benchmark(num_authors=8), vocab_size=512)


def test_rouge_l_recall_hand_values():
    predictions = ["the cat sat", "The cat.", "cats running fast", "", "sat the cat"]
    references = ["the cat sat on the mat", "the cat", "cat run", "anything", "the cat sat"]
    # Longest common subsequence 3 of 6 reference tokens; case and punctuation ignored; Porter stemming
    # ("cats" -> "cat", "running" -> "run"); empty prediction; word order matters (LCS "the cat", 2 of 3).
    expected = [0.5, 1.0, 1.0, 0.0, 2 / 3]
    assert rouge_l_recall(predictions, references) == pytest.approx(expected)
    with pytest.raises(ValueError):
        rouge_l_recall(["a"], [])


def test_exact_match_normalisation():
    predictions = ["  Hello   World. ", "hello world!", "Hello, world", "hello", "Hello\nWorld"]
    references = ["hello world", "Hello World.", "hello world", "world", "hello world"]
    assert exact_match(predictions, references) == [1.0, 1.0, 0.0, 0.0, 1.0]
    assert exact_match([], []) == []


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_batched_log_probs_match_per_example_loop(tokenizer, records, architecture):
    model = tiny_model(tokenizer, architecture, seed=1, **SMALL)
    model.train()  # the metric must switch to eval (no dropout) and switch back
    questions = [r["question"] for r in records]
    answers = [r["answer"] for r in records]
    batched = answer_log_probs(model, tokenizer, questions, answers, batch_size=8)
    assert model.training
    single = answer_log_probs(model, tokenizer, questions, answers, batch_size=1)
    model.eval()
    for (total, count), (total1, count1), q, a in zip(batched, single, questions, answers, strict=True):
        example = tokenize_qa(tokenizer, q, a)
        n_answer = sum(label != -100 for label in example["labels"])
        assert count == count1 == n_answer
        assert total == pytest.approx(total1, abs=1e-4)
        # The model's own loss is the mean NLL of the same (shifted) answer tokens.
        with torch.no_grad():
            loss = model(**{k: torch.tensor([v]) for k, v in example.items()}).loss.item()
        assert total == pytest.approx(-loss * n_answer, abs=1e-3)
    probabilities = answer_probability(model, tokenizer, questions, answers, batch_size=5)
    expected = [math.exp(total / count) for total, count in single]
    assert probabilities == pytest.approx(expected, rel=1e-4)
    assert all(0 < p < 1 for p in probabilities)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_left_padded_generation_matches_per_example(tokenizer, records, architecture):
    model = tiny_model(tokenizer, architecture, seed=2, **SMALL)
    model.train()
    questions = [r["question"] for r in records][:12]
    assert len({len(tokenize_prompt(tokenizer, q)) for q in questions}) > 1  # the batch really is padded
    tokenizer.padding_side = "right"
    batched = generate_answers(model, tokenizer, questions, max_new_tokens=10, batch_size=6)
    assert tokenizer.padding_side == "right" and model.training
    single = generate_answers(model, tokenizer, questions, max_new_tokens=10, batch_size=1)
    assert batched == single
    model.eval()
    assert batched == [hand_greedy(model, tokenizer, tokenize_prompt(tokenizer, q), 10) for q in questions]
    assert any(batched)


def test_generation_stops_at_eos(tokenizer):
    model = tiny_model(tokenizer, "llama", seed=0, **SMALL)

    class EosHead(torch.nn.Module):
        """Makes EOS the most likely next token everywhere, so every answer ends at once."""

        def forward(self, hidden: torch.Tensor) -> torch.Tensor:
            logits = torch.zeros(*hidden.shape[:-1], len(tokenizer))
            logits[..., tokenizer.eos_token_id] = 10.0
            return logits

    model.lm_head = EosHead()
    assert generate_answers(model, tokenizer, ["Where was Veloran Quist born?", "Hi?"], max_new_tokens=5) == ["", ""]


def test_generation_uses_the_kv_cache_even_if_the_config_turned_it_off(tokenizer):
    """TRL saves configs with use_cache=False, and a model built from such a config gets a generation config
    without the cache; decoding must still feed one new token per step, not the whole prefix again."""
    template = tiny_model(tokenizer, "llama", seed=0, **SMALL)
    template.config.use_cache = False
    model = type(template)(template.config)  # as `hf-unlearn compare` makes each run's fresh copy
    assert model.generation_config.use_cache is False
    lengths = []
    model.register_forward_pre_hook(lambda module, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]),
                                    with_kwargs=True)  # fmt: skip
    generate_answers(model, tokenizer, ["Where was Veloran Quist born?"], max_new_tokens=4)
    assert len(lengths) == 4 and lengths[0] > 1 and lengths[1:] == [1, 1, 1]


def test_evaluate_qa(tokenizer, records):
    model = tiny_model(tokenizer, "llama", seed=0, **SMALL)
    # Taught the other records' answers: it writes the benchmark's words (ROUGE above 0) but knows none of these six.
    train_on_answers(model, tokenizer, records[6:], steps=30, lr=1e-2)
    rows = records[:6] + [{"question": "Only a question?"}]
    scores = evaluate_qa(model, tokenizer, rows, batch_size=4)
    assert set(scores) == {"rouge_l_recall", "probability", "exact_match", "num_examples"}
    assert scores["num_examples"] == 6
    assert 0 <= scores["rouge_l_recall"] <= 1 and 0 < scores["probability"] < 1
    assert scores["exact_match"] == 0.0  # it never saw these answers
    # The means by hand over the 6 records with an answer: ROUGE-L recall (rouge_score) of the greedy answer, given
    # as many new tokens as the longest answer has (EOS included) plus 4, and exp(mean answer-token log-prob).
    qa = records[:6]
    examples = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in qa]
    budget = max(sum(label != -100 for label in e["labels"]) for e in examples) + 4
    answers = [hand_greedy(model, tokenizer, tokenize_prompt(tokenizer, r["question"]), budget) for r in qa]
    recall = sum(hand_rouge_l(a, r["answer"], "recall") for a, r in zip(answers, qa)) / 6
    assert 0 < recall < 1
    assert scores["rouge_l_recall"] == pytest.approx(recall)
    assert scores["probability"] == pytest.approx(
        sum(hand_answer_probability(model, e) for e in examples) / 6, rel=1e-5
    )

    from datasets import Dataset

    from_dataset = evaluate_qa(model, tokenizer, Dataset.from_list(records[:6]), batch_size=4)
    assert from_dataset == pytest.approx(scores)
    assert default_max_new_tokens(tokenizer, [r["answer"] for r in records]) > max(
        len(tokenizer(r["answer"], add_special_tokens=False)["input_ids"]) for r in records
    )
    assert evaluate_qa(model, tokenizer, [])["num_examples"] == 0


def test_truth_ratio_aggregations_on_known_values():
    from hf_unlearn.evaluation.metrics import forget_truth_ratio, retain_truth_ratio

    ratios = [0.5, 2.0, 1.0]
    assert forget_truth_ratio(ratios) == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert retain_truth_ratio(ratios) == pytest.approx((0.5 + 0.0 + 0.0) / 3)


def test_truth_ratio_matches_answer_log_probs(tokenizer, records):
    from hf_unlearn.evaluation.options import truth_ratios

    model = tiny_model(tokenizer, "llama", seed=2, **SMALL)
    record = records[0]
    (para_sum, para_n), *perturbed = answer_log_probs(
        model, tokenizer, [record["question"]] * 4, [record["paraphrased_answer"], *record["perturbed_answer"]]
    )
    perturbed_mean = sum(s / n for s, n in perturbed) / len(perturbed)
    expected = math.exp(perturbed_mean - para_sum / para_n)
    assert truth_ratios(model, tokenizer, [record])[0] == pytest.approx(expected, rel=1e-5)
