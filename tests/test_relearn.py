"""The relearning attack: knowledge that gradient ascent only suppressed comes back after a few steps on half of the
forget set, beyond what the same steps teach a model that never saw it; the reference itself is not flagged; the
attacked model is a copy; the CLI names what it needs."""

import json

import pytest
import torch
from conftest import save_model_folder

from hf_unlearn.cli.main import main
from hf_unlearn.evaluation.metrics import evaluate_qa
from hf_unlearn.robustness.relearn import check_relearning_robustness, relearning_table, split_for_relearning


@pytest.fixture(scope="module")
def models(suppressed_setting):
    s = suppressed_setting
    return s["tokenizer"], s["forget"], s["target"], s["suppressed"], s["reference"]


def test_split_is_seeded_disjoint_and_refuses_what_cannot_split():
    records = [{"question": f"q{i}", "answer": f"a{i}"} for i in range(10)]
    relearn, measured = split_for_relearning(records, 0.5, seed=3)
    assert len(relearn) == len(measured) == 5 and not {r["question"] for r in relearn} & {
        r["question"] for r in measured
    }
    assert split_for_relearning(records, 0.5, seed=3) == (relearn, measured)
    with pytest.raises(ValueError, match="at least 2 forget examples"):
        split_for_relearning(records[:1])
    with pytest.raises(ValueError, match="relearn_fraction"):
        split_for_relearning(records, 1.0)


def test_suppressed_knowledge_comes_back_and_the_reference_is_not_flagged(models):
    tokenizer, forget, target, suppressed, reference = models
    assert evaluate_qa(target, tokenizer, forget)["rouge_l_recall"] > 0.9
    assert evaluate_qa(suppressed, tokenizer, forget)["rouge_l_recall"] < 0.5
    state = {k: v.clone() for k, v in suppressed.state_dict().items()}
    # 20 steps: after 10 the excess over the reference was +0.152 with AVX2 kernels, +0.055 with AVX-512 ones
    result = check_relearning_robustness(
        suppressed, tokenizer, forget, reference_model=reference, target_model=target, steps=20, learning_rate=1e-3,
        measure_every=10,
    )  # fmt: skip
    assert all(torch.equal(v, state[k]) for k, v in suppressed.state_dict().items())  # the attack used a copy
    assert [row["step"] for row in result["curve"]] == [0, 10, 20]
    assert result["relearn_examples"] == result["measured_examples"] == 5
    end, start = result["curve"][-1]["rouge_l_recall"], result["curve"][0]["rouge_l_recall"]
    assert end - result["reference_curve"][-1]["rouge_l_recall"] > 0.1 and end > start
    assert result["knowledge_returned"] is True and 0 < result["recovered_fraction"] <= 1.5
    assert "Forgotten knowledge came back" in relearning_table(result)
    # The never-trained model relearned the same way is the baseline: compared with itself nothing comes back.
    same = check_relearning_robustness(
        reference, tokenizer, forget, reference_model=reference, steps=10, learning_rate=1e-3
    )
    assert same["excess_rouge_l_recall"] == pytest.approx(0.0, abs=1e-9) and same["knowledge_returned"] is False
    assert same["excess_probability"] == pytest.approx(0.0, abs=1e-9) and same["likelihood_returned"] is False
    # The answers' probability is judged beside ROUGE-L, against the reference's after the same relearning.
    ends = result["curve"][-1]["probability"], result["reference_curve"][-1]["probability"]
    assert result["excess_probability"] == pytest.approx(ends[0] - ends[1], abs=1e-12)
    assert result["likelihood_returned"] is (result["excess_probability"] > 0.1)
    start_p = result["curve"][0]["probability"]
    assert result["probability_recovered_fraction"] == pytest.approx(
        (ends[0] - start_p) / (result["target"]["probability"] - start_p), abs=1e-12
    )


