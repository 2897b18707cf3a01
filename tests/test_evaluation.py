"""TOFU-style aggregate metrics against scipy and hand values, and the bound against the trainer's."""

import json
import math
import statistics

import pytest
from conftest import hand_answer_log_probs, hand_greedy, hand_margins, hand_rouge_l, train_on_answers
from scipy.stats import ks_2samp

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
from hf_unlearn.data.examples import tokenize_prompt, tokenize_qa
from hf_unlearn.evaluation.metrics import forget_quality, model_utility, reproduction_bound
from hf_unlearn.evaluation.suites import evaluate_unlearning


def mean(values):
    values = list(values)
    return sum(values) / len(values)


def hand_mean_log_prob(model, tokenizer, question, answer):
    return mean(hand_answer_log_probs(model, tokenize_qa(tokenizer, question, answer)))


def hand_truth_ratio(model, tokenizer, record):
    """TOFU §2.5: P~(perturbed) / P~(paraphrased) with P~(a) = exp(mean answer-token log-probability), the perturbed
    answers averaged in log space."""
    perturbed = mean(hand_mean_log_prob(model, tokenizer, record["question"], a) for a in record["perturbed_answer"])
    return math.exp(perturbed - hand_mean_log_prob(model, tokenizer, record["question"], record["paraphrased_answer"]))


def hand_qa(model, tokenizer, records):
    """TOFU's per-set numbers by hand: mean answer probability, mean ROUGE-L recall of the greedy answer (as many new
    tokens as the longest answer has, EOS included, plus 4), and the truth ratios."""
    examples = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in records]
    budget = max(sum(label != -100 for label in e["labels"]) for e in examples) + 4
    answers = [hand_greedy(model, tokenizer, tokenize_prompt(tokenizer, r["question"]), budget) for r in records]
    return {
        "probability": mean(math.exp(mean(hand_answer_log_probs(model, e))) for e in examples),
        "rouge_l_recall": mean(hand_rouge_l(a, r["answer"], "recall") for a, r in zip(answers, records)),
        "truth_ratios": [hand_truth_ratio(model, tokenizer, r) for r in records],
    }


def hand_bound(model, tokenizer, records, k, rho):
    """MASC Proposition 1 (arXiv 2606.02920) per answer: rho^((1 - v) L), v the fraction of its L answer tokens whose
    restricted margin exceeds tau = log(rho / (1 - rho)). Returns (mean bound, mean v)."""
    tau = math.log(rho / (1 - rho))
    bounds, fractions = [], []
    for r in records:
        margins = hand_margins(model, tokenize_qa(tokenizer, r["question"], r["answer"]), k)
        v = sum(m > tau for m in margins) / len(margins)
        bounds.append(rho ** ((1 - v) * len(margins)))
        fractions.append(v)
    return mean(bounds), mean(fractions)


STEPS_TO_PARTLY_LEARN = 20


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
    # Partly learned, so some answer tokens violate (margin above tau) and others do not.
    train_on_answers(model, tokenizer, list(records), steps=STEPS_TO_PARTLY_LEARN, lr=1e-2)
    forget = build_qa_dataset(records, tokenizer)
    args = UnlearnConfig(output_dir=str(tmp_path), report_to="none", masc_rho=0.7, retain_loss="none", use_cpu=True)
    trainer = UnlearnTrainer(model, args, forget, processing_class=tokenizer)
    expected = trainer.exact_reproduction_bound()
    measured = reproduction_bound(model, tokenizer, records, k=10, rho=0.7)
    assert measured["mean"] == pytest.approx(expected["mean"], rel=1e-5)
    assert measured["violation_rate"] == pytest.approx(expected["violation_rate"], rel=1e-5)
    # Both are Proposition 1 computed by hand from the model's logits.
    bound, violation_rate = hand_bound(model, tokenizer, records, k=10, rho=0.7)
    assert 0 < violation_rate < 1  # some tokens on each side of tau: the bound is neither rho^L nor 1
    assert measured["violation_rate"] == pytest.approx(violation_rate, abs=1e-6)
    assert measured["mean"] == pytest.approx(bound, rel=1e-5) and expected["mean"] == pytest.approx(bound, rel=1e-5)


