"""Exact memorisation and extraction strength (open-unlearning's definitions, hf_unlearn.evaluation.memorization)
against hand computations: on token lists, on a toy model whose greedy predictions are set by hand, on a tiny
transformer whose argmaxes the test computes itself, and in `hf-unlearn eval`'s output, the report and the card."""

import json
import types

import pytest
import torch
from conftest import tiny_model_folder, train_on_answers, write_qa_files

from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
from hf_unlearn.cli import main
from hf_unlearn.data.examples import tokenize_qa
from hf_unlearn.evaluation.memorization import (
    evaluate_memorization,
    exact_memorization,
    extraction_strength,
    memorization_scores,
    teacher_forced_predictions,
)
from hf_unlearn.evaluation.suites import evaluate_unlearning
from hf_unlearn.outputs.model_card import build_model_card
from hf_unlearn.outputs.report import report_markdown
from hf_unlearn.training.record import UnlearnRecord

EOS = 7


@pytest.mark.parametrize(
    "predictions, labels, em, es",
    [
        ([3, 4, 5, 6], [3, 4, 5, 6], 1.0, 1.0),  # all right: k = 0
        ([3, 9, 5, 6], [3, 4, 5, 6], 0.75, 0.5),  # right from position 2 on: k = 2, 1 - 2/4
        ([9, 4, 5, 6], [3, 4, 5, 6], 0.75, 0.75),  # only the first wrong: k = 1
        ([3, 4, 5, 9], [3, 4, 5, 6], 0.75, 0.25),  # last wrong, no suffix matches: open-unlearning's k = L - 1, 1/L
        ([9, 9, 9, 6], [3, 4, 5, 6], 0.25, 0.25),  # only the last right: k = 3, also 1/L
        ([9, 9, 9, 9], [3, 4, 5, 6], 0.0, 0.25),  # nothing right: still 1/L (the quirk), EM 0
        ([8], [8], 1.0, 1.0),
    ],
)
def test_definitions_on_token_lists(predictions, labels, em, es):
    assert exact_memorization(predictions, labels) == pytest.approx(em)
    assert extraction_strength(predictions, labels) == pytest.approx(es)


def test_mismatched_or_empty_lists_are_refused():
    with pytest.raises(ValueError, match="as many predictions"):
        exact_memorization([1, 2], [1])
    with pytest.raises(ValueError, match="at least one"):
        extraction_strength([], [])


class BigramModel(torch.nn.Module):
    """A causal LM whose logits at a position depend only on that position's token: ``logits[t] = 10 *
    one_hot(successor[input_ids[t]])``, so its teacher-forced greedy prediction of token t + 1 is
    ``successor[input_ids[t]]``, whatever the padding and batching."""

    def __init__(self, successor: dict[int, int], vocab_size: int = 16):
        super().__init__()
        table = torch.zeros(vocab_size, vocab_size)
        for token, following in successor.items():
            table[token, following] = 10.0
        self.table = torch.nn.Parameter(table)

    def forward(self, input_ids, attention_mask=None):
        return types.SimpleNamespace(logits=self.table[input_ids])


def qa_example(prompt: list[int], answer: list[int]) -> dict:
    ids = prompt + answer + [EOS]
    return {"input_ids": ids, "attention_mask": [1] * len(ids), "labels": [-100] * len(prompt) + answer + [EOS]}


def test_a_model_whose_predictions_are_set_by_hand():
    # Three answers, each token distinct so the bigram table sets every prediction. The EOS is always predicted wrong
    # (successor 15): were it scored, EM and ES would differ from the values below.
    full = qa_example([1, 2], [3, 4, 5, 6])  # predictions 3 4 5 6: EM 1, ES 1
    partial = qa_example([8], [9, 10, 11])  # predictions 9 0 11: EM 2/3, suffix from position 2: ES 1 - 2/3
    none = qa_example([12], [13, 14])  # predictions 13 0: last wrong, no suffix: EM 1/2, ES 1/L = 1/2
    successor = {2: 3, 3: 4, 4: 5, 5: 6, 6: 15, 8: 9, 9: 0, 10: 11, 11: 15, 12: 13, 13: 0, 14: 15}
    model = BigramModel(successor).train()
    for batch_size in (1, 2, 3):  # padded to one length, sorted by length, and restored to the examples' order
        pairs = teacher_forced_predictions(model, [full, partial, none], pad_token_id=0, batch_size=batch_size)
        assert pairs == [([3, 4, 5, 6], [3, 4, 5, 6]), ([9, 0, 11], [9, 10, 11]), ([13, 0], [13, 14])]
    assert model.training  # the training mode is restored
    em = [exact_memorization(*pair) for pair in pairs]
    es = [extraction_strength(*pair) for pair in pairs]
    assert em == pytest.approx([1.0, 2 / 3, 0.5])
    assert es == pytest.approx([1.0, 1 / 3, 0.5])


