"""`hf-unlearn compare` on a small grid: the region, the per-method summary, and what compare.json holds."""

import json
import math

import pytest

from hf_unlearn.benchmarks import load_split
from hf_unlearn.cli.arguments import CompareArguments
from hf_unlearn.cli.main import main
from hf_unlearn.evaluation.bundle import qa_membership_auc
from hf_unlearn.jobs.compare import in_region, summarize_runs
from hf_unlearn.jobs.compare_setups import embedded_setting

REGION = {
    "forget_rouge_l_recall_max": 0.6,
    "membership_auc_reference": 0.55,
    "membership_tolerance": 0.1,
    "retain_rouge_l_recall_min": 0.9,
}


def row(rouge, auc, retain):
    return {"forget": {"rouge_l_recall": rouge, "membership_auc": auc}, "retain": {"rouge_l_recall": retain}}


def test_region_is_defined_against_the_never_trained_model():
    assert in_region(row(0.6, 0.46, 0.9), REGION) and in_region(row(0.1, 0.64, 0.95), REGION)
    assert not in_region(row(0.61, 0.55, 0.99), REGION)  # reproduces more than a model that never saw it
    assert not in_region(row(0.2, 0.92, 0.99), REGION)  # still recognisable as training data
    assert not in_region(row(0.2, 0.30, 0.99), REGION)  # less likely than never-seen: recognisable the other way
    assert not in_region(row(0.2, 0.55, 0.89), REGION)  # retain not kept


def test_the_region_keeps_what_both_models_keep_and_says_what_a_run_misses():
    from hf_unlearn.cli.arguments import CompareArguments
    from hf_unlearn.jobs.compare import build_region, region_misses

    def measured(rouge, auc, retain, knowledge, repetitive):
        fluency = {"repetitive_share": repetitive, "empty_share": 0.0, "reference_nll": 2.0}
        return {
            "forget": {"rouge_l_recall": rouge, "membership_auc": auc, "fluency": fluency},
            "retain": {"rouge_l_recall": retain},
            "real_knowledge": {"mean": knowledge, "utility": 0.01},
        }

    target, never = measured(0.9, 0.05, 0.99, 0.40, 0.0), measured(0.3, 0.50, 0.90, 0.30, 0.0)
    region = build_region(target, never, CompareArguments())
    # the kept side against the lower of the two: the never-trained model lies in its own region
    assert region["retain_rouge_l_recall_min"] == pytest.approx(0.95 * 0.90)
    assert region["real_knowledge_mean_min"] == pytest.approx(0.95 * 0.30)
    assert region_misses(never, region) == {} and in_region(never, region)
    assert not region_misses(target, region).keys() - {"forget_rouge_l_recall", "membership_auc"}
    damaged = measured(0.2, 0.75, 0.80, 0.20, 0.5)
    misses = region_misses(damaged, region)
    assert misses["membership_auc"] == pytest.approx(0.15)  # + : less likely than never-seen data
    assert misses["retain_rouge_l_recall"] == pytest.approx(0.80 - 0.855)
    assert misses["real_knowledge_mean"] == pytest.approx(0.20 - 0.285) and misses["fluent"] is False
    assert "forget_rouge_l_recall" not in misses and not in_region(damaged, region)
    assert region_misses(measured(0.2, 0.25, 0.95, 0.35, 0.0), region)["membership_auc"] == pytest.approx(-0.15)