def test_evaluate_unlearning_reports_every_axis():
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "gpt2", hidden_size=32, num_layers=1, num_heads=2)
    forget, retain = load_split("forget01"), load_split("retain99").select(range(5))
    # Partly learned, so that no axis sits at a trivial 0 or 1.
    train_on_answers(model, tokenizer, [*forget, *retain], steps=STEPS_TO_PARTLY_LEARN, lr=1e-2)
    retain_only = [0.5, 0.8, 1.0, 1.2, 2.0]
    result = evaluate_unlearning(model, tokenizer, forget, retain, retain_only_truth_ratios=retain_only)
    assert {"forget", "retain", "model_utility", "forget_quality", "exact_reproduction_bound"} <= result.keys()
    assert len(result["forget_truth_ratios"]) == 5 and 0 <= result["forget_quality"] <= 1
    assert result["forget"]["num_examples"] == 5 and result["retain"]["num_examples"] == 5
    # Every axis against its definition, computed by hand (TOFU §2.5, MASC Proposition 1 at rho = 0.5).
    hand_forget, hand_retain = hand_qa(model, tokenizer, forget), hand_qa(model, tokenizer, retain)
    for side, hand in (("forget", hand_forget), ("retain", hand_retain)):
        assert result[side]["probability"] == pytest.approx(hand["probability"], rel=1e-5), side
        assert result[side]["rouge_l_recall"] == pytest.approx(hand["rouge_l_recall"]), side
    assert result["forget_truth_ratios"] == pytest.approx(hand_forget["truth_ratios"], rel=1e-4)
    assert result["forget"]["truth_ratio"] == pytest.approx(mean(min(r, 1 / r) for r in hand_forget["truth_ratios"]))
    retain_truth = mean(max(0.0, 1 - r) for r in hand_retain["truth_ratios"])
    assert result["retain"]["truth_ratio"] == pytest.approx(retain_truth, rel=1e-4, abs=1e-6)
    utility = statistics.harmonic_mean([hand_retain["probability"], hand_retain["rouge_l_recall"], retain_truth])
    assert 0 < utility and result["model_utility"] == pytest.approx(utility, rel=1e-4)
    assert result["forget_quality"] == pytest.approx(ks_2samp(hand_forget["truth_ratios"], retain_only).pvalue)
    bound, _ = hand_bound(model, tokenizer, forget, k=10, rho=0.5)
    assert result["exact_reproduction_bound"] == pytest.approx(bound, rel=1e-5)


def test_normalized_probability_is_a_share_of_the_options():
    from hf_unlearn.evaluation.metrics import answer_log_probs
    from hf_unlearn.evaluation.options import normalized_probabilities

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
    from hf_unlearn.cli.main import main

    _, _, info = learn_target_model(show_progress=False)
    assert (
        main(["eval", "--model_name_or_path", info["path"], "--split", "forget10", "--output_dir", str(tmp_path)]) == 0
    )
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
    # every attack judged against the retain-only model's AUC (issue 54), with intervals that resample the 4 authors a
    # side (issue 66): an attack tells where it is judged and more than 0.1 off; the target is told apart by some
    verdict = muse["membership"]
    assert verdict["attacks"] == len(muse["auc"]) >= 5 and set(verdict["which"]) == {
        attack
        for attack, auc in muse["auc"].items()
        if abs(auc - verdict["per_attack"][attack]["level"]) > 0.1 and attack not in verdict["too_few"]
    }
    assert verdict["which"]
    assert set(result["muse"]["scores"]["groups"]["forget"]) == set(load_split("forget10")["author"])
    assert verdict["per_attack"]["min_k"]["level_from"] == "never_trained" and not verdict["landed"]
    assert f"{verdict['distinguishing']} of {verdict['attacks']} attacks" in (tmp_path / "eval.md").read_text()
    assert (tmp_path / "radar.png").stat().st_size > 10_000 and (tmp_path / "truth_ratios.png").is_file()


def test_trainer_evaluate_runs_the_same_evaluation_during_training(tmp_path):
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2)
    forget_records, retain_records = load_split("forget01"), load_split("retain99").select(range(8))
    train_on_answers(model, tokenizer, [*forget_records, *retain_records], steps=STEPS_TO_PARTLY_LEARN, lr=1e-2)
    forget = build_qa_dataset(forget_records, tokenizer)
    retain = build_qa_dataset(retain_records, tokenizer)
    args = UnlearnConfig(
        output_dir=str(tmp_path), report_to="none", use_cpu=True, max_steps=4, eval_strategy="steps", eval_steps=2,
        probe_interval=0, stop_at_target=False, save_strategy="no",
    )  # fmt: skip
    trainer = UnlearnTrainer(model, args, forget, retain, processing_class=tokenizer)
    trainer.train()
    logged = [entry for entry in trainer.state.log_history if "eval_forget_rouge_l_recall" in entry]
    assert [entry["step"] for entry in logged] == [2, 4]
    metrics = trainer.evaluate()
    # The numbers of the trained model, by hand (TOFU §2.5, MASC Proposition 1 with the run's k and rho) ...
    hand_forget, hand_retain = (
        hand_qa(trainer.model, tokenizer, forget_records),
        hand_qa(trainer.model, tokenizer, retain_records),
    )
    retain_truth = mean(max(0.0, 1 - r) for r in hand_retain["truth_ratios"])
    utility = statistics.harmonic_mean([hand_retain["probability"], hand_retain["rouge_l_recall"], retain_truth])
    bound, _ = hand_bound(trainer.model, tokenizer, forget_records, k=args.masc_k, rho=args.masc_rho)
    expected = {
        "eval_forget_probability": hand_forget["probability"],
        "eval_forget_rouge_l_recall": hand_forget["rouge_l_recall"],
        "eval_retain_probability": hand_retain["probability"],
        "eval_retain_truth_ratio": retain_truth,
        "eval_model_utility": utility,
        "eval_exact_reproduction_bound": bound,
    }
    assert 0 < utility < 1 and 0 < hand_forget["probability"] < 1
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
        # ... which the evaluation at step 4 (the last step: the same weights) logged during training.
        assert logged[-1][key] == pytest.approx(value, rel=1e-4, abs=1e-6), key


def test_trainer_evaluate_names_missing_question_columns(tmp_path):
    from conftest import make_example, make_tiny_model

    args = UnlearnConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, retain_loss="none")
    trainer = UnlearnTrainer(make_tiny_model(), args, [make_example(i) for i in range(4)])
    with pytest.raises(ValueError, match="question and answer columns.*build_qa_dataset"):
        trainer.evaluate()
