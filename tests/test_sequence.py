"""Sequential unlearning: every request re-measured after each run, earlier ones coming back flagged, the ledger."""

import copy
import json
import os

import pytest
import torch
from conftest import unlearn_config
from peft import LoraConfig
from transformers import AutoModelForCausalLM

from hf_unlearn.jobs.sequence import ForgetRequest, earlier_requests_back, sequence_markdown, unlearn_sequentially
from hf_unlearn.training.ledger import forget_set_fingerprint, load_ledger


def point(k, name, **forget):
    return {"after_request": k, "name": name, "forget": {n: {"rouge_l_recall": v} for n, v in forget.items()}}


def test_an_earlier_request_that_comes_back_is_found():
    history = [point(0, None, a=1.0, b=1.0, c=1.0), point(1, "a", a=0.1, b=0.9, c=1.0)]
    assert earlier_requests_back(history) == []  # nothing earlier than the first request
    back = earlier_requests_back([*history, point(2, "b", a=0.3, b=0.2, c=1.0)])
    assert back == [{"request": "a", "after_request": 2, "own_run": 0.1, "now": 0.3, "rise": pytest.approx(0.2)}]
    # A rise within the threshold is not a return; a later request's own level is never judged early.
    assert earlier_requests_back([*history, point(2, "b", a=0.14, b=0.2, c=1.0)]) == []
    # Compared with the request's value after its own run, not with the start.
    history3 = [*history, point(2, "b", a=0.1, b=0.2, c=1.0), point(3, "c", a=0.12, b=0.5, c=0.1)]
    assert [f["request"] for f in earlier_requests_back(history3)] == ["b"]


def config(output_dir, **overrides):
    return unlearn_config(
        output_dir,
        **{**dict(method="masc", max_steps=4, learning_rate=1e-3, per_device_train_batch_size=4), **overrides},
    )