def test_every_attack_and_every_real_knowledge_value_is_judged_on_its_own():
    """Issue 54: a run that Min-K% reads as never-seen but Min-K%++ still reads as a member misses the region, as does
    one whose real-author ROUGE-L fell to zero while the mean of the six real-knowledge values held."""
    from hf_unlearn.cli.arguments import CompareArguments
    from hf_unlearn.jobs.compare import build_region, region_misses

    def knowledge(rouge):
        sets = {
            name: {"rouge_l_recall": rouge, "probability": 0.5, "truth_ratio": 0.6}
            for name in ("real_authors", "world_facts")
        }
        values = [v for row in sets.values() for v in row.values()]
        return {**sets, "mean": sum(values) / len(values), "utility": 0.0}

    def measured(aucs, rouge=0.3, real_rouge=0.3):
        forget = {"rouge_l_recall": rouge, "membership_auc": aucs["min_k"], "membership_aucs": aucs}
        return {"forget": forget, "retain": {"rouge_l_recall": 0.95}, "real_knowledge": knowledge(real_rouge)}

    never_aucs = {
        "loss": 0.37,
        "zlib": 0.33,
        "min_k": 0.43,
        "min_k_plus_plus": 0.47,
        "reference": 1.0,
        "gradnorm": 0.41,
    }
    never = measured(never_aucs)
    region = build_region(measured({a: 0.0 for a in never_aucs}, rouge=1.0, real_rouge=0.4), never, CompareArguments())
    assert region["membership_auc_references"] == never_aucs and region_misses(never, region) == {}
    # the demo's stopped MASC model, as issue 54 measured it: Min-K% in, Min-K%++ still a member
    demo = measured({**never_aucs, "min_k": 0.4275, "min_k_plus_plus": 0.1625})
    assert region_misses(demo, region) == {"membership_auc_min_k_plus_plus": pytest.approx(0.1625 - 0.47 + 0.1)}
    unmeasured = measured({**never_aucs, "gradnorm": float("nan")})
    assert math.isnan(region_misses(unmeasured, region)["membership_auc_gradnorm"])
    # a zeroed real-author ROUGE-L beside a higher world-facts one: the mean of the six (0.467 against a floor of
    # 0.95 x 0.467) lets it pass, its own floor does not
    zeroed = measured(never_aucs)
    zeroed["real_knowledge"]["real_authors"]["rouge_l_recall"] = 0.0
    zeroed["real_knowledge"]["world_facts"]["rouge_l_recall"] = 0.6
    values = [v for name in ("real_authors", "world_facts") for v in zeroed["real_knowledge"][name].values()]
    zeroed["real_knowledge"]["mean"] = sum(values) / len(values)
    assert zeroed["real_knowledge"]["mean"] >= region["real_knowledge_mean_min"]
    misses = region_misses(zeroed, region)
    assert misses["real_knowledge_real_authors.rouge_l_recall"] == pytest.approx(-0.95 * 0.3)
    assert "real_knowledge_mean" not in misses and not in_region(zeroed, region)
    zeroed["real_knowledge"]["world_facts"]["truth_ratio"] = float("nan")
    assert region_misses(zeroed, region)["real_knowledge_world_facts.truth_ratio"] == float("-inf")


def test_summary_picks_the_lr_where_most_seeds_land_then_the_faster():
    def run(lr, seed, landed, time, seconds):
        return {"learning_rate": lr, "seed": seed, "landed": landed, "time": time, "seconds": seconds,
                "forget": {}, "retain": {}, "steps": 1}  # fmt: skip

    runs = [
        run(1e-4, 0, True, 9.0, 10.0), run(1e-4, 1, True, 7.0, 10.0),  # both seeds land, mean 8 s
        run(1e-3, 0, True, 2.0, 5.0), run(1e-3, 1, False, None, 5.0),  # one seed lands, faster
    ]  # fmt: skip
    summary = summarize_runs(runs, "landed", "time")
    assert summary["best_learning_rate"] == 1e-4 and summary["seeds_landed_at_best"] == 2
    assert summary["time_to_region_seconds"] == pytest.approx(8.0)
    assert summary["landed"] == 3 and summary["runs"] == 4
    assert summary["grid_seconds"] == pytest.approx(15.0)  # one seed's whole grid: 10 + 5
    assert summary["single_run_seconds"] == pytest.approx(10.0)