def test_likelihood_can_come_back_while_the_greedy_answers_stay_wrong():
    """The case measured on SmolLM2 + TOFU (docs/studies/relearning_sam.md): ROUGE-L 0.03 above the reference after
    relearning, probability 0.5 above it. The ROUGE-L verdict stays clean, the likelihood one does not, and the
    sweep's record and tables say so."""
    from hf_unlearn.robustness.relearn import compare_relearned, likelihood_sentence

    start = {"rouge_l_recall": 0.20, "probability": 0.07}
    end = {"rouge_l_recall": 0.33, "probability": 0.62}
    reference = {"rouge_l_recall": 0.30, "probability": 0.12}
    target = {"rouge_l_recall": 0.70, "probability": 0.97}
    cell = compare_relearned(start, end, reference, target)
    assert cell["knowledge_returned"] is False and cell["excess_rouge_l_recall"] == pytest.approx(0.03)
    assert cell["likelihood_returned"] is True and cell["excess_probability"] == pytest.approx(0.50)
    assert cell["recovered_fraction"] == pytest.approx(0.13 / 0.50)
    assert cell["probability_recovered_fraction"] == pytest.approx(0.55 / 0.90)
    # Without a reference the comparison is the model's own start; without a target there is no share.
    alone = compare_relearned(start, end, None, None)
    assert alone["excess_probability"] == pytest.approx(0.55) and alone["probability_recovered_fraction"] is None
    sentence = likelihood_sentence({**cell, "compared_with": "the reference"})
    assert sentence.startswith("The answers' likelihood came back") and "+0.500" in sentence
    assert likelihood_sentence({"compared_with": "x"}) == ""  # a record written before the likelihood was judged


def test_the_audit_fails_relearning_on_the_likelihood_alone():
    """The audit's relearning verdict: clean only when neither the answers nor their likelihood came back."""
    from hf_unlearn.robustness.audit import relearning_verdict

    result = {"excess_rouge_l_recall": 0.03, "knowledge_returned": False, "compared_with": "the reference"}
    quiet = relearning_verdict({**result, "excess_probability": 0.02, "likelihood_returned": False}, "after 20 steps")
    assert quiet["passed"] is True
    likely = relearning_verdict({**result, "excess_probability": 0.50, "likelihood_returned": True}, "after 20 steps")
    assert likely["passed"] is False and "+0.500 answer probability" in likely["finding"]
    assert "probability" in likely["threshold"] and "ROUGE-L" in likely["threshold"]


def test_tables_of_a_result_written_before_the_likelihood_was_judged():
    """An older unlearn_record.json's relearning (no probability fields in the grid, no likelihood flags) still
    renders: the model card rebuilds it whenever quant-check, eval or push saves the record again."""
    from hf_unlearn.robustness.relearn import relearning_table, sweep_table

    cell = {"learning_rate": 1e-4, "steps": 10, "rouge_l_recall": 0.4, "excess_rouge_l_recall": 0.05,
            "recovered_fraction": 0.2, "knowledge_returned": False}  # fmt: skip
    sweep = {"grid": [cell], "worst": cell, "largest_recovered_fraction": 0.2, "knowledge_returned": False,
             "compared_with": "the reference"}  # fmt: skip
    table = sweep_table(sweep)
    assert "| 0.0001 | 10 | 0.400 | +0.050 | 0.20 | - | - | - |" in table and "likelihood" not in table
    curve = [{"step": 0, "rouge_l_recall": 0.3, "probability": 0.1}]
    old = {"curve": curve, "knowledge_returned": False, "excess_rouge_l_recall": 0.0, "compared_with": "x"}
    assert relearning_table(old).endswith("threshold +0.1).")


def test_cli_relearn_check_on_own_data(models, tmp_path, capsys):
    tokenizer, forget, _, suppressed, reference = models
    for name, model in (("suppressed", suppressed), ("reference", reference)):
        save_model_folder(tmp_path / name, model, tokenizer)
    path = tmp_path / "forget.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in forget))
    argv = ["relearn-check", "--model_name_or_path", str(tmp_path / "suppressed"), "--output_dir", str(tmp_path)]
    status = main(argv)
    assert status == 1
    assert "--forget_data" in capsys.readouterr().err
    status = main(
        ["relearn-check", "--model_name_or_path", str(tmp_path / "suppressed"), "--forget_data", str(path),
         "--reference_model", str(tmp_path / "reference"), "--steps", "20", "--learning_rate", "1e-3",
         "--output_dir", str(tmp_path)]
    )  # fmt: skip
    assert status == 0
    result = json.loads((tmp_path / "relearn_check.json").read_text())
    assert result["knowledge_returned"] is True and result["compared_with"].startswith("the reference")


