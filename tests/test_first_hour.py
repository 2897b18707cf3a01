"""A new user's first hour: their own tiny Llama and question/answer files, every input mistake named before
anything changes, YAML typed like flags, resume from the command line, `eval` on their own data, a prompt format
they choose, and quiet output.

Each CLI test checks the exit status, that the one-line message names the culprit (file, row, column, key or path)
and that no model file and no output folder was touched.
"""

import hashlib
import json
import logging
import os
import shutil

import pytest
import torch
import yaml
from conftest import quantized_and_kept, save_model_folder, train_on_answers
from datasets import Dataset
from safetensors.torch import load_file

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
from hf_unlearn.cli.main import main, quiet_third_party
from hf_unlearn.data.examples import tokenize_prompt, tokenize_qa

COMMON = ["--report_to", "none", "--use_cpu", "true", "--disable_tqdm", "true", "--evaluate", "false"]


def _digest(folder) -> str:
    digest = hashlib.sha256()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            digest.update(name.encode() + open(path, "rb").read())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def user(tmp_path_factory):
    """What the issue's user had: a small Llama of their own that learned 10 made-up facts (plain Trainer-style
    fine-tuning on the answers), saved with its tokenizer, and the facts as JSONL files."""
    root = tmp_path_factory.mktemp("user")
    tokenizer = build_tokenizer()
    # Width 64 (MLP 256): shapes bitsandbytes' AVX-512 BF16 CPU kernel packs, so quant-check quantizes on any CPU.
    model = tiny_model(tokenizer, "llama", hidden_size=64, num_layers=2, num_heads=2)
    forget = load_split("forget05").select_columns(["question", "answer"])
    retain = load_split("retain95").select(range(20)).select_columns(["question", "answer"])
    holdout = load_split("holdout").select(range(10)).select_columns(["question", "answer"])
    train_on_answers(model, tokenizer, [*forget, *retain], steps=120, lr=1e-2)
    save_model_folder(root / "model", model, tokenizer)
    forget.to_json(root / "forget.jsonl")
    retain.to_json(root / "retain.jsonl")
    holdout.to_json(root / "holdout.jsonl")
    return root


def run_cli(capsys, *args) -> tuple[int, str]:
    capsys.readouterr()
    status = main([str(a) for a in args])
    return status, capsys.readouterr().err


def run_args(user, output_dir, forget=None, *extra):
    return [
        "run",
        "--model_name_or_path",
        user / "model",
        "--forget_data",
        forget or user / "forget.jsonl",
        "--retain_data",
        user / "retain.jsonl",
        "--output_dir",
        output_dir,
        *COMMON,
        *extra,
    ]


def assert_refused(capsys, user, tmp_path, forget, *extra, says):
    """The run is refused with one message (no traceback) that contains every string in ``says``; the model folder
    is byte-identical and no output folder was made."""
    before = _digest(user / "model")
    out = tmp_path / "out"
    status, error = run_cli(capsys, *run_args(user, out, forget, "--max_steps", 5, *extra))
    assert status == 1, error
    assert "Traceback" not in error and error.count("error:") == 1
    for text in says:
        assert text in error, (text, error)
    assert _digest(user / "model") == before and not out.exists()
    return error


# --- the data: each row of the table ------------------------------------------------------------------


@pytest.mark.parametrize("suffix, content", [(".json", ""), (".jsonl", ""), (".jsonl", "\n  \n"), (".json", "[]")])
def test_empty_forget_file_names_the_file(capsys, user, tmp_path, suffix, content):
    path = tmp_path / f"forget{suffix}"
    path.write_text(content)
    assert_refused(capsys, user, tmp_path, path, says=[str(path), "no examples"])


def test_malformed_jsonl_line_names_file_and_line(capsys, user, tmp_path):
    lines = (user / "forget.jsonl").read_text().splitlines()
    lines[3] = lines[3].replace('"answer":', "answer:")
    path = tmp_path / "forget.jsonl"
    path.write_text("\n".join(lines))
    assert_refused(capsys, user, tmp_path, path, says=[str(path), "line 4 is not valid JSON"])