@pytest.mark.slow
def test_compare_writes_the_table_json_and_plot(tmp_path):
    out = tmp_path / "cmp"
    status = main(
        [
            "compare",
            "--methods",
            "graddiff",
            "simnpo",
            "--learning_rates",
            "1e-3",
            "--masc_learning_rates",
            "3e-4",
            "--seeds",
            "0",
            "--epochs",
            "2",
            "--retain_eval_size",
            "20",
            "--output_dir",
            str(out),
        ]
    )
    assert status == 0
    result = json.loads((out / "compare.json").read_text())
    region = result["region"]
    assert region["never_trained"]["forget"]["forget_quality"] > 0.5
    # MUSE's orientation: the target recognises its forget answers (AUC near 0), the never-trained model near 0.5.
    assert region["before"]["forget"]["membership_auc"] < 0.1 < region["membership_auc_reference"] - 0.1
    assert set(result["methods"]) == {"masc", "graddiff", "simnpo"}
    for method in result["methods"].values():
        assert {"landed", "runs", "best_learning_rate", "time_to_region_seconds", "grid_seconds"} <= set(method)
        if method["time_to_region_seconds"] is not None:
            assert method["time_to_region_seconds"] <= method["grid_seconds"] + 1e-9
    assert len(result["runs"]["graddiff"][0]["epochs"]) == 2
    masc_run = result["runs"]["masc"][0]
    assert masc_run["stop_kind"] == "target" and masc_run["learning_rate"] == 3e-4
    assert masc_run["landed"] == in_region(masc_run, region)
    assert "| masc |" in (out / "compare.md").read_text()
    assert (out / "compare.png").stat().st_size > 10_000
    # The stop's never-seen reference read by the never-trained model: forget vs the calibration authors (not the
    # holdout authors the region's attack uses), recorded with the region and written in compare.md.
    setting = embedded_setting(CompareArguments(retain_eval_size=20))
    never, tokenizer = setting.reference_model, setting.reference_tokenizer
    calibration = list(load_split("calibration"))
    check = region["calibration_reference"]
    assert check["forget_vs_calibration_auc"] == pytest.approx(
        qa_membership_auc(never, tokenizer, list(load_split("forget10")), calibration)
    )
    assert check["calibration_vs_holdout_auc"] == pytest.approx(
        qa_membership_auc(never, tokenizer, calibration, list(load_split("holdout")))
    )
    assert f"calibration authors' {check['forget_vs_calibration_auc']:.3f}" in (out / "compare.md").read_text()


@pytest.mark.slow
def test_compare_with_lora_trains_adapters_on_every_run(tmp_path):
    out = tmp_path / "cmp"
    argv = ["compare", "--methods", "ga", "--learning_rates", "1e-3", "--masc_learning_rates", "1e-3", "--seeds", "0",
            "--epochs", "1", "--retain_eval_size", "10", "--lora_r", "4", "--output_dir", str(out)]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((out / "compare.json").read_text())
    assert result["lora_r"] == 4 and set(result["methods"]) == {"masc", "ga"}
    # With LoRA on the tiny model, MASC still moves the forget set (the adapter is what trains).
    masc = result["runs"]["masc"][0]
    assert masc["forget"]["probability"] < 0.5 * result["region"]["before"]["forget"]["probability"]


def test_compare_adapts_the_modules_run_adapts_unless_told_otherwise():
    from hf_unlearn.cli.arguments import CompareArguments
    from hf_unlearn.jobs.compare_setups import lora_targets
    from hf_unlearn.training.adapters import DEFAULT_LORA_TARGETS

    assert lora_targets(CompareArguments()) == list(DEFAULT_LORA_TARGETS)
    assert lora_targets(CompareArguments(lora_target_modules=["all-linear"])) == "all-linear"
    assert lora_targets(CompareArguments(lora_target_modules=["q_proj", "v_proj"])) == ["q_proj", "v_proj"]