def hand_scores(model, tokenizer, record):
    """EM and ES of one record from a plain forward on the unpadded sequence: argmax of the logits at t - 1 for every
    answer label t but the last (EOS), then the definitions written out again."""
    example = tokenize_qa(tokenizer, record["question"], record["answer"])
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([example["input_ids"]])).logits[0]
    positions = [t for t, label in enumerate(example["labels"]) if label != -100][:-1]
    predictions = [int(logits[t - 1].argmax()) for t in positions]
    labels = [example["labels"][t] for t in positions]
    right = [p == y for p, y in zip(predictions, labels)]
    length = len(labels)
    k = 0
    while k < length - 1 and not all(right[k:]):
        k += 1
    return sum(right) / length, 1 - k / length


@pytest.fixture(scope="module")
def partly_learned():
    """A tiny GPT-2 that learned forget01 part way, so that answers are neither all right nor all wrong."""
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "gpt2", hidden_size=32, num_layers=1, num_heads=2)
    records = list(load_split("forget01").select_columns(["question", "answer"]))
    train_on_answers(model, tokenizer, records, steps=20, lr=1e-2)
    return model, tokenizer, records


def test_tiny_transformer_against_its_own_argmaxes(partly_learned):
    model, tokenizer, records = partly_learned
    hand = [hand_scores(model, tokenizer, r) for r in records]
    scores = memorization_scores(
        model, tokenizer, [r["question"] for r in records], [r["answer"] for r in records], batch_size=2
    )
    assert [s["exact_memorization"] for s in scores] == pytest.approx([em for em, _ in hand])
    assert [s["extraction_strength"] for s in scores] == pytest.approx([es for _, es in hand])
    # Partly learned: some answers partly right, so neither metric is trivially 0 or 1 here.
    assert 0 < sum(em for em, _ in hand) / len(hand) < 1
    means = evaluate_memorization(model, tokenizer, records)
    assert means["exact_memorization"] == pytest.approx(sum(em for em, _ in hand) / len(hand))
    assert means["extraction_strength"] == pytest.approx(sum(es for _, es in hand) / len(hand))
    # And evaluate_unlearning reports them on both sides.
    result = evaluate_unlearning(model, tokenizer, records, records[:2])
    assert result["forget"]["extraction_strength"] == pytest.approx(means["extraction_strength"])
    assert result["retain"]["exact_memorization"] == pytest.approx(sum(em for em, _ in hand[:2]) / 2)


def test_eval_writes_both_into_eval_json_and_eval_md(tmp_path):
    tiny_model_folder(tmp_path / "model", "llama", hidden_size=32, num_layers=1, num_heads=2)
    write_qa_files(tmp_path)
    out = tmp_path / "eval"
    argv = ["eval", "--model_name_or_path", str(tmp_path / "model"), "--forget_data", str(tmp_path / "forget.json")]
    assert main([*argv, "--retain_data", str(tmp_path / "retain.jsonl"), "--output_dir", str(out)]) == 0
    result = json.loads((out / "eval.json").read_text())
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "model")
    forget = [json.loads(line) for line in (tmp_path / "forget.json").read_text().splitlines()]
    hand = [hand_scores(model, tokenizer, r) for r in forget]
    assert result["forget"]["exact_memorization"] == pytest.approx(sum(em for em, _ in hand) / len(hand))
    assert result["forget"]["extraction_strength"] == pytest.approx(sum(es for _, es in hand) / len(hand))
    assert 0 <= result["retain"]["extraction_strength"] <= 1
    markdown = (out / "eval.md").read_text()
    assert "exact memorisation | extraction strength" in markdown
    assert f"{result['forget']['extraction_strength']:.4g}" in markdown


def test_report_and_card_show_them_before_and_after(tmp_path):
    record = UnlearnRecord(method="masc", forget_objective="masc", retain_objective="kl")
    metrics = {"rouge_l_recall": 0.9, "probability": 0.8, "exact_match": 0.7}
    record.update(
        before={"forget": {**metrics, "exact_memorization": 0.9125, "extraction_strength": 0.8375}},
        after={"forget": {**metrics, "exact_memorization": 0.3125, "extraction_strength": 0.1875}},
    )
    report = report_markdown(record)
    assert "| forget | exact_memorization | 0.912 | 0.312 | -0.600 |" in report
    assert "| forget | extraction_strength | 0.838 | 0.188 | -0.650 |" in report
    card = str(build_model_card(record, str(tmp_path)))
    assert "| forget | exact_memorization | 0.9125 | 0.3125 |" in card
    assert "| forget | extraction_strength | 0.8375 | 0.1875 |" in card