@pytest.mark.parametrize(
    "answer, says",
    [(None, "column 'answer', row 2 holds nothing (null)"), (["a", "b"], "column 'answer', row 2 holds list")],
)
def test_answers_that_are_not_text_name_row_and_column(capsys, user, tmp_path, answer, says):
    rows = [json.loads(line) for line in (user / "forget.jsonl").read_text().splitlines()]
    rows[2]["answer"] = answer
    path = tmp_path / "forget.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    error = assert_refused(capsys, user, tmp_path, path, says=[says])
    assert str(path) in error or "column 'answer', row 2" in error


def test_numbers_as_answers_are_read_as_text_with_a_warning(user, caplog):
    tokenizer = build_tokenizer()
    records = [{"question": "How many books did Ann write?", "answer": 12}, {"question": "Q?", "answer": "A."}]
    with caplog.at_level(logging.WARNING):
        dataset = build_qa_dataset(records, tokenizer)
    assert dataset[0]["answer"] == "12"
    expected = "column 'answer' holds numbers in 1 of 2 rows (first: row 0, 12); they are used as text ('12')"
    assert expected in caplog.text


@pytest.mark.parametrize("as_file", [False, True], ids=["list", "jsonl"])
def test_a_thousand_numeric_answers_are_one_warning_not_a_thousand(caplog, tmp_path, as_file):
    tokenizer = build_tokenizer()
    records = [{"question": f"How many books did author {i} write?", "answer": i} for i in range(1000)]
    if as_file:
        path = tmp_path / "forget.jsonl"
        path.write_text("\n".join(json.dumps(r) for r in records))
        records = path
    with caplog.at_level(logging.WARNING):
        dataset = build_qa_dataset(records, tokenizer)
    assert dataset[999]["answer"] == "999"
    numeric = [r for r in caplog.records if "holds numbers" in r.getMessage()]
    assert len(numeric) == 1 and "in 1000 of 1000 rows (first: row 0, 0)" in numeric[0].getMessage()


def test_every_answer_empty_is_refused(capsys, user, tmp_path):
    rows = [{"question": r["question"], "answer": "  "} for r in load_split("forget05")]
    path = tmp_path / "forget.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert_refused(capsys, user, tmp_path, path, says=["every 'answer' is empty", str(path)])


def test_suspicious_but_legal_data_is_named_in_warnings(user, caplog):
    """Some empty answers, duplicates, and forget examples that are also retain examples: warnings that say which;
    a forget set identical to the retain set is an error."""
    tokenizer = build_tokenizer()
    rows = list(load_split("forget05").select_columns(["question", "answer"]))
    rows[1]["answer"] = ""
    rows.append(dict(rows[4]))
    with caplog.at_level(logging.WARNING):
        forget = build_qa_dataset(rows, tokenizer)
    assert "1 of 11 'answer' values are empty (rows [1])" in caplog.text
    assert "1 example(s) repeat an earlier one (row pairs [(4, 10)])" in caplog.text
    retain = build_qa_dataset(list(load_split("retain95").select(range(8))) + rows[:2], tokenizer, name="retain")
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2)
    config = UnlearnConfig(output_dir="unused", report_to="none", use_cpu=True, max_steps=1)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        UnlearnTrainer(model=model, args=config, train_dataset=forget, retain_dataset=retain)
    assert "2 of 11 forget examples are also in the retain set (forget indices [0, 1])" in caplog.text
    with pytest.raises(ValueError, match="Every forget example is also in the retain set"):
        UnlearnTrainer(model=model, args=config, train_dataset=forget, retain_dataset=forget)


# --- settings ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--max_steps", "0"], "max_steps=0 is not a budget"),
        (["--num_train_epochs", "0"], "num_train_epochs=0.0 would train nothing"),
        (["--retain_weight", "-1"], "retain_weight must be >= 0, got -1.0"),
        (["--prompt_template", "Q: {q}"], "prompt_template must be 'chat', 'plain' or a format string"),
    ],
)
def test_illegal_settings_are_refused_before_anything_runs(capsys, user, tmp_path, flags, says):
    before = _digest(user / "model")
    out = tmp_path / "out"
    args = run_args(user, out, None, *flags)
    if "--max_steps" not in flags and "--num_train_epochs" not in flags:
        args += ["--max_steps", "5"]
    status, error = run_cli(capsys, *args)
    assert status == 1 and says in error and "Traceback" not in error, error
    assert _digest(user / "model") == before and not out.exists()