def test_sweep_reports_the_worst_case_of_the_grid(models):
    """A 2 x 2 grid (lr x steps): each cell equals the attack run on its own at that setting (the shorter attacks are
    read off the longer one's curve), and the worst case is the cell highest above the reference."""
    from hf_unlearn.robustness.relearn import relearning_sweep, sweep_record, sweep_table

    tokenizer, forget, target, suppressed, reference = models
    given = dict(reference_model=reference, target_model=target)
    # 20 steps at the top: after 10 at lr 1e-3 the excess is +0.152 with AVX2 kernels and +0.055 with AVX-512 ones
    sweep = relearning_sweep(suppressed, tokenizer, forget, learning_rates=(1e-4, 1e-3), steps=(10, 20), **given)
    assert [(row["learning_rate"], row["steps"]) for row in sweep["grid"]] == [
        (1e-4, 10), (1e-4, 20), (1e-3, 10), (1e-3, 20)
    ]  # fmt: skip
    for row in sweep["grid"]:
        alone = check_relearning_robustness(
            suppressed, tokenizer, forget, steps=row["steps"], learning_rate=row["learning_rate"], **given
        )
        assert row["excess_rouge_l_recall"] == pytest.approx(alone["excess_rouge_l_recall"], abs=1e-12)
        assert row["recovered_fraction"] == pytest.approx(alone["recovered_fraction"], abs=1e-12)
        assert row["excess_probability"] == pytest.approx(alone["excess_probability"], abs=1e-12)
        assert row["likelihood_returned"] is alone["likelihood_returned"]
    excess = [row["excess_rouge_l_recall"] for row in sweep["grid"]]
    assert len(set(excess)) > 1  # the grid's cells differ, so picking the worst is a choice
    assert sweep["worst"]["excess_rouge_l_recall"] == max(excess)
    assert sweep["largest_recovered_fraction"] == max(row["recovered_fraction"] for row in sweep["grid"])
    record = sweep_record(sweep)
    assert record["excess_rouge_l_recall"] == max(excess) and record["knowledge_returned"] is True
    assert "Worst case: lr" in sweep_table(sweep) and "attacks" not in record["sweep"]
    excess_p = [row["excess_probability"] for row in sweep["grid"]]
    assert record["excess_probability"] == sweep["largest_excess_probability"] == max(excess_p)
    assert record["likelihood_returned"] is sweep["likelihood_returned"] is any(e > 0.1 for e in excess_p)
    assert f"{max(excess_p):+.3f} above" in sweep_table(sweep)


def test_cli_relearn_check_sweep_on_related_text(models, tmp_path):
    """--sweep with --relearn_data: related QA that is not the forget set (here other authors' questions); the whole
    forget set is measured, and the sweep's worst case goes into relearn_check.json."""
    tokenizer, forget, _, suppressed, reference = models
    from hf_unlearn.benchmarks import load_split

    for name, model in (("suppressed", suppressed), ("reference", reference)):
        save_model_folder(tmp_path / name, model, tokenizer)
    (tmp_path / "forget.jsonl").write_text("\n".join(json.dumps(r) for r in forget))
    related = list(load_split("retain95").select(range(20, 30)).select_columns(["question", "answer"]))
    (tmp_path / "related.jsonl").write_text("\n".join(json.dumps(r) for r in related))
    status = main(
        ["relearn-check", "--model_name_or_path", str(tmp_path / "suppressed"), "--forget_data",
         str(tmp_path / "forget.jsonl"), "--relearn_data", str(tmp_path / "related.jsonl"), "--reference_model",
         str(tmp_path / "reference"), "--sweep", "--sweep_learning_rates", "1e-4", "1e-3", "--sweep_steps", "5",
         "--output_dir", str(tmp_path)]
    )  # fmt: skip
    assert status == 0
    result = json.loads((tmp_path / "relearn_check.json").read_text())
    assert len(result["grid"]) == 2 and result["relearn_data"] == "given"
    assert result["measured_examples"] == len(forget)
    assert result["worst"]["excess_rouge_l_recall"] == max(row["excess_rouge_l_recall"] for row in result["grid"])
