"""The run record: what the trainer puts in it, why it says a run stopped, and that it survives disk and resume."""

import json

import pytest
from conftest import make_example, make_tiny_model, unlearn_config

from hf_unlearn import UnlearnRecord, UnlearnTrainer
from hf_unlearn.outputs.report import report_markdown, write_report

FORGET = [make_example(i) for i in range(8)]
RETAIN = [make_example(1000 + i) for i in range(16)]


def config(tmp_path, **overrides):
    return unlearn_config(
        tmp_path, **{**dict(max_steps=6, probe_interval=2, learning_rate=3e-3, forget_weight=1.0), **overrides}
    )


def test_stop_reasons_say_what_ended_the_run(tmp_path, memorized_llama_state):
    def run(**overrides):
        model = make_tiny_model()
        model.load_state_dict(memorized_llama_state)
        trainer = UnlearnTrainer(model, config(tmp_path, **overrides), FORGET, RETAIN)
        trainer.train()
        return trainer.record

    stopped = run(stop_alpha=1.0)
    assert stopped.stopped_early and stopped.stop_step == stopped.global_step == 2
    assert stopped.stop_kind == "target" and stopped.success
    assert stopped.stop_reason.startswith("target reached: the violation rate of the train probe fell to alpha = 1 ")
    budget = run(stop_alpha=0.0)
    assert not budget.stopped_early and budget.stop_step is None and budget.global_step == 6
    assert budget.stop_kind == "budget" and budget.success
    assert budget.stop_reason.startswith("budget exhausted: all 6 steps ran without meeting the stopping rule (last")
    measuring = run(method="graddiff")
    assert measuring.stop_reason == "budget exhausted: all 6 steps ran (no stopping rule)"
    assert "stop_alpha" not in measuring.hyperparameters and measuring.violation_rate is not None
    assert [entry["step"] for entry in measuring.probe_history] == [0, 2, 4, 6]


def test_the_record_names_what_departs_from_the_papers(tmp_path, memorized_llama_state):
    """MASC in our calibrated mode (by name, the rest default): the calibrated threshold, the two-sided hinge, the id
    matching, the rival KL and the Min-K% stop are beyond arXiv 2606.02920, and the record, report and card say so; the
    paper's own mode (tau, alpha) and a baseline without a stop have nothing to list."""
    from hf_unlearn.objectives.masc.options import CALIBRATED_MODE
    from hf_unlearn.outputs.model_card import build_model_card

    def record(calibrated, **overrides):
        model = make_tiny_model()
        model.load_state_dict(memorized_llama_state)
        # 24 and 24 answers: enough for the Min-K% stop to read its AUC to within 0.1
        forget = [make_example(i) for i in range(24)]
        never_seen = [make_example(2000 + i) for i in range(24)] if calibrated else None
        if calibrated:
            overrides = {**CALIBRATED_MODE, **overrides}
        trainer = UnlearnTrainer(
            model, config(tmp_path, max_steps=2, **overrides), forget, RETAIN, calibration_dataset=never_seen
        )
        return trainer.record

    calibrated = record(True)
    names = [departure.split(":")[0] for departure in calibrated.beyond_paper]
    assert names == [
        "masc_threshold='calibration'", "masc_hinge='two_sided'", "calibration_match='id_spread'",
        "masc_rival_kl=5", "stop_target='membership'",
    ]  # fmt: skip
    assert "(AUC >= 0.45)" in calibrated.beyond_paper[-1]
    assert "Beyond the papers: masc_threshold='calibration'" in report_markdown(calibrated)
    assert "| Beyond the papers | masc_threshold='calibration'" in str(build_model_card(calibrated, str(tmp_path)))
    gap = record(True, stop_target="calibration", masc_hinge="one_sided", calibration_match="rank",
                 masc_rival_kl=0.0).beyond_paper  # fmt: skip
    assert [departure.split(":")[0] for departure in gap] == [
        "masc_threshold='calibration'",
        "stop_target='calibration'",
    ]
    assert record(False).beyond_paper == [] and record(False, method="graddiff").beyond_paper == []
    assert "Beyond the papers" not in report_markdown(record(False))


def test_record_round_trips_through_disk_and_names_unknown_fields(tmp_path):
    trainer = UnlearnTrainer(make_tiny_model(), config(tmp_path, max_steps=2), FORGET, RETAIN)
    trainer.train()
    record = trainer.record.update(before={"forget": {"rouge_l_recall": 1.0}}, extra={"benchmark": "mine"})
    path = record.save(str(tmp_path / "saved"))
    loaded = UnlearnRecord.load(path)
    assert loaded == record and loaded.complete
    assert json.loads(open(path).read())["forget_dataset"] == {"name": None, "num_examples": 8, "num_trained": 8,
                                                               "num_held_out": 0}  # fmt: skip
    assert loaded.hyperparameters["masc_k"] == 10 and loaded.hyperparameters["lr_scheduler_type"] == "constant"
    with pytest.raises(AttributeError, match="UnlearnRecord has no field befor"):
        record.update(befor={})
    with pytest.raises(FileNotFoundError, match="No unlearning record"):
        UnlearnRecord.load(str(tmp_path / "nowhere"))
    paths = write_report(loaded, str(tmp_path / "report"))
    assert json.loads(open(paths["json"]).read()) == loaded.to_dict()
    assert "Why it stopped: " + loaded.stop_reason in report_markdown(loaded)


def test_a_resumed_run_records_the_same_stop(tmp_path, memorized_llama_state):
    def fresh():
        model = make_tiny_model()
        model.load_state_dict(memorized_llama_state)
        return model

    common = dict(stop_alpha=0.3, probe_interval=2, max_steps=40, save_strategy="steps", save_steps=2)
    first = UnlearnTrainer(fresh(), config(tmp_path / "a", **common), FORGET, RETAIN)
    first.train()
    assert first.record.stopped_early
    stop = first.record.stop_step
    partial = UnlearnRecord.load(str(tmp_path / "a" / f"checkpoint-{stop - 2}"))
    assert not partial.complete and partial.global_step == stop - 2 and partial.exact_reproduction_bound is None
    resumed = UnlearnTrainer(fresh(), config(tmp_path / "b", **common), FORGET, RETAIN)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / f"checkpoint-{stop - 2}"))
    assert resumed.record.stop_step == stop and resumed.record.stop_reason == first.record.stop_reason
    assert [h["step"] for h in resumed.record.probe_history] == [h["step"] for h in first.record.probe_history]
    assert resumed.record.exact_reproduction_bound["mean"] == pytest.approx(
        first.record.exact_reproduction_bound["mean"], rel=1e-4
    )