def test_yaml_values_are_typed_like_flags_and_bad_ones_name_their_key(capsys, user, tmp_path):
    out = tmp_path / "out"
    config = {
        "model_name_or_path": str(user / "model"),
        "forget_data": str(user / "forget.jsonl"),
        "retain_data": str(user / "retain.jsonl"),
        "output_dir": str(out),
        "report_to": "none",
        "use_cpu": True,
        "evaluate": False,
        "max_steps": 2,
        "lora_target_modules": ["q_proj", "v_proj"],
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config) + "learning_rate: 1e-3\n")  # YAML reads 1e-3 as the text '1e-3'
    assert yaml.safe_load(path.read_text())["learning_rate"] == "1e-3"
    status, error = run_cli(capsys, "run", path)
    assert status == 0, error
    record = json.loads((out / "report.json").read_text())
    assert record["hyperparameters"]["learning_rate"] == 1e-3 and record["global_step"] == 2
    path.write_text(yaml.safe_dump(dict(config, max_steps="ten", output_dir=str(tmp_path / "o2"))))
    status, error = run_cli(capsys, "run", path)
    assert status == 1 and "config.yaml: key max_steps: invalid int value: 'ten'" in error, error
    assert not (tmp_path / "o2").exists()
    # Flags after the file override it.
    path.write_text(yaml.safe_dump(dict(config, output_dir=str(tmp_path / "o3"))))
    status, error = run_cli(capsys, "run", path, "--max_steps", "1")
    assert status == 0 and json.loads((tmp_path / "o3" / "report.json").read_text())["global_step"] == 1


# --- paths --------------------------------------------------------------------------------------------------------


