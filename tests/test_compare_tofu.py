"""`hf-unlearn compare --benchmark tofu`: TOFU's real author rows split into roles, and a CI-sized miniature of the
whole comparison (a tiny model learned from scratch instead of SmolLM2, a few questions, a few steps)."""

import json
import math
import os

import pytest
from conftest import TOFU_DIR, needs_tofu_rows
from scipy.stats import hmean

from hf_unlearn.benchmarks.tofu_target import TofuAuthorSplit, tofu_sets
from hf_unlearn.cli import main
from hf_unlearn.jobs.compare import in_region, region_misses

pytestmark = needs_tofu_rows


def test_authors_take_their_roles_in_order_and_never_overlap():
    split = TofuAuthorSplit.in_order(range(15), num_forget=2, num_retain=4, num_calibration=2, num_holdout=3)
    assert split.forget == (0, 1) and split.retain == (2, 3, 4, 5)
    assert split.calibration == (6, 7) and split.holdout == (8, 9, 10)
    assert split.learned == (0, 1, 2, 3, 4, 5)
    with pytest.raises(ValueError, match="has 15 authors; forget 12 \\+ retain 2 \\+ calibration 1 \\+ holdout 1"):
        TofuAuthorSplit.in_order(range(15), num_forget=12, num_retain=2, num_calibration=1, num_holdout=1)
    with pytest.raises(ValueError, match="at least one author"):
        TofuAuthorSplit.in_order(range(15), num_calibration=0)


def test_an_offset_gives_every_role_other_authors_wrapping_round():
    split = TofuAuthorSplit.in_order(range(15), 2, 4, 2, 2, offset=5)
    assert split.forget == (5, 6) and split.retain == (7, 8, 9, 10)
    assert split.calibration == (11, 12) and split.holdout == (13, 14)
    wrapped = TofuAuthorSplit.in_order(range(15), 2, 4, 2, 2, offset=10)
    assert wrapped.forget == (10, 11) and wrapped.holdout == (3, 4)
    assert not set(wrapped.forget) & set(wrapped.retain + wrapped.calibration + wrapped.holdout)


def test_the_sets_hold_each_roles_questions_of_the_real_rows():
    split = TofuAuthorSplit.in_order(range(15), 2, 4, 2, 2)
    sets = tofu_sets(TOFU_DIR, split, questions_per_author=5)
    assert {name: len(rows) for name, rows in sets.items()} == {
        "forget": 10, "retain": 20, "calibration": 10, "holdout": 10, "real_authors": 100, "world_facts": 117,
    }  # fmt: skip
    assert sorted(set(sets["forget"]["author"])) == [0, 1] and sorted(set(sets["holdout"]["author"])) == [8, 9]
    questions = {name: set(sets[name]["question"]) for name in ("forget", "retain", "calibration", "holdout")}
    assert not questions["forget"] & (questions["retain"] | questions["calibration"] | questions["holdout"])
    assert len(tofu_sets(TOFU_DIR, split)["forget"]) == 40  # all 20 questions of each of the two forget authors


