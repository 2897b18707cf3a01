"""TOFU-style aggregate metrics against scipy and hand values, and the bound against the trainer's."""

import json
import math

import pytest
from scipy.stats import ks_2samp

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
from hf_unlearn.metrics import evaluate_unlearning, forget_quality, model_utility, reproduction_bound


def test_forget_quality_is_the_ks_p_value():
    a, b = [0.1, 0.4, 0.35, 0.8, 0.05], [0.9, 0.7, 0.95, 0.6, 0.85, 0.99]
    assert forget_quality(a, b) == pytest.approx(ks_2samp(a, b).pvalue)
    assert forget_quality(a, a) == pytest.approx(1.0)


def test_model_utility_is_a_harmonic_mean_that_a_zero_sinks():
    assert model_utility([0.5, 1.0]) == pytest.approx(2 / (1 / 0.5 + 1 / 1.0))
    assert model_utility([0.9, 0.0, 0.8]) == 0.0


def test_reproduction_bound_matches_the_trainers(tmp_path):
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    records = load_split("forget01")
    forget = build_qa_dataset(records, tokenizer)
    args = UnlearnConfig(output_dir=str(tmp_path), report_to="none", masc_rho=0.7, retain_loss="none", use_cpu=True)
    trainer = UnlearnTrainer(model, args, forget, processing_class=tokenizer)
    expected = trainer.exact_reproduction_bound()
    measured = reproduction_bound(model, tokenizer, records, k=10, rho=0.7)
    assert measured["mean"] == pytest.approx(expected["mean"], rel=1e-5)
    assert measured["violation_rate"] == pytest.approx(expected["violation_rate"], rel=1e-5)


def test_evaluate_unlearning_reports_every_axis():
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "gpt2", hidden_size=32, num_layers=1, num_heads=2)
    forget, retain = load_split("forget01"), load_split("retain99").select(range(5))
    result = evaluate_unlearning(model, tokenizer, forget, retain, retain_only_truth_ratios=[1.0] * 5)
    assert {"forget", "retain", "model_utility", "forget_quality", "exact_reproduction_bound"} <= result.keys()
    assert len(result["forget_truth_ratios"]) == 5 and 0 <= result["forget_quality"] <= 1
    assert result["forget"]["num_examples"] == 5 and result["retain"]["num_examples"] == 5


def test_normalized_probability_is_a_share_of_the_options():
    from hf_unlearn.metrics import answer_log_probs, normalized_probabilities

    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2)
    record = {"question": "Capital of France?", "answer": "Paris", "perturbed_answer": ["Rome", "Oslo berg"]}
    (value,) = normalized_probabilities(model, tokenizer, [record])
    scored = answer_log_probs(model, tokenizer, [record["question"]] * 3, ["Paris", "Rome", "Oslo berg"])
    p = [math.exp(total / count) for total, count in scored]
    assert value == pytest.approx(p[0] / sum(p), rel=1e-5)


@pytest.mark.slow
def test_eval_command_on_the_embedded_benchmark(tmp_path):
    """TOFU and MUSE views of the embedded benchmark: the target model has memorised the forget set, which
    the retain-only model (the reference) has not."""
    from hf_unlearn.benchmarks import learn_target_model
    from hf_unlearn.cli import main

    _, _, info = learn_target_model(show_progress=False)
    main(["eval", "--model", info["path"], "--split", "forget10", "--output_dir", str(tmp_path)])
    result = json.loads((tmp_path / "eval.json").read_text())
    assert result["forget"]["rouge_l_recall"] > 0.9 and len(result["forget_truth_ratios"]) == 20
    # The target is told apart from the retain-only model (KS p < 0.1: 0.012 on an Intel Xeon, 0.081 on an AMD
    # EPYC, where the learned target differs with the CPU's float kernels).
    assert 0 <= result["forget_quality"] < 0.1 and result["exact_reproduction_bound"] > 0.5
    assert result["retain"]["truth_ratio"] > 0.2 and result["model_utility"] > 0.5  # paraphrases informative
    muse = result["muse"]
    assert muse["knowmem_forget"] > 0.9 and muse["verbmem_forget"] > 0.8 and muse["knowmem_retain"] > 0.9
    # MUSE's orientation: the target still recognises its forget answers (AUC near 0, PrivLeak strongly negative).
    assert muse["auc"]["min_k"] < 0.35 and muse["privleak"]["min_k"] < -20
    assert "Forget quality" in (tmp_path / "eval.md").read_text() and "PrivLeak" in (tmp_path / "eval.md").read_text()
    assert (tmp_path / "radar.png").stat().st_size > 10_000 and (tmp_path / "truth_ratios.png").is_file()


def test_trainer_evaluate_runs_the_same_evaluation_during_training(tmp_path):
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2)
    forget = build_qa_dataset(load_split("forget01"), tokenizer)
    retain = build_qa_dataset(load_split("retain99").select(range(8)), tokenizer)
    args = UnlearnConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=4, eval_strategy="steps", eval_steps=2,
        probe_interval=0, stop_on_violation=False, save_strategy="no",
    )  # fmt: skip
    trainer = UnlearnTrainer(model, args, forget, retain, processing_class=tokenizer)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "eval_forget_rouge_l_recall" in entry]
    assert [entry["step"] for entry in logged] == [2, 4]
    metrics = trainer.evaluate()
    expected = evaluate_unlearning(trainer.model, tokenizer, forget, retain)
    assert metrics["eval_forget_probability"] == pytest.approx(expected["forget"]["probability"])
    assert metrics["eval_model_utility"] == pytest.approx(expected["model_utility"])
    assert "eval_exact_reproduction_bound" in metrics and "eval_retain_truth_ratio" in metrics


def test_trainer_evaluate_names_missing_question_columns(tmp_path):
    from conftest import make_example, make_tiny_model

    args = UnlearnConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, retain_loss="none")
    trainer = UnlearnTrainer(make_tiny_model(), args, [make_example(i) for i in range(4)])
    with pytest.raises(ValueError, match="question and answer columns.*build_qa_dataset"):
        trainer.evaluate()