def test_compare_races_every_baseline_by_default():
    from hf_unlearn.cli.arguments import CompareArguments
    from hf_unlearn.objectives import FORGET_OBJECTIVES, METHODS

    stopping = {method for method, (forget, _) in METHODS.items() if FORGET_OBJECTIVES[forget].stops_itself}
    assert "masc" in stopping and CompareArguments().methods == [m for m in METHODS if m not in stopping]


def test_table_of_baselines_alone_leaves_the_masc_columns_empty():
    """`--masc false` (a comparison split over two processes): no MASC row, no ratio to MASC's time or cost."""
    from hf_unlearn.jobs.compare_report import compare_table

    shown = {"forget": {"rouge_l_recall": 0.2, "membership_auc": 0.5}, "retain": {"rouge_l_recall": 0.95}}
    summary = {
        "runs": 1, "landed": 1, "landed_at_end": 0, "best_learning_rate": 1e-4, "seeds_landed_at_best": 1,
        "time_to_region_seconds": 30.0, "single_run_seconds": 60.0, "grid_seconds": 60.0, "shown": shown,
    }  # fmt: skip
    table = compare_table({"region": REGION, "methods": {"npo_klr": summary}})
    lines = table.splitlines()
    assert len(lines) == 3 and "| masc |" not in table
    assert lines[2].startswith("| npo_klr | 0/1 at budget end, 1/1 at some epoch | 0.0001 (1) | 30.0 | 60.0 | 60.0 |")
    assert lines[2].endswith("| - | - |")
    with_masc = {"masc": {**summary, "landed": 1, "time_to_region_seconds": 15.0, "single_run_seconds": 15.0}}
    ratio_row = compare_table({"region": REGION, "methods": {**with_masc, "npo_klr": summary}}).splitlines()[3]
    assert ratio_row.endswith("| 2.0x | 1/4.0 |")


def test_masc_overrides_are_typed_by_the_config_fields_and_checked_before_any_work(tmp_path, capsys):
    from hf_unlearn.jobs.compare import parse_overrides

    items = ["retain_weight=3", "stop_probe=holdout", "restore_on_failure=false", "utility_floor=none"]
    parsed = parse_overrides(items)
    expected = {"retain_weight": 3.0, "stop_probe": "holdout", "restore_on_failure": False, "utility_floor": None}
    assert parsed == expected
    assert isinstance(parsed["retain_weight"], float)
    assert parse_overrides(["probe_interval=2"]) == {"probe_interval": 2} and parse_overrides(None) == {}
    with pytest.raises(ValueError, match="'retain_weigth=3' is not one"):
        parse_overrides(["retain_weigth=3"])
    with pytest.raises(ValueError, match="probe_interval takes a number, got 'two'"):
        parse_overrides(["probe_interval=two"])
    # A value UnlearnConfig refuses stops the command before the target is learned or measured (seconds, not the
    # minutes of learning the embedded target: nothing is written).
    status = main(["compare", "--masc_overrides", "stop_probe=later", "--output_dir", str(tmp_path / "c")])
    assert status == 1 and "stop_probe must be one of" in capsys.readouterr().err
    assert not (tmp_path / "c" / "compare_partial.json").exists()


