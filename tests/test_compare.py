"""`hf-unlearn compare` on a small grid: the table and compare.json hold what later checks read."""

import json

import pytest

from hf_unlearn.cli import main
from hf_unlearn.compare import _distance, _meets

TARGET = {"forget_rouge_l_recall_max": 0.5, "retain_rouge_l_recall_min": 0.9}


def row(forget, retain):
    return {"forget": {"rouge_l_recall": forget}, "retain": {"rouge_l_recall": retain}}


def test_target_region_and_distance():
    assert _meets(row(0.5, 0.9), TARGET) and not _meets(row(0.51, 0.99), TARGET)
    assert _distance(row(0.4, 0.95), TARGET) == 0
    assert _distance(row(1.0, 0.9), TARGET) == pytest.approx(1.0)
    assert _distance(row(0.5, 0.45), TARGET) == pytest.approx(0.5)


@pytest.mark.slow
def test_compare_writes_the_table_json_and_plot(tmp_path):
    out = tmp_path / "cmp"
    main(
        [
            "compare",
            "--methods",
            "graddiff",
            "simnpo",
            "--learning_rates",
            "1e-3",
            "--epochs",
            "2",
            "--retain_eval_size",
            "20",
            "--output_dir",
            str(out),
        ]
    )
    result = json.loads((out / "compare.json").read_text())
    assert {"forget_rouge_l_recall_max", "retain_rouge_l_recall_min"} <= result["target"].keys()
    assert set(result["methods"]) == {"masc", "graddiff", "simnpo"}
    for method in result["methods"].values():
        assert {"reached_target", "time_to_target_seconds", "grid_seconds", "best_learning_rate", "steps"} <= set(
            method
        )
        for side in ("forget", "retain"):
            assert {"rouge_l_recall", "probability"} <= method[side].keys()
        if method["reached_target"]:
            assert method["time_to_target_seconds"] <= method["grid_seconds"] + 1e-9
        else:
            assert method["time_to_target_seconds"] is None
    assert len(result["methods"]["graddiff"]["learning_rates"][0]["epochs"]) == 2
    assert result["methods"]["masc"]["stopped_early"]
    assert "| masc |" in (out / "compare.md").read_text()
    assert (out / "compare.png").stat().st_size > 10_000


@pytest.mark.slow
def test_compare_with_lora_trains_adapters_on_every_run(tmp_path):
    out = tmp_path / "cmp"
    main(["compare", "--methods", "ga", "--learning_rates", "1e-3", "--epochs", "1", "--retain_eval_size", "10",
          "--lora_r", "4", "--output_dir", str(out)])  # fmt: skip
    result = json.loads((out / "compare.json").read_text())
    assert result["lora_r"] == 4 and set(result["methods"]) == {"masc", "ga"}
    # With LoRA on the tiny model, MASC still moves the forget set (the adapter is what trains).
    assert (
        result["methods"]["masc"]["forget"]["probability"] < 0.5 * result["target"]["before"]["forget"]["probability"]
    )