def test_three_requests_are_measured_after_each_run_and_ledgered(tmp_path, suppressed_setting):
    setting = suppressed_setting
    tokenizer, forget, retain = setting["tokenizer"], setting["forget"], setting["retain"]
    requests = [ForgetRequest("first", forget[:4]), ("second", forget[4:7]), {"name": "third", "records": forget[7:]}]
    result = unlearn_sequentially(
        copy.deepcopy(setting["target"]), tokenizer, requests, retain, config(tmp_path), max_eval_examples=10
    )
    names = ["first", "second", "third"]
    assert result.requests == names and [p["after_request"] for p in result.history] == [0, 1, 2, 3]
    for p in result.history:
        assert set(p["forget"]) == set(names) and p["retain"]["num_examples"] == 10
    # Earlier requests are measured again on the changed model, not copied forward.
    assert result.history[2]["forget"]["first"]["probability"] != result.history[1]["forget"]["first"]["probability"]
    assert all(p["stop_step"] >= 1 for p in result.history[1:])
    # The ledger: one entry per request, in order, each naming its own forget set.
    assert [e["request"] for e in result.ledger] == [1, 2, 3] and [e["name"] for e in result.ledger] == names
    for entry, records in zip(result.ledger, (forget[:4], forget[4:7], forget[7:]), strict=True):
        assert entry["forget_fingerprint"] == forget_set_fingerprint(records)
    assert (
        result.ledger[2]["after"]["forget"]["rouge_l_recall"] == result.history[3]["forget"]["third"]["rouge_l_recall"]
    )
    # What was saved: the model (loads back with its ledger), the card, the table, the plot.
    assert load_ledger(tmp_path) == result.ledger
    AutoModelForCausalLM.from_pretrained(str(tmp_path))
    card = open(os.path.join(tmp_path, "README.md")).read()
    assert "unlearned 2 times before" in card and all(f"| {k} |" in card for k in (1, 2, 3))
    saved = json.load(open(result.paths["sequence"]))
    assert saved["history"] == json.loads(json.dumps(result.history))
    assert open(result.paths["plot"], "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "| 3: third |" in sequence_markdown(result)
    assert os.path.isdir(tmp_path / "request_1") and os.path.isdir(tmp_path / "request_3")


def test_lora_requests_are_merged_before_the_next(tmp_path, suppressed_setting):
    setting = suppressed_setting
    tokenizer, forget, retain = setting["tokenizer"], setting["forget"], setting["retain"]
    # The shared setting is GPT-2 (float64, kernel-independent): its attention projection is the fused Conv1D c_attn.
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM")
    result = unlearn_sequentially(
        copy.deepcopy(setting["target"]),
        tokenizer,
        [("a", forget[:5]), ("b", forget[5:])],
        retain,
        config(tmp_path, learning_rate=1e-2),
        peft_config=lora,
        max_eval_examples=5,
    )
    assert not hasattr(result.model, "peft_config")  # a plain model, the adapters merged in
    assert not os.path.exists(tmp_path / "adapter_config.json") and os.path.exists(tmp_path / "config.json")
    before = dict(setting["target"].named_parameters())
    changed = [n for n, p in result.model.named_parameters() if not torch.equal(p, before[n])]
    assert changed and all(n.endswith("attn.c_attn.weight") for n in changed)
    assert [e["request"] for e in load_ledger(tmp_path)] == [1, 2]


@pytest.mark.parametrize(
    "requests, message",
    [
        ([], "No forget request"),
        ([("a", [{"question": "Q", "answer": "A"}]), ("a", [{"question": "Q2", "answer": "A2"}])], "unique"),
        ([("a", [{"question": "Q", "answer": "A"}]), ("b", [])], "request 'b'"),
        (["just a name"], "Request 0 is a str"),
    ],
)
def test_bad_requests_are_refused_before_any_training(tmp_path, suppressed_setting, requests, message):
    model = copy.deepcopy(suppressed_setting["target"])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises((ValueError, TypeError), match=message):
        unlearn_sequentially(
            model, suppressed_setting["tokenizer"], requests, suppressed_setting["retain"], config(tmp_path)
        )
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not os.path.exists(tmp_path / "request_1")


def test_a_calibration_set_the_papers_mode_does_not_read_is_refused_before_the_first_request(
    tmp_path, suppressed_setting, monkeypatch
):
    """The library's defaults (the paper's mode) read no calibration set: given one, the sequence refuses before the
    first request trains or is measured, naming the options that read one."""
    from hf_unlearn.jobs import sequence

    measured = []
    monkeypatch.setattr(sequence, "measure_qa_sets", lambda *args, **kwargs: measured.append(1))
    setting = suppressed_setting
    model = copy.deepcopy(setting["target"])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    requests = [("a", setting["forget"][:5]), ("b", setting["forget"][5:])]
    with pytest.raises(ValueError, match="calibration_dataset is given, but masc_threshold='rho'"):
        unlearn_sequentially(
            model, setting["tokenizer"], requests, setting["retain"], config(tmp_path),
            calibration_records=setting["holdout"],
        )  # fmt: skip
    assert not measured  # refused before the measurement that precedes the first request
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not os.path.exists(tmp_path / "request_1")


def test_what_a_later_request_would_refuse_is_refused_before_the_first_trains(tmp_path, suppressed_setting):
    setting = suppressed_setting
    model = copy.deepcopy(setting["target"])
    state = {k: v.clone() for k, v in model.state_dict().items()}
    requests = [("a", setting["forget"][:5]), ("b", setting["forget"][5:])]
    with pytest.raises(ValueError, match="--retain_data"):
        unlearn_sequentially(model, setting["tokenizer"], requests, None, config(tmp_path))
    # AltPO: the second request lacks the alternative answers it needs.
    bare = [{"question": r["question"], "answer": r["answer"]} for r in setting["forget"][5:]]
    with_alternates = [dict(r, perturbed_answer=["Nobody knows."]) for r in setting["forget"][:5]]
    with pytest.raises(ValueError, match="column 'perturbed_answer'"):
        unlearn_sequentially(
            model,
            setting["tokenizer"],
            [("a", with_alternates), ("b", bare)],
            setting["retain"],
            config(tmp_path, method="altpo"),
        )
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert not os.path.exists(tmp_path / "request_1")