def test_the_region_passes_nothing_that_was_not_measured_and_judges_each_fluency_measure():
    """Issue 67: hand-made rows. A NaN forget or retain ROUGE-L, a row with no real-knowledge or no fluency
    measurement, a NaN never-trained AUC, and a value of 0 under a floor of 0.95 x 0 each miss the region; the
    damaged and run-on shares are read against the levels the region holds (without them neither is judged)."""
    from hf_unlearn.jobs.compare import build_region, region_misses

    def measured(rouge=0.3, retain=0.95, auc=0.45, real_rouge=0.3, words=(8,) * 10, worst=(2.0,) * 10):
        fluency = {
            "repetitive_share": 0.0, "empty_share": 0.0, "reference_nll": 2.0,
            "answer_words": list(words), "worst_token_nll": list(worst),
        }  # fmt: skip
        sets = {n: {"rouge_l_recall": real_rouge, "probability": 0.5, "truth_ratio": 0.6} for n in ("a", "b")}
        return {
            "forget": {"rouge_l_recall": rouge, "membership_auc": auc, "fluency": fluency},
            "retain": {"rouge_l_recall": retain},
            "real_knowledge": {**sets, "mean": 0.45, "utility": 0.1},
        }

    never = measured()
    region = build_region(measured(rouge=0.9, auc=0.05), never, CompareArguments())
    assert region_misses(never, region) == {}
    assert region_misses(measured(rouge=float("nan")), region)["forget_rouge_l_recall"] == float("inf")
    assert region_misses(measured(retain=float("nan")), region)["retain_rouge_l_recall"] == float("-inf")
    no_knowledge = measured()
    del no_knowledge["real_knowledge"]
    assert region_misses(no_knowledge, region) == {"real_knowledge_mean": float("-inf")}
    no_fluency = measured()
    del no_fluency["forget"]["fluency"]
    assert region_misses(no_fluency, region) == {"fluent": False}
    unknown_level = build_region(measured(rouge=0.9), measured(auc=float("nan")), CompareArguments())
    assert math.isnan(region_misses(measured(auc=0.0), unknown_level)["membership_auc"])
    lost = build_region(measured(rouge=0.9, real_rouge=0.0), measured(real_rouge=0.0), CompareArguments())
    assert lost["real_knowledge_min"]["a.rouge_l_recall"] == 0.0
    assert region_misses(measured(real_rouge=0.0), lost)["real_knowledge_a.rouge_l_recall"] == float("-inf")
    # answers running on (40 words where both models write 8) and damaged (a worst token at 12 nats, not 2)
    run_on = region_misses(measured(words=(40,) * 10), region)
    assert run_on["fluent"] is False and run_on["fluency_long_share"] == pytest.approx(1.0 - 0.1)
    damaged = region_misses(measured(worst=(12.0,) * 10), region)
    assert damaged["fluent"] is False and damaged["fluency_damaged_share"] == pytest.approx(1.0 - 0.1)


def test_the_region_says_too_few_answers_where_the_paired_interval_cannot_judge():
    """With both models' per-answer scores the region reads each attack's paired interval: 20 answers a side cannot
    judge ±0.1 (the interval reaches ±0.15 here), so even a run equal to the never-trained model is not counted
    as landed; 250 a side can, and the same run then lands."""
    import numpy as np

    from hf_unlearn.jobs.compare import build_region, region_misses

    def measured(forget, holdout):
        scores = {"forget": {"min_k": list(forget)}, "holdout": {"min_k": list(holdout)}}
        auc = qa_auc(forget, holdout)
        return {
            "forget": {"rouge_l_recall": 0.3, "membership_auc": auc, "membership_scores": scores},
            "retain": {"rouge_l_recall": 0.95},
        }

    def qa_auc(forget, holdout):
        from hf_unlearn.scores import membership_auc

        return membership_auc(list(forget), list(holdout))

    rng = np.random.default_rng(0)
    for size, judged in ((20, False), (250, True)):
        forget, holdout = rng.normal(0, 1, size), rng.normal(0, 1, size)
        never = measured(forget, holdout)
        # each answer's score moved by as much again as the answers differ (a run and a never-trained model)
        run = measured(forget + rng.normal(0, 1.0, size), holdout + rng.normal(0, 1.0, size))
        region = build_region(measured(forget - 3, holdout), never, CompareArguments())
        misses = region_misses(run, region)
        assert ("membership_auc_interval" not in misses) is judged, (size, misses)
        if not judged:
            assert misses["membership_auc_interval"] > 0.1
        else:
            assert misses == {}