def test_missing_local_model_folder_is_not_sent_to_the_hub(capsys, user, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("./my-model", str(tmp_path / "models" / "my-model"), "models/llama/final"):
        args = run_args(user, tmp_path / "out", None, "--max_steps", 2)
        args[args.index("--model_name_or_path") + 1] = name
        status, error = run_cli(capsys, *args)
        assert status == 1 and f"The model folder {name!r} does not exist" in error, error
        assert "huggingface.co" not in error and "Hub id" in error


def test_model_folder_without_tokenizer_or_weights_says_which(capsys, user, tmp_path):
    no_tokenizer = tmp_path / "no-tokenizer"
    shutil.copytree(user / "model", no_tokenizer)
    for name in os.listdir(no_tokenizer):
        if name.startswith("tokenizer") or name == "special_tokens_map.json":
            os.remove(no_tokenizer / name)
    args = run_args(user, tmp_path / "out", None, "--max_steps", 2)
    args[args.index("--model_name_or_path") + 1] = no_tokenizer
    status, error = run_cli(capsys, *args)
    assert status == 1 and "holds a model but no tokenizer" in error and "tokenizer.save_pretrained" in error
    assert "sentencepiece" not in error and "--tokenizer_name_or_path PATH" in error
    # eval has no tokenizer option: its error offers only what it can do.
    status, error = run_cli(
        capsys,
        "eval",
        "--model_name_or_path",
        no_tokenizer,
        "--forget_data",
        user / "forget.jsonl",
        "--output_dir",
        tmp_path / "e",
    )
    assert status == 1 and "holds a model but no tokenizer" in error and "--tokenizer_name_or_path" not in error
    status, error = run_cli(capsys, *args, "--tokenizer_name_or_path", user / "model", "--output_dir", tmp_path / "o")
    assert status == 0, error
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    args[args.index("--model_name_or_path") + 1] = empty
    status, error = run_cli(capsys, *args)
    assert status == 1 and "holds no model (no config.json" in error


# --- output folder and resume -------------------------------------------------------------------------------------


def _weights(folder):
    return load_file(os.path.join(folder, "model.safetensors"))


def test_cli_resume_matches_an_uninterrupted_run_and_output_folders_are_protected(capsys, user, tmp_path):
    """An interrupted run (its output folder holding only its first checkpoint) resumed with --resume_from_checkpoint
    true ends at the same step with the same weights as the run that was never interrupted."""
    flags = ["--learning_rate", "1e-3", "--probe_interval", 5, "--save_strategy", "steps", "--save_steps", 5]
    flags += ["--max_steps", 60]
    whole = tmp_path / "whole"
    status, error = run_cli(capsys, *run_args(user, whole, None, *flags))
    assert status == 0, error
    record = json.loads((whole / "report.json").read_text())
    assert record["stop_kind"] == "target" and record["global_step"] >= 10, record["stop_reason"]

    interrupted = tmp_path / "interrupted"
    interrupted.mkdir()
    shutil.copytree(whole / "checkpoint-5", interrupted / "checkpoint-5")
    status, error = run_cli(capsys, *run_args(user, interrupted, None, *flags))
    assert status == 1 and "already holds a run (checkpoint-5)" in error and "--resume_from_checkpoint" in error
    assert sorted(os.listdir(interrupted)) == ["checkpoint-5"]  # refused before anything was written

    status, error = run_cli(capsys, *run_args(user, interrupted, None, *flags, "--resume_from_checkpoint", "true"))
    assert status == 0, error
    resumed = json.loads((interrupted / "report.json").read_text())
    assert resumed["global_step"] == record["global_step"] and resumed["stop_step"] == record["stop_step"]
    expected, got = _weights(whole), _weights(interrupted)
    assert all(torch.equal(expected[name], got[name]) for name in expected)

    missing = run_args(user, tmp_path / "x", None, *flags, "--resume_from_checkpoint", "ckpt-30")
    status, error = run_cli(capsys, *missing)
    assert status == 1 and "resume_from_checkpoint 'ckpt-30' is not a folder" in error
    status, error = run_cli(capsys, *run_args(user, tmp_path / "y", None, *flags, "--resume_from_checkpoint", "true"))
    assert status == 1 and "holds no checkpoint-N folder" in error

    # Overwriting on request removes the old run's checkpoints, so a later resume cannot pick them up.
    status, error = run_cli(
        capsys, *run_args(user, interrupted, None, "--max_steps", 2, "--overwrite_output_dir", "true")
    )
    assert status == 0, error
    assert "checkpoint-5" not in os.listdir(interrupted)
    assert json.loads((interrupted / "report.json").read_text())["global_step"] == 2


def test_unwritable_output_folder_is_refused_before_any_work(capsys, user, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    before = _digest(user / "model")
    status, error = run_cli(capsys, *run_args(user, blocker / "out", None, "--max_steps", 2))
    assert status == 1 and "cannot be written" in error and "is a file" in error
    assert _digest(user / "model") == before
    config = UnlearnConfig(output_dir=str(blocker / "out"), report_to="none", use_cpu=True, max_steps=2)
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=1, num_heads=2)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    forget = build_qa_dataset(user / "forget.jsonl", tokenizer)
    retain = build_qa_dataset(str(user / "retain.jsonl"), tokenizer, name="retain")
    with pytest.raises(PermissionError, match="cannot be written"):
        UnlearnTrainer(model=model, args=config, train_dataset=forget, retain_dataset=retain)
    assert all(torch.equal(start[k], v) for k, v in model.state_dict().items())


# --- eval on the user's own data ------------------------------------------------------------------------------


def test_eval_on_own_data_and_never_silently_on_the_embedded_benchmark(capsys, user, tmp_path):
    model = user / "model"
    status, error = run_cli(capsys, "eval", "--model_name_or_path", model, "--output_dir", tmp_path / "e0")
    assert status == 1 and "--forget_data" in error and "say what to evaluate" in error
    assert not (tmp_path / "e0").exists()

    out = tmp_path / "e1"
    status, error = run_cli(
        capsys,
        *[
            "eval",
            "--model_name_or_path",
            model,
            "--forget_data",
            user / "forget.jsonl",
            "--retain_data",
            user / "retain.jsonl",
        ],
        *["--holdout_data", user / "holdout.jsonl", "--output_dir", out],
    )
    assert status == 0, error
    result = json.loads((out / "eval.json").read_text())
    assert result["data"]["forget"] == f"{user / 'forget.jsonl'} (10 examples)"
    assert result["forget"]["num_examples"] == 10 and result["retain"]["num_examples"] == 20
    assert result["forget"]["rouge_l_recall"] > 0.5  # the user's model did learn these facts
    assert 0.0 <= result["muse"]["auc"]["min_k"] <= 1.0
    assert "Evaluated on: forget: " in (out / "eval.md").read_text()

    # A file given as --benchmark is the forget set, said so; the embedded benchmark asked for explicitly is
    # evaluated with a warning in the output.
    out = tmp_path / "e2"
    status, error = run_cli(
        capsys, "eval", "--model_name_or_path", model, "--benchmark", user / "forget.jsonl", "--output_dir", out
    )
    assert status == 0, error
    assert "evaluated as your forget set" in (out / "eval.md").read_text()
    reference = tmp_path / "reference.json"
    reference.write_text(json.dumps({"forget_truth_ratios": [1.0, 0.5], "muse": {"auc": {"min_k": 0.5}}}))
    out = tmp_path / "e3"
    status, error = run_cli(
        capsys,
        *["eval", "--model_name_or_path", model, "--benchmark", "embedded", "--max_examples", 2, "--output_dir", out],
        *["--reference_eval", reference],
    )
    assert status == 0, error
    assert "no record of learning the embedded fictitious-authors benchmark" in (out / "eval.md").read_text()


# --- the prompt format --------------------------------------------------------------------------------------------


def test_build_qa_dataset_takes_a_list_a_dataset_or_a_path(user):
    tokenizer = build_tokenizer()
    rows = [json.loads(line) for line in (user / "forget.jsonl").read_text().splitlines()]
    from_list = build_qa_dataset(rows, tokenizer)
    from_dataset = build_qa_dataset(Dataset.from_list(rows), tokenizer)
    from_path = build_qa_dataset(user / "forget.jsonl", tokenizer)
    assert from_list["input_ids"] == from_dataset["input_ids"] == from_path["input_ids"]
    with pytest.raises(TypeError, match="row 1 is a str"):
        build_qa_dataset([rows[0], "Who wrote it?"], tokenizer)


def test_a_custom_prompt_template_is_used_for_training_data_and_evaluation(capsys, user, tmp_path):
    tokenizer = build_tokenizer()
    template = "### Q: {question}\n### A: {answer}"
    example = tokenize_qa(tokenizer, "Who?", "Ann Berg.", prompt_template=template)
    prompt = [t for t, label in zip(example["input_ids"], example["labels"]) if label == -100]
    answer = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
    assert tokenizer.decode(prompt, skip_special_tokens=True) == tokenizer.decode(
        tokenize_prompt(tokenizer, "Who?", template), skip_special_tokens=True
    )
    assert tokenizer.decode(prompt, skip_special_tokens=True).replace(" ", "").endswith("###A:")
    assert tokenizer.decode(answer, skip_special_tokens=True).strip() == "Ann Berg."
    # The plain default equals the template spelled out.
    assert tokenize_qa(tokenizer, "Who?", "Ann.") == tokenize_qa(
        tokenizer, "Who?", "Ann.", prompt_template="Question: {question}\nAnswer: {answer}"
    )
    out = tmp_path / "templated"
    status, error = run_cli(capsys, *run_args(user, out, None, "--max_steps", 2, "--prompt_template", template))
    assert status == 0, error
    record = json.loads((out / "report.json").read_text())
    assert record["extra"]["prompt_template"] == template
    assert "### Q:" in (out / "README.md").read_text()


# --- quiet by default -----------------------------------------------------------------------------------------------


def test_quiet_by_default(capfd, user):
    quiet_third_party()
    # bitsandbytes' note about an optional CPU kernel package is not shown; datasets' progress bars are off.
    assert not logging.getLogger("bitsandbytes.backends.cpu.ops").isEnabledFor(logging.WARNING)
    capfd.readouterr()
    build_qa_dataset(user / "forget.jsonl", build_tokenizer())
    captured = capfd.readouterr()
    assert "Tokenizing" not in captured.err + captured.out and "Generating" not in captured.err + captured.out


def test_bitsandbytes_note_about_its_optional_cpu_kernel_package_is_not_shown():
    """bitsandbytes warns at import, on a CPU with AVX-512 BF16, that the optional `kernels` package is missing; the
    package drops that note before it first imports bitsandbytes (through transformers and peft) and says at info
    level which kernel is used. A fresh interpreter shows what a user sees on this CPU; the filter itself is checked
    with bitsandbytes' own message on its own logger, on any CPU."""
    import subprocess
    import sys

    from bitsandbytes.functional import has_avx512bf16

    import hf_unlearn.third_party as third_party

    script = (
        "import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stderr, format='%(name)s: "
        "%(message)s'); from hf_unlearn import UnlearnTrainer; "
        "assert 'bitsandbytes.backends.cpu.ops' in sys.modules, 'bitsandbytes was not imported'"
    )
    shown = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stderr
    assert third_party.OPTIONAL_KERNEL_NOTE not in shown, shown
    try:
        import kernels  # noqa: F401

        missing = False
    except ImportError:
        missing = True
    said = "hf_unlearn.third_party: bitsandbytes: 4-bit matmuls on this CPU (AVX-512 BF16) use the kernel"
    assert (said in shown) is (missing and bool(has_avx512bf16())), shown

    bnb_logger = logging.getLogger(third_party.BITSANDBYTES_CPU_LOGGER)
    seen = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = seen.append
    info = logging.getLogger(third_party.__name__)
    info.addHandler(handler)
    bnb_logger.addHandler(handler)
    level = info.level
    info.setLevel(logging.INFO)
    try:
        # bitsandbytes 0.50's call, backends/cpu/ops.py: logger.warning("Failed to load ...: %s. Please ...", exc)
        for message, args in (
            (
                third_party.OPTIONAL_KERNEL_NOTE + ": %s. Please make sure you already `pip install kernels`",
                (ModuleNotFoundError("No module named 'kernels'"),),
            ),
            ("another bitsandbytes warning", ()),
        ):
            bnb_logger.handle(
                bnb_logger.makeRecord(bnb_logger.name, logging.WARNING, "ops.py", 1, message, args, None)
            )
    finally:
        info.removeHandler(handler)
        bnb_logger.removeHandler(handler)
        info.setLevel(level)
    assert [(r.name, r.levelno) for r in seen] == [
        (third_party.__name__, logging.INFO),
        (third_party.BITSANDBYTES_CPU_LOGGER, logging.WARNING),
    ]
    assert (
        "No module named 'kernels'" in seen[0].getMessage() and seen[1].getMessage() == "another bitsandbytes warning"
    )


# --- the README's drop-in snippet, as is ------------------------------------------------------------------------


def test_readme_drop_in_snippet_runs_to_a_self_stop_on_a_users_own_ten_facts(user, tmp_path, monkeypatch, capsys):
    """The snippet under "The drop-in swap", copied unchanged, with the user's model and a 10-example forget set."""
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md")).read()
    section = readme[readme.index("## The drop-in swap") :]
    start = section.index("```python\n") + len("```python\n")
    snippet = section[start : section.index("\n```", start)]
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scope = {
        "model": AutoModelForCausalLM.from_pretrained(user / "model"),
        "tokenizer": AutoTokenizer.from_pretrained(user / "model"),
        "forget_records": [json.loads(line) for line in (user / "forget.jsonl").read_text().splitlines()],
        "retain_records": str(user / "retain.jsonl"),
    }
    assert len(scope["forget_records"]) == 10
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "README.md", "exec"), scope)
    record = scope["trainer"].record
    assert record.stop_kind == "target", record.stop_reason
    assert record.stop_reason in capsys.readouterr().out
    assert (tmp_path / "out" / "unlearn_record.json").exists()


def test_quant_check_on_own_data_and_never_silently_on_the_embedded_benchmark(capsys, user, tmp_path):
    model = user / "model"
    status, error = run_cli(capsys, "quant-check", "--model_name_or_path", model, "--output_dir", tmp_path / "q0")
    assert status == 1 and "--forget_data" in error
    status, error = run_cli(
        capsys,
        *["quant-check", "--model_name_or_path", model, "--forget_data", user / "forget.jsonl"],
        *["--retain_data", user / "retain.jsonl", "--modes", "nf4", "--output_dir", tmp_path / "q1"],
    )
    assert status == 0, error
    result = json.loads((tmp_path / "q1" / "quant_check.json").read_text())
    assert result["nf4"]["forget"]["num_examples"] == 10 and result["nf4"]["retain"]["num_examples"] == 20
    assert quantized_and_kept(result["nf4"]) == (2 * 7, 0) and result["nf4"]["measured"] is True
