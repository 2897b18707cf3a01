"""The request ledger: fingerprints, one entry per run, appended when a saved model is unlearned again, the card."""

import json
import os

import pytest
from conftest import unlearn_config
from transformers import AutoModelForCausalLM

from hf_unlearn import UnlearnTrainer, build_qa_dataset
from hf_unlearn.outputs.model_card import build_model_card
from hf_unlearn.training.ledger import LEDGER_FILE, forget_set_fingerprint, ledger_markdown, load_ledger
from hf_unlearn.training.record import UnlearnRecord


def test_fingerprint_names_the_content_not_the_order():
    a = [{"question": "Q1", "answer": "A1"}, {"question": "Q2", "answer": "A2"}]
    assert forget_set_fingerprint(a) == forget_set_fingerprint(list(reversed(a)))
    assert forget_set_fingerprint(a) != forget_set_fingerprint([a[0], {"question": "Q2", "answer": "A3"}])
    assert forget_set_fingerprint(a).startswith("sha256:") and len(forget_set_fingerprint(a)) == 7 + 64
    # Tokenized examples without text are named by their ids.
    ids = [{"input_ids": [1, 2, 3], "labels": [-100, 2, 3]}]
    assert forget_set_fingerprint(ids) != forget_set_fingerprint([{"input_ids": [1, 2, 4], "labels": [-100, 2, 4]}])


def test_load_ledger_refuses_other_json(tmp_path):
    assert load_ledger(tmp_path) == []
    (tmp_path / LEDGER_FILE).write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="not an unlearning ledger"):
        load_ledger(tmp_path)


def _run(model, tokenizer, forget, retain, output_dir):
    config = unlearn_config(output_dir, method="masc", max_steps=3, learning_rate=1e-3, per_device_train_batch_size=4)
    trainer = UnlearnTrainer(
        model,
        config,
        build_qa_dataset(forget, tokenizer),
        build_qa_dataset(retain, tokenizer, name="retain"),
        processing_class=tokenizer,
    )
    trainer.train()
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))
    return trainer


def test_a_model_unlearned_again_appends_to_its_ledger(tmp_path, suppressed_setting):
    setting = suppressed_setting
    import copy

    tokenizer, forget, retain = setting["tokenizer"], setting["forget"], setting["retain"]
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first = _run(copy.deepcopy(setting["target"]), tokenizer, forget[:5], retain, first_dir)
    ledger = load_ledger(first_dir)
    assert len(ledger) == 1
    entry = ledger[0]
    assert entry["request"] == 1 and entry["method"] == "masc" and entry["stop_step"] == first.state.global_step
    assert entry["forget_fingerprint"] == forget_set_fingerprint(forget[:5])
    assert entry["num_forget_examples"] == 5 and entry["complete"] and entry["date"].endswith("+00:00")

    # Loaded back from its folder and unlearned again: the earlier request travels with it.
    reloaded = AutoModelForCausalLM.from_pretrained(str(first_dir))
    second = _run(reloaded, tokenizer, forget[5:], retain, second_dir)
    assert second.earlier_requests == ledger
    appended = load_ledger(second_dir)
    assert [e["request"] for e in appended] == [1, 2]
    assert appended[0] == entry
    assert appended[1]["forget_fingerprint"] == forget_set_fingerprint(forget[5:]) != entry["forget_fingerprint"]
    # The record says it too, and the card (also as rendered for a Hub push) lists both requests.
    record = UnlearnRecord.load(str(second_dir))
    assert record.earlier_requests == [entry]
    for card in (open(os.path.join(second_dir, "README.md")).read(), str(build_model_card(record, "me/model"))):
        assert "## Unlearning requests" in card and "unlearned 1 time before" in card
        for e in appended:
            assert e["forget_fingerprint"].removeprefix("sha256:")[:12] in card
    # A model not loaded from a folder with a ledger starts a new one.
    assert (
        _run(copy.deepcopy(setting["target"]), tokenizer, forget[:5], retain, tmp_path / "third").earlier_requests
        == []
    )


def test_ledger_markdown_rows():
    entries = [
        {
            "request": 1,
            "name": "author A",
            "forget_fingerprint": "sha256:" + "ab" * 32,
            "num_forget_examples": 5,
            "date": "2026-11-30T05:00:00+00:00",
            "method": "masc",
            "gradient_surgery": "sago",
            "stop_step": 40,
            "stop_reason": "target | reached",
            "after": {"forget": {"rouge_l_recall": 0.25}, "retain": {"rouge_l_recall": 0.9}},
        }
    ]
    table = ledger_markdown(entries)
    row = table.splitlines()[2]
    assert "author A (5 examples, `abababababab`)" in row and "masc + sago" in row and "| 40 |" in row
    assert "forget ROUGE-L 0.250, retain ROUGE-L 0.900" in row and "target \\| reached" in row
