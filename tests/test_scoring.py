"""The single teacher-forced pass (hf_unlearn.evaluation.passes.score_answers), the KV-cache greedy decoder and the
options scored after one encoding of their question's prompt (passes.score_after_prompts: the truth ratio, the
real-knowledge options) give the values the separate passes gave: per-example unbatched forwards, the full (prompt +
answer) forward and transformers' own generate, on three architectures, with padding and batches of mixed lengths."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import hand_answer_log_probs, hand_greedy, hand_margins, train_on_answers

from hf_unlearn import forwards
from hf_unlearn.benchmarks import build_tokenizer, generate_benchmark, tiny_model
from hf_unlearn.data.examples import tokenize_prompt, tokenize_qa
from hf_unlearn.data.pairing import pad_examples
from hf_unlearn.evaluation.memorization import evaluate_memorization, exact_memorization, extraction_strength
from hf_unlearn.evaluation.metrics import answer_probability, reproduction_bound
from hf_unlearn.evaluation.options import normalized_probabilities, truth_ratios, truth_ratios_from
from hf_unlearn.evaluation.passes import (
    answer_log_probs,
    generate_fallback,
    greedy_decode,
    left_pad,
    log_prob_sums_and_counts,
    option_scores,
    pad_token_id_of,
    prompt_length,
    score_after_prompts,
    score_qa_records,
    score_teacher_forced,
)
from hf_unlearn.evaluation.scoring import bound_from, memorization_from
from hf_unlearn.evaluation.suites import evaluate_unlearning
from hf_unlearn.forwards import prompt_cache_keyword
from hf_unlearn.objectives.masc.margin import threshold_from_probability

SMALL = dict(hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64)


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return generate_benchmark(num_authors=4, num_holdout_authors=0)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer(generate_benchmark(num_authors=8), vocab_size=512)


def one_at_a_time(model, tokenizer, records, k, rho):
    """The old way, by hand: one unpadded forward per example for each metric."""
    probabilities, memorization, bounds, fractions = [], [], [], []
    tau = threshold_from_probability(rho)
    for r in records:
        example = tokenize_qa(tokenizer, r["question"], r["answer"])
        log_probs = hand_answer_log_probs(model, example)
        probabilities.append(math.exp(sum(log_probs) / len(log_probs)))
        ids, labels = example["input_ids"], example["labels"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0]
        positions = [t for t in range(1, len(labels)) if labels[t] != -100][:-1]
        predictions = [int(logits[t - 1].argmax()) for t in positions]
        answer = [labels[t] for t in positions]
        memorization.append((exact_memorization(predictions, answer), extraction_strength(predictions, answer)))
        margins = hand_margins(model, example, k)
        fraction = sum(m > tau for m in margins) / len(margins)
        fractions.append(fraction)
        bounds.append(rho ** ((1 - fraction) * len(margins)))
    return probabilities, memorization, bounds, fractions


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_one_pass_gives_the_separate_passes_values(tokenizer, records, architecture):
    model = tiny_model(tokenizer, architecture, seed=3, **SMALL)
    train_on_answers(model, tokenizer, records[:8], steps=40, lr=1e-2)  # some answers memorised, some not
    rows = records[:11]  # batches of 4: 4 + 4 + 3, mixed lengths, right-padded
    assert len({len(tokenize_qa(tokenizer, r["question"], r["answer"])["input_ids"]) for r in rows}) > 2
    k, rho = 5, 0.5
    scored = score_qa_records(model, tokenizer, rows, k=k, tau=threshold_from_probability(rho), batch_size=4)
    # the old separate batched passes: the very same values
    questions, answers = [r["question"] for r in rows], [r["answer"] for r in rows]
    assert [s.probability for s in scored] == answer_probability(model, tokenizer, questions, answers, batch_size=4)
    assert memorization_from(scored) == evaluate_memorization(model, tokenizer, rows, batch_size=4)
    old_bound = reproduction_bound(model, tokenizer, rows, k=k, rho=rho, batch_size=4)
    assert bound_from(scored, rho) == pytest.approx(old_bound, rel=1e-12, abs=1e-12)
    # one unpadded forward per example
    probabilities, memorization, bounds, fractions = one_at_a_time(model, tokenizer, rows, k, rho)
    assert [s.probability for s in scored] == pytest.approx(probabilities, rel=1e-5)
    assert [s.violation_fraction for s in scored] == pytest.approx(fractions, abs=1e-6)
    assert memorization_from(scored)["exact_memorization"] == pytest.approx(sum(m[0] for m in memorization) / 11)
    assert memorization_from(scored)["extraction_strength"] == pytest.approx(sum(m[1] for m in memorization) / 11)
    assert 0 < memorization_from(scored)["exact_memorization"] < 1  # neither all right nor all wrong
    assert bound_from(scored, rho)["mean"] == pytest.approx(sum(bounds) / len(bounds), rel=1e-9)


def test_evaluate_unlearning_reports_what_the_separate_passes_reported(tokenizer, records):
    model = tiny_model(tokenizer, "llama", seed=4, **SMALL)
    train_on_answers(model, tokenizer, records[:6], steps=40, lr=1e-2)
    forget, retain = records[:6], records[6:13]
    result = evaluate_unlearning(model, tokenizer, forget, retain, batch_size=4)
    for name, rows in (("forget", forget), ("retain", retain)):
        probability = answer_probability(
            model, tokenizer, [r["question"] for r in rows], [r["answer"] for r in rows], 4
        )
        assert result[name]["probability"] == sum(probability) / len(probability)
        for key, value in evaluate_memorization(model, tokenizer, rows, batch_size=4).items():
            assert result[name][key] == value
    bound = reproduction_bound(model, tokenizer, forget, batch_size=4)
    assert result["exact_reproduction_bound"] == pytest.approx(bound["mean"], rel=1e-12)
    assert result["exact_reproduction_bound_max"] == pytest.approx(bound["max"], rel=1e-12)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_greedy_decode_gives_generates_tokens_and_drops_finished_rows(tokenizer, records, architecture):
    model = tiny_model(tokenizer, architecture, seed=5, **SMALL)
    train_on_answers(model, tokenizer, records[:6], steps=60, lr=1e-2)  # some rows reach EOS early, some never
    model.eval()
    prompts = [tokenize_prompt(tokenizer, r["question"]) for r in records[:9]]
    assert len({len(p) for p in prompts}) > 1  # left padding really happens
    padded = left_pad(prompts, pad_token_id_of(tokenizer))
    args = (padded["input_ids"], padded["attention_mask"], 12, tokenizer.eos_token_id, pad_token_id_of(tokenizer))
    batch_sizes = []
    model.register_forward_pre_hook(
        lambda module, a, kwargs: batch_sizes.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    with torch.inference_mode():
        ours = greedy_decode(model, *args)
        steps = len(batch_sizes)
        theirs = generate_fallback(model, *args, tokenizer.bos_token_id)
    assert ours == theirs
    by_hand = [hand_greedy(model, tokenizer, p, 12) for p in prompts]
    assert [tokenizer.decode(row, skip_special_tokens=True).strip() for row in ours] == by_hand
    lengths = [len(row) for row in ours]
    assert min(lengths) < 12 and max(lengths) == 12  # rows finished at different steps
    # after the prompt, each step forwards only the rows still running
    running = [sum(length >= step for length in lengths) for step in range(1, 12)]
    assert batch_sizes[1:steps] == running[: steps - 1]


def test_a_registered_metric_reads_the_one_pass(tokenizer, records):
    from hf_unlearn.evaluation.scoring import ANSWER_METRICS, answer_metric, measure_answers

    model = tiny_model(tokenizer, "qwen2", seed=6, **SMALL)
    forwards = []
    model.register_forward_pre_hook(lambda module, a, kwargs: forwards.append(1), with_kwargs=True)

    @answer_metric("first_token_right", reads=("predictions",))
    def first_token_right(scores, rho):
        return {"first_token_right": sum(s.predictions[:1] == s.labels[:1] for s in scores) / len(scores)}

    try:
        rows = records[:5]
        scores, values = measure_answers(
            model, tokenizer, rows, ("first_token_right", "probability", "reproduction_bound"), k=4, batch_size=8
        )
        assert len(forwards) == 1  # one forward for three metrics
        expected = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in rows]
        assert [s.count for s in scores] == [sum(label != -100 for label in e["labels"][1:]) for e in expected]
        assert values["first_token_right"] == sum(s.predictions[0] == s.labels[0] for s in scores) / 5
        assert values["probability"] == sum(answer_probability(
            model, tokenizer, [r["question"] for r in rows], [r["answer"] for r in rows], 8
        )) / 5  # fmt: skip
        assert 0 <= values["exact_reproduction_bound"] <= 1
    finally:
        ANSWER_METRICS.pop("first_token_right", None)
    with pytest.raises(ValueError, match="reads \\['logits'\\]"):
        answer_metric("bad", reads=("logits",))
    with pytest.raises(ValueError, match="Unknown answer metric"):
        measure_answers(model, tokenizer, records[:2], ("no_such_metric",))


def options_of(record: dict, base_key: str) -> list[str]:
    return [record[base_key], *record["perturbed_answer"]]


def full_forward_scores(model, tokenizer, records, base_key, batch_size):
    """The old way: every (prompt + option) sequence through the model whole (answer_log_probs' batched pass)."""
    questions = [r["question"] for r in records for _ in options_of(r, base_key)]
    answers = [option for r in records for option in options_of(r, base_key)]
    scored = iter(answer_log_probs(model, tokenizer, questions, answers, batch_size=batch_size))
    means = [[total / count for total, count in (next(scored) for _ in options_of(r, base_key))] for r in records]
    return [(row[0], row[1:]) for row in means]


def count_tokens(model) -> list[int]:
    tokens: list[int] = []
    model.register_forward_pre_hook(lambda module, args, kwargs: tokens.append(kwargs["input_ids"].numel()),
                                    with_kwargs=True)  # fmt: skip
    return tokens


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
@pytest.mark.parametrize("batch_size", [3, 9, 32])  # one question a batch (4 options > 3), two, all seven
def test_options_after_one_prompt_give_the_full_forwards_values(tokenizer, records, architecture, batch_size):
    model = tiny_model(tokenizer, architecture, seed=7, **SMALL)
    train_on_answers(model, tokenizer, records[:6], steps=30, lr=1e-2)  # sharper than at random initialisation
    rows = records[:7]
    examples = [tokenize_qa(tokenizer, r["question"], o) for r in rows for o in options_of(r, "paraphrased_answer")]
    assert len({prompt_length(e) for e in examples}) > 1  # prompts of different lengths are left-padded together
    assert len({len(e["input_ids"]) - prompt_length(e) for e in examples}) > 2  # options of mixed lengths
    assert prompt_cache_keyword(model) is not None
    old = full_forward_scores(model, tokenizer, rows, "paraphrased_answer", batch_size)
    tokens = count_tokens(model)
    new = option_scores(model, tokenizer, rows, "paraphrased_answer", batch_size, show_progress=False)
    for (old_base, old_options), (new_base, new_options) in zip(old, new, strict=True):
        assert new_base == pytest.approx(old_base, rel=1e-4, abs=1e-5)
        assert new_options == pytest.approx(old_options, rel=1e-4, abs=1e-5)
    # the prompt was encoded once per question: fewer tokens than the full forwards' unpadded sequences
    assert sum(tokens) < sum(len(e["input_ids"]) for e in examples)
    # and against one unpadded forward per (prompt + option), by hand
    by_hand = [hand_answer_log_probs(model, e) for e in examples]
    flat = [value for base, options in new for value in [base, *options]]
    assert flat == pytest.approx([sum(v) / len(v) for v in by_hand], rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("architecture", ["llama", "gpt2"])
def test_truth_ratio_and_real_knowledge_probability_read_the_one_option_scorer(tokenizer, records, architecture):
    model = tiny_model(tokenizer, architecture, seed=8, **SMALL)
    rows = records[:5]
    ratios = truth_ratios(model, tokenizer, rows, batch_size=8)
    old = full_forward_scores(model, tokenizer, rows, "paraphrased_answer", 8)
    assert ratios == pytest.approx(truth_ratios_from(old), rel=1e-4)
    probabilities = normalized_probabilities(model, tokenizer, rows, batch_size=8)
    old_answer = full_forward_scores(model, tokenizer, rows, "answer", 8)
    expected = [1 / (1 + sum(torch.tensor(p - base).exp().item() for p in options)) for base, options in old_answer]
    assert probabilities == pytest.approx(expected, rel=1e-4)


class NoCacheLM(torch.nn.Module):
    """A causal LM whose forward takes no cache and no position ids (as a custom model's may): the full forward."""

    def __init__(self, model) -> None:
        super().__init__()
        self.model = model
        self.config = model.config

    def forward(self, input_ids, attention_mask=None):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def test_a_model_without_a_cache_is_scored_by_the_full_forward(tokenizer, records):
    model = NoCacheLM(tiny_model(tokenizer, "qwen2", seed=9, **SMALL))
    assert prompt_cache_keyword(model) is None
    rows = records[:4]
    examples = [tokenize_qa(tokenizer, r["question"], o) for r in rows for o in options_of(r, "answer")]
    tokens = count_tokens(model)
    scored = score_after_prompts(model, examples, pad_token_id_of(tokenizer), batch_size=5)
    assert sum(tokens) >= sum(len(e["input_ids"]) for e in examples)  # every prompt once per option
    questions = [r["question"] for r in rows for _ in options_of(r, "answer")]
    answers = [o for r in rows for o in options_of(r, "answer")]
    assert scored == answer_log_probs(model, tokenizer, questions, answers, batch_size=5)


#: A format string with a system prompt before every question, as a chat template puts one (SmolLM2's is ~30 tokens).
SYSTEM_PROMPT = (
    "You are a careful assistant who answers questions about authors briefly. Question: {question}\nAnswer:"
)


@pytest.mark.parametrize("architecture", ["llama", "qwen2", "gpt2"])
def test_a_batchs_shared_prefix_is_run_once_and_gives_the_full_forwards_values(
    tokenizer, records, architecture, monkeypatch
):
    """score_teacher_forced runs the leading tokens every row of a batch shares once into a KV cache and the rest as
    its continuation: the same values as one unpadded forward per example (questions and answers of mixed lengths,
    right-padded together) and as the full forward, with fewer tokens through the model."""
    model = tiny_model(tokenizer, architecture, seed=10, **SMALL)
    train_on_answers(model, tokenizer, records[:6], steps=30, lr=1e-2)  # sharper than at random initialisation
    examples = [tokenize_qa(tokenizer, r["question"], r["answer"], prompt_template=SYSTEM_PROMPT) for r in records[:9]]
    pad_id = pad_token_id_of(tokenizer)
    prefix = forwards.shared_prefix_length(pad_examples(examples, pad_id)["input_ids"], 10**6)
    assert prefix >= forwards.SHARED_PREFIX_MIN_TOKENS  # the system prompt's tokens, shared by every row
    assert len({len(e["input_ids"]) for e in examples}) > 2 and len({prompt_length(e) for e in examples}) > 1
    tokens = count_tokens(model)
    shared = score_teacher_forced(model, examples, pad_id, log_prob_sums_and_counts, batch_size=4)
    shared_tokens = sum(tokens)
    by_hand = [hand_answer_log_probs(model, e) for e in examples]
    assert [total / count for total, count in shared] == pytest.approx(
        [sum(v) / len(v) for v in by_hand], rel=1e-4, abs=1e-5
    )
    tokens.clear()
    monkeypatch.setattr(forwards, "SHARED_PREFIX_MIN_TOKENS", 10**6)  # the shared prefix off: the full forward
    whole = score_teacher_forced(model, examples, pad_id, log_prob_sums_and_counts, batch_size=4)
    assert [count for _, count in shared] == [count for _, count in whole]
    assert [total for total, _ in shared] == pytest.approx([total for total, _ in whole], rel=1e-4, abs=1e-5)
    # the two batches of 4 ran the prefix once instead of 4 times; the batch of one ran whole
    assert sum(tokens) - shared_tokens == 2 * (4 - 1) * prefix