@pytest.mark.slow
def test_the_tofu_compare_miniature_writes_the_compare_schema(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_UNLEARN_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "compare"
    argv = [
        "compare", "--benchmark", "tofu", "--tofu_dir", TOFU_DIR, "--base_model", "tiny",
        "--questions_per_author", "3", "--num_forget_authors", "2", "--num_retain_authors", "1",
        "--num_calibration_authors", "1", "--num_holdout_authors", "1", "--learn_max_epochs", "2",
        "--methods", "graddiff", "--learning_rates", "1e-3", "--seeds", "0", "--epochs", "1",
        "--masc_max_steps", "3", "--real_knowledge_size", "4", "--retain_eval_size", "3",
        "--lm_eval_tasks", "tofu_real_authors", "--lm_eval_tofu_dir", TOFU_DIR, "--lm_eval_limit", "2",
        "--save_models", "true", "--output_dir", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "compare.json").read_text())
    # --save_models: each run's final weights with the record an audit reads, one folder per method, rate and seed
    for folder in ("masc-0.0001-seed0", "graddiff-0.001-seed0"):
        saved = json.loads((out / "runs" / folder / "unlearn_record.json").read_text())
        assert os.path.isfile(out / "runs" / folder / "README.md") and saved["method"] == folder.split("-")[0]
    assert result["authors"] == {"forget": [0, 1], "retain": [2], "calibration": [3], "holdout": [4]}
    # the target learned forget + retain authors, the never-trained reference the retain author alone
    assert result["target_model"]["authors"] == [0, 1, 2] and result["reference_model"]["authors"] == [2]
    region, before = result["region"], result["region"]["before"]
    knowledge = before["real_knowledge"]
    parts = [
        knowledge[s][m]
        for s in ("real_authors", "world_facts")
        for m in ("rouge_l_recall", "probability", "truth_ratio")
    ]
    assert knowledge["real_authors"]["num_examples"] == 4
    assert knowledge["utility"] == pytest.approx(0.0 if min(parts) <= 0 else hmean(parts))
    assert knowledge["mean"] == pytest.approx(sum(parts) / len(parts))
    never_knowledge = region["never_trained"]["real_knowledge"]["mean"]
    assert region["real_knowledge_mean_min"] == pytest.approx(0.95 * min(knowledge["mean"], never_knowledge))
    # the never-trained model is judged against its own region, and the verdict is kept
    # (compared as JSON: one holdout author is one draw, so every membership interval is NaN, and NaN != NaN)
    kept, again = region["never_trained_misses"], region_misses(region["never_trained"], region)
    assert json.dumps(kept, sort_keys=True) == json.dumps(again, sort_keys=True)
    assert math.isnan(kept["membership_auc_interval"])
    assert region["membership_auc_reference"] == region["never_trained"]["forget"]["membership_auc"]
    reference = region["calibration_reference"]  # the stop's never-seen authors, read by the never-trained model
    assert set(reference) == {"forget_vs_calibration_auc", "calibration_vs_holdout_auc"}
    assert all(0.0 <= value <= 1.0 for value in reference.values())
    assert {"repetitive_share", "reference_nll", "examples"} <= set(region["never_trained"]["forget"]["fluency"])
    for key in ("landed", "time_to_region_seconds", "grid_seconds", "single_run_seconds"):
        assert key in result["methods"]["masc"] and key in result["methods"]["graddiff"]
    (masc,) = result["runs"]["masc"]
    assert masc["steps"] <= 3 and isinstance(masc["fluent"], bool) and 0 <= masc["probe_seconds"] <= masc["seconds"]
    # where the stop fired, kept with the run: one row per probe, from the start
    assert masc["probe_history"][0]["step"] == 0 and "calibration_gap" in masc["probe_history"][-1]
    assert masc["stop_reason"]
    (baseline,) = result["runs"]["graddiff"]
    assert len(baseline["epochs"]) == 1 and baseline["landed_at_end"] == in_region(baseline["epochs"][-1], region)
    assert "real_knowledge" in baseline["epochs"][-1] and "fluency" in baseline["epochs"][-1]["forget"]
    # lm-eval's accuracy on 2 four-way questions: 0, 1/2 or 1, for the target, the never-trained and each final model
    scored = [before["lm_eval"], region["never_trained"]["lm_eval"], masc["lm_eval"], baseline["lm_eval"]]
    assert all(s["tofu_real_authors"]["acc"] in (0.0, 0.5, 1.0) for s in scored)
    report = (out / "compare.md").read_text()
    assert "real-knowledge mean (harmonic)" in report and "## Every run" in report
    assert (
        "## Three forget answers of each run" in report
        and "misses the region by" in report
        and "| never-trained |" in report
    )
    assert "## lm-evaluation-harness" in report and "tofu_real_authors acc" in report
    assert os.path.isfile(out / "compare.png")
