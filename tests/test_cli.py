"""The command line: `run` on local files in the Hub schema, YAML configs, and the offline demo."""

import dataclasses
import json
import math
import os

import pytest
import yaml
from conftest import quantized_and_kept, tiny_model_folder, write_hub_repo, write_qa_files
from datasets import Dataset, DatasetDict

from hf_unlearn.benchmarks import build_tokenizer, load_split
from hf_unlearn.cli.main import main
from hf_unlearn.data.examples import tokenize_qa
from hf_unlearn.data.loaders import load_records
from hf_unlearn.evaluation.membership import ATTACKS, membership_verdict_line
from hf_unlearn.robustness.audit import membership_side

REPORT_KEYS = {
    "method",
    "stopped_early",
    "stop_step",
    "max_steps",
    "wall_seconds",
    "violation_rate",
    "stop_reason",
    "global_step",
    "exact_reproduction_bound",
    "before",
    "after",
}


@pytest.fixture(scope="module")
def local_model_and_data(tmp_path_factory):
    """A tiny model folder and TOFU-schema JSON files (question/answer columns), as a user would have."""
    root = tmp_path_factory.mktemp("local")
    # Width 64: every linear layer a shape bitsandbytes' AVX-512 BF16 CPU kernel packs, so --audit quantizes them.
    tiny_model_folder(root / "model", "gpt2", hidden_size=64, num_layers=1, num_heads=2)
    return write_qa_files(root)


def test_run_from_local_files(tmp_path, local_model_and_data):
    root = local_model_and_data
    out = tmp_path / "out"
    status = main(
        [
            "run",
            "--model_name_or_path",
            str(root / "model"),
            "--forget_data",
            str(root / "forget.json"),
            "--retain_data",
            str(root / "retain.jsonl"),
            "--output_dir",
            str(out),
            "--max_steps",
            "4",
            "--probe_interval",
            "2",
            "--report_to",
            "none",
            "--use_cpu",
            "true",
            "--learning_rate",
            "1e-3",
        ]
    )
    assert status == 0  # done: not 1 (a wrong input) nor 3 (the run failed its own checks)
    report = json.loads((out / "report.json").read_text())
    assert REPORT_KEYS <= report.keys()
    assert report["before"]["forget"]["num_examples"] == 10
    assert (out / "model.safetensors").exists() and (out / "report.md").exists()


def test_run_from_yaml_and_unknown_keys_are_named(tmp_path, local_model_and_data, capsys):
    root = local_model_and_data
    config = {
        "model_name_or_path": str(root / "model"),
        "forget_data": str(root / "forget.json"),
        "retain_data": str(root / "retain.jsonl"),
        "output_dir": str(tmp_path / "yaml-out"),
        "max_steps": 2,
        "probe_interval": 1,
        "report_to": "none",
        "use_cpu": True,
        "evaluate": False,
        "method": "npo_klr",
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    assert main(["run", str(path)]) == 0
    report = json.loads((tmp_path / "yaml-out" / "report.json").read_text())
    assert report["method"] == "npo_klr" and report["global_step"] == 2 and not report["stopped_early"]
    path.write_text(yaml.safe_dump(dict(config, forget_rate=0.1, overwrite_output_dir=True)))
    assert main(["run", str(path)]) == 1
    assert "config.yaml: unknown key(s): forget_rate" in capsys.readouterr().err


def test_saved_dataset_folder_and_hub_schema(tmp_path):
    records = Dataset.from_list([{"question": "Who?", "answer": "Nobody."}])
    records.save_to_disk(tmp_path / "saved")
    assert load_records(str(tmp_path / "saved"))[0]["answer"] == "Nobody."
    # A saved DatasetDict: the split asked for, not the first one.
    DatasetDict({"train": records, "test": Dataset.from_list([{"question": "Q?", "answer": "Test."}])}).save_to_disk(
        tmp_path / "saved_dict"
    )
    assert list(load_records(str(tmp_path / "saved_dict"), split="test")["answer"]) == ["Test."]
    # The Hub schema: a folder laid out like locuslab/TOFU (a README whose `configs` map each config's files), read
    # by config and split as `load_dataset("locuslab/TOFU", "forget05")` reads the Hub repository.
    forget, retain = load_split("forget05"), load_split("retain95").select(range(3))
    repo = write_hub_repo(
        tmp_path / "TOFU", {"forget05": {"train": list(forget)}, "retain95": {"train": list(retain)}}
    )
    for config, expected in (("forget05", forget), ("retain95", retain)):
        loaded = load_records(repo, config)
        for column in ("question", "answer", "perturbed_answer"):
            assert list(loaded[column]) == list(expected[column]), (config, column)


def test_offline_hub_id_fails_with_a_clear_message(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match="(?s)Could not load dataset 'someone/not-here'.*HF_HUB_OFFLINE=1"):
        load_records("someone/not-here", "forget10")
    out = tmp_path / "o"
    assert (
        main(["run", "--model_name_or_path", "someone/not-here", "--forget_data", "x", "--output_dir", str(out)]) == 1
    )
    error = capsys.readouterr().err
    assert "Could not load model 'someone/not-here'" in error and "HF_HUB_OFFLINE=1" in error
    assert "Traceback" not in error and not out.exists()
    monkeypatch.setenv("HF_UNLEARN_TRACEBACK", "1")
    with pytest.raises(RuntimeError, match="(?s)Could not load model 'someone/not-here'.*HF_HUB_OFFLINE=1"):
        main(["run", "--model_name_or_path", "someone/not-here", "--forget_data", "x", "--output_dir", str(out)])


def test_tokenize_qa_masks_the_prompt():
    tokenizer = build_tokenizer()
    example = tokenize_qa(tokenizer, "Where was Ann born?", "Ann was born in Oslo.")
    answer = [t for t, label in zip(example["input_ids"], example["labels"]) if label != -100]
    assert tokenizer.decode(answer, skip_special_tokens=True).strip() == "Ann was born in Oslo."
    assert example["labels"][0] == -100 and example["labels"][-1] == tokenizer.eos_token_id


@pytest.mark.slow
def test_demo_forgets_keeps_and_stops_itself(tmp_path):
    """README command one, end to end: learn the benchmark, unlearn forget10 with MASC, write the report."""
    out = tmp_path / "demo"
    assert main(["demo", "--output_dir", str(out), "--disable_tqdm", "true"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert REPORT_KEYS <= report.keys()
    assert report["stopped_early"] and report["stop_step"] <= report["max_steps"] / 2
    before, after = report["before"], report["after"]
    assert after["forget"]["rouge_l_recall"] <= 0.5 * before["forget"]["rouge_l_recall"]
    assert after["retain"]["rouge_l_recall"] >= 0.9 * before["retain"]["rouge_l_recall"]
    assert report["exact_reproduction_bound"]["mean"] < 0.5
    assert (out / "training_curves.png").stat().st_size > 10_000
    # TOFU forget quality is measured before and after against the retain-only model and reported either way.
    # Whether it rises depends on the target model, which depends on the CPU's float kernels: 0.012 -> 0.034 on an
    # Intel Xeon, 0.081 -> 0.034 on an AMD EPYC (README); it is not a property to assert.
    tofu = report["evaluation"]
    assert 0 <= tofu["before"]["forget_quality"] <= 1 and 0 <= tofu["after"]["forget_quality"] <= 1
    assert "Forget quality" in (out / "report.md").read_text()
    # three forget answers beside the never-trained model's, in the record and the report a person reads
    answers = report["extra"]["forget_answers"]
    forget = load_split("forget10")
    assert [a["question"] for a in answers] == [forget[i]["question"] for i in range(3)]
    assert all(a["after"] and a["never_trained"] for a in answers)
    assert "## Forget answers" in (out / "report.md").read_text()
    # every membership attack, the unlearned model's beside the never-trained model's, and which still tell the
    # forget set apart (issue 54): in the record, the report and the model card
    membership = tofu["membership"]
    assert set(membership["auc"]) == set(membership["never_trained_auc"]) == set(ATTACKS)
    verdict = membership["membership"]
    judged = {a for a, row in verdict["per_attack"].items() if row["verdict"] != "too few answers to judge"}
    told = {a for a in judged if abs(membership["auc"][a] - membership["never_trained_auc"][a]) > 0.1}
    assert set(verdict["which"]) == told and set(verdict["too_few"]) == set(ATTACKS) - judged
    for attack, row in verdict["per_attack"].items():  # each attack's interval, and the paired difference's
        low, high = membership["auc_interval"][attack]
        assert math.isnan(low) or low <= membership["auc"][attack] <= high
        low, high = row["off_interval"]
        if math.isnan(low):  # scores that separate the sets perfectly (the reference attack here): no interval
            assert attack not in judged
            continue
        assert low <= row["off"] <= high
        assert (attack in judged) is ((high - low) / 2 <= 0.1 or low > 0.1 or high < -0.1)
    line = membership_verdict_line(membership["membership"])
    assert line in (out / "report.md").read_text() and line in (out / "README.md").read_text()
    assert report["stop_reason"].startswith("target reached") and report["complete"]
    assert (out / "model.safetensors").is_file()  # so `hf-unlearn eval --model_name_or_path OUT` works
    # The robustness audit of the demo's output, offline: one verdict per check, written to the record and card.
    assert main(["audit", "--model_name_or_path", str(out), "--output_dir", str(tmp_path / "audit")]) == 0
    audit = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert set(audit["verdicts"]) == {"quantization", "relearning", "membership"}
    assert audit["membership"]["verdict"] == membership_side(audit["membership"]["attacks"])
    assert audit["verdicts"]["membership"]["passed"] is audit["membership"]["attacks"]["landed"]
    assert "## Robustness" in (out / "README.md").read_text()
    assert json.loads((out / "unlearn_record.json").read_text())["audit"]["verdicts"] == audit["verdicts"]


@pytest.mark.slow
def test_sequence_of_requests_on_the_embedded_benchmark(tmp_path):
    """`hf-unlearn sequence` with no data: one request per forget author, each stopping itself, all re-measured."""
    out = tmp_path / "sequence"
    assert main(["sequence", "--output_dir", str(out), "--num_requests", "2", "--disable_tqdm", "true"]) == 0
    saved = json.loads((out / "sequence.json").read_text())
    authors = list(dict.fromkeys(load_split("forget10")["author"]))[:2]
    assert saved["requests"] == [f"author {a}" for a in authors]
    assert [p["after_request"] for p in saved["history"]] == [0, 1, 2]
    first = saved["requests"][0]
    assert (
        saved["history"][1]["forget"][first]["rouge_l_recall"] < saved["history"][0]["forget"][first]["rouge_l_recall"]
    )
    ledger = json.loads((out / "unlearning_ledger.json").read_text())["requests"]
    assert [e["request"] for e in ledger] == [1, 2] and all(e["stop_kind"] == "target" for e in ledger)
    assert (out / "sustainability.png").stat().st_size > 10_000
    assert "## Unlearning requests" in (out / "README.md").read_text()


def test_sequence_refuses_requests_without_a_model(tmp_path, capsys):
    assert main(["sequence", "--output_dir", str(tmp_path / "s"), "--requests", "a.json"]) == 1
    assert "give --model_name_or_path too" in capsys.readouterr().err
    model = tmp_path / "model"
    assert main(["sequence", "--output_dir", str(tmp_path / "s"), "--model_name_or_path", str(model)]) == 1
    assert "--requests first.json" in capsys.readouterr().err


def test_the_demo_size_reaches_every_set_the_demo_and_its_checks_read(tmp_path, capsys):
    """Issue 66 part 3: `demo --size judge` reads 64 authors (320 answers) a side, and `eval`/`audit`/`relearn-check`
    of its run read the same size from its record; an unknown size is refused before any work."""
    from types import SimpleNamespace

    from hf_unlearn.evaluation.suites import embedded_evaluation_sets
    from hf_unlearn.jobs.checks import check_data, recorded_size
    from hf_unlearn.training.record import UnlearnRecord

    out = tmp_path / "demo"
    assert main(["demo", "--size", "huge", "--output_dir", str(out)]) == 1
    assert "Unknown benchmark size 'huge'; choose one of quick, judge" in capsys.readouterr().err
    assert not out.exists()
    demo = {"benchmark": "fictitious_authors"}
    record = UnlearnRecord("masc", "masc", "none", extra={**demo, "benchmark_size": "judge"})
    sets = embedded_evaluation_sets("forget10", **recorded_size(record))
    assert (len(sets["privleak_forget"]), len(sets["privleak_holdout"]), len(sets["retain"])) == (320, 320, 2880)
    cli = SimpleNamespace(
        benchmark=None, split="forget10", forget_data=None, retain_data=None, holdout_data=None, retain_split=None,
        model_name_or_path=str(tmp_path), prompt_template=None,
    )  # fmt: skip
    forget, retain, _ = check_data(cli, record, "audit")
    assert (len(forget), len(retain)) == (320, 2880)
    quick = UnlearnRecord("masc", "masc", "none", extra=demo)  # a run from before the option: the quick size
    assert len(check_data(cli, quick, "audit")[0]) == 20


@pytest.mark.parametrize("command", ["demo", "sequence"])
def test_demo_and_sequence_refuse_a_named_folder_that_holds_a_run(tmp_path, capsys, monkeypatch, command):
    """Issue 67: `demo` and `sequence` overwrite only their own default folder; a folder the user named that holds a
    run is refused before any work, as `run` refuses it, and nothing in it changes."""
    from hf_unlearn.cli.main import DEMO_DEFAULTS, _parse, own_folder_defaults
    from hf_unlearn.training.config import UnlearnConfig

    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "unlearn_record.json").write_text('{"method": "masc"}')
    (earlier / "model.safetensors").write_bytes(b"weights")
    assert main([command, "--output_dir", str(earlier)]) == 1
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite_output_dir" in err
    assert (earlier / "model.safetensors").read_bytes() == b"weights" and (earlier / "unlearn_record.json").exists()
    # the default folder (the demo is meant to be run again there) and an explicit flag overwrite
    monkeypatch.chdir(tmp_path)
    (config,) = _parse((UnlearnConfig,), [], defaults=own_folder_defaults([], DEMO_DEFAULTS))
    assert config.overwrite_output_dir and config.output_dir == "hf-unlearn-demo"
    named = ["--output_dir", str(earlier), "--overwrite_output_dir", "true"]
    (config,) = _parse((UnlearnConfig,), named, defaults=own_folder_defaults(named, DEMO_DEFAULTS))
    assert config.overwrite_output_dir


def test_a_calibration_set_the_papers_mode_does_not_read_is_refused_before_measuring(
    tmp_path, capsys, local_model_and_data
):
    """`hf-unlearn run --calibration_data` with the library's defaults (the paper's mode, which reads none): one line
    naming the options that read one, before the job measures anything (a measurement can take minutes)."""
    root = local_model_and_data
    argv = ["run", "--model_name_or_path", str(root / "model"), "--forget_data", str(root / "forget.json"),
            "--retain_data", str(root / "retain.jsonl"), "--calibration_data", str(root / "forget.json"),
            "--output_dir", str(tmp_path / "out"), "--max_steps", "2", "--report_to", "none"]  # fmt: skip
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "calibration_dataset is given, but masc_threshold='rho' with stop_target='alpha'" in err
    assert "measuring before" not in err and not (tmp_path / "out" / "report.json").exists()


def test_the_library_defaults_to_the_papers_mode_and_the_demo_asks_for_ours():
    """UnlearnConfig's MASC defaults are the paper's mode (no calibration set read); the demo and the embedded
    sequence ask for our calibrated mode by name (the Min-K% stop; the gap where a side has ten answers or fewer: the
    chronicles, one author's request), and the demo's flags give the paper's mode back, reading no calibration set."""
    from hf_unlearn import UnlearnConfig
    from hf_unlearn.cli.arguments import DemoArguments, SequenceArguments
    from hf_unlearn.cli.main import _parse, demo_defaults, sequence_defaults
    from hf_unlearn.objectives.masc.options import reads_calibration

    (library,) = _parse((UnlearnConfig,), ["--output_dir", "x"])
    assert (library.masc_threshold, library.stop_target) == ("rho", "alpha") and not reads_calibration(library)
    for argv, target in (([], "membership"), (["--benchmark", "chronicles"], "calibration")):
        _, demo = _parse((DemoArguments, UnlearnConfig), argv, defaults=demo_defaults(argv))
        assert (demo.masc_threshold, demo.stop_target) == ("calibration", target)
        # the Min-K% stop chosen at the judge size: every forget answer, AUC 0.5 (issue 66 part 4); not the gap's
        chosen = (0.0, 320) if target == "membership" else (None, UnlearnConfig.probe_size)
        assert (demo.calibration_auc_slack, demo.probe_size) == chosen
    paper = ["--masc_threshold", "rho", "--stop_target", "alpha"]
    _, demo = _parse((DemoArguments, UnlearnConfig), paper, defaults=demo_defaults(paper))
    assert not reads_calibration(demo) and (demo.calibration_auc_slack, demo.probe_size) == (None, 64)
    own = ["--probe_size", "32", "--calibration_auc_slack", "0.05"]  # a user's flags win
    _, demo = _parse((DemoArguments, UnlearnConfig), own, defaults=demo_defaults(own))
    assert (demo.calibration_auc_slack, demo.probe_size) == (0.05, 32)
    _, sequence = _parse((SequenceArguments, UnlearnConfig), [], defaults=sequence_defaults([]))
    assert (sequence.masc_threshold, sequence.stop_target) == ("calibration", "calibration")
    own = ["--model_name_or_path", "m"]
    _, sequence = _parse((SequenceArguments, UnlearnConfig), own, defaults=sequence_defaults(own))
    assert (sequence.masc_threshold, sequence.stop_target) == ("rho", "alpha")


@pytest.mark.slow
def test_chronicles_demo_runs_offline(tmp_path):
    """`hf-unlearn demo --benchmark chronicles`: learn the long-text corpus, forget two towns, MUSE's metrics."""
    out = tmp_path / "chronicles"
    assert main(["demo", "--benchmark", "chronicles", "--output_dir", str(out), "--disable_tqdm", "true"]) == 0
    record = json.loads((out / "unlearn_record.json").read_text())
    assert record["extra"]["benchmark"] == "chronicles" and record["stop_kind"] == "target"
    muse = record["evaluation"]["muse"]
    assert muse["before"]["verbmem_forget"] > 0.9 and muse["after"]["verbmem_forget"] < 0.5
    assert muse["after"]["knowmem_retain"] > 0.8
    assert muse["before"]["privleak"]["min_k"] < -50  # the target remembers its forget passages
    assert "| VerbMem forget |" in (out / "muse.md").read_text()
    assert record["forget_dataset"]["name"] == "hf_unlearn fictitious chronicles / forget"


def test_run_with_audit_writes_the_verdicts_into_record_and_card(tmp_path, local_model_and_data):
    root = local_model_and_data
    load_split("holdout").select(range(10)).to_json(tmp_path / "holdout.json")
    out = tmp_path / "audited"
    argv = ["run", "--model_name_or_path", str(root / "model"), "--forget_data", str(root / "forget.json"),
            "--retain_data", str(root / "retain.jsonl"), "--output_dir", str(out), "--max_steps", "4",
            "--report_to", "none", "--use_cpu", "true", "--evaluate", "false", "--audit", "true",
            "--audit_holdout_data", str(tmp_path / "holdout.json")]  # fmt: skip
    assert main(argv) == 0
    audit = json.loads((out / "audit.json").read_text())
    assert set(audit["verdicts"]) == {"quantization", "relearning", "membership"}
    assert audit["membership"]["verdict"] == "no reference"  # no --audit_reference_model: AUCs only
    # attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj, all in 4 bits on any CPU: the quantization verdict is a real one.
    assert quantized_and_kept(audit["quantization"]["nf4"]) == (4, 0)
    assert isinstance(audit["verdicts"]["quantization"]["passed"], bool)
    record = json.loads((out / "unlearn_record.json").read_text())
    assert record["audit"]["verdicts"] == audit["verdicts"] and record["relearning"] is not None
    assert "## Robustness" in (out / "README.md").read_text()
    assert json.loads((out / "report.json").read_text())["audit"]["verdicts"] == audit["verdicts"]


def test_a_lora_output_unlearned_again_keeps_its_ledger(tmp_path, local_model_and_data):
    """The adapter folder holds the ledger; the model loaded from it names only its base, so the job reads it."""
    root = local_model_and_data
    common = ["--forget_data", str(root / "forget.json"), "--retain_data", str(root / "retain.jsonl"),
              "--max_steps", "2", "--report_to", "none", "--use_cpu", "true", "--evaluate", "false"]  # fmt: skip
    first, second = tmp_path / "first", tmp_path / "second"
    lora = ["--lora_r", "4", "--lora_target_modules", "c_attn"]
    assert main(["run", "--model_name_or_path", str(root / "model"), "--output_dir", str(first), *lora, *common]) == 0
    assert (first / "adapter_config.json").is_file()
    ledger = json.loads((first / "unlearning_ledger.json").read_text())["requests"]
    assert len(ledger) == 1
    assert main(["run", "--model_name_or_path", str(first), "--output_dir", str(second), *common]) == 0
    again = json.loads((second / "unlearning_ledger.json").read_text())["requests"]
    assert [e["request"] for e in again] == [1, 2] and again[0] == ledger[0]


def test_every_command_spells_the_model_and_data_the_same_way(tmp_path):
    """--model_name_or_path and --forget_data/--retain_data on every command; no other spelling is read."""

    from hf_unlearn.cli.arguments import (
        AuditArguments,
        EvalArguments,
        PushArguments,
        QuantCheckArguments,
        RelearnCheckArguments,
        RunArguments,
        SequenceArguments,
    )
    from hf_unlearn.cli.main import _parse

    for arguments in (RunArguments, SequenceArguments, EvalArguments, QuantCheckArguments, RelearnCheckArguments,
                      AuditArguments, PushArguments):  # fmt: skip
        names = {f.name for f in dataclasses.fields(arguments)}
        assert "model_name_or_path" in names and not names & {"model", "model_dir", "dataset_name"}, arguments
        if arguments is not PushArguments:
            assert {"forget_data", "retain_data", "question_column", "answer_column"} <= names, arguments
    (cli,) = _parse((EvalArguments,), ["--model_name_or_path", "folder", "--forget_data", "f.json"])
    assert cli.model_name_or_path == "folder" and cli.forget_data == "f.json"
    with pytest.raises(ValueError, match="unknown option.*model_dir"):  # the spellings of no release: unknown flags
        _parse((PushArguments,), ["--model_dir", "out", "--repo_id", "me/x"])
    # Without a model the command says which flag it needs, before any work.
    assert main(["eval", "--forget_data", "f.json", "--output_dir", str(tmp_path)]) == 1
    assert main(["run", "--model_name_or_path", "m", "--output_dir", str(tmp_path / "r")]) == 1


def test_a_lora_run_saved_in_one_folder_loads_elsewhere(tmp_path, local_model_and_data, monkeypatch, caplog, capsys):
    """`run --model_name_or_path target` (relative) records the base by its absolute path and the SHA-256 of its
    weights; `eval` from another folder loads it, a moved base is named with the way out (--base_model), and a base
    whose weights changed is warned about by file."""
    import hashlib
    import logging
    import shutil

    root = local_model_and_data
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    shutil.copytree(root / "model", work / "target")
    elsewhere.mkdir()
    monkeypatch.chdir(work)
    argv = ["run", "--model_name_or_path", "target", "--lora_r", "4", "--lora_target_modules", "c_attn",
            "--forget_data", str(root / "forget.json"), "--retain_data", str(root / "retain.jsonl"),
            "--output_dir", "out", "--max_steps", "2",
            "--report_to", "none", "--use_cpu", "true", "--evaluate", "false"]  # fmt: skip
    assert main(argv) == 0
    base, out = str(work / "target"), work / "out"
    digest = hashlib.sha256((work / "target" / "model.safetensors").read_bytes()).hexdigest()
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == base
    record = json.loads((out / "unlearn_record.json").read_text())
    assert record["base_model"] == base and record["base_model_weights"] == {"model.safetensors": digest}
    card = (out / "README.md").read_text()
    assert f"the local folder `{base}`" in card and digest in card

    monkeypatch.chdir(elsewhere)
    check = ["eval", "--model_name_or_path", str(out), "--forget_data", str(root / "forget.json"),
             "--max_examples", "3"]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        status = main(check + ["--output_dir", "first"])
    assert status == 0 and "does not hold the weights" not in caplog.text
    measured = json.loads((elsewhere / "first" / "eval.json").read_text())["forget"]

    (work / "target").rename(work / "moved")
    capsys.readouterr()
    status = main(check + ["--output_dir", "missing"])
    assert status == 1  # the recorded base is gone: named, with the way out
    error = capsys.readouterr().err
    assert f"base model {base!r}" in error and "not there any more" in error and "--base_model PATH" in error
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        status = main(check + ["--output_dir", "moved", "--base_model", "../work/moved"])
    assert status == 0 and "does not hold the weights" not in caplog.text
    assert json.loads((elsewhere / "moved" / "eval.json").read_text())["forget"] == measured

    from safetensors.torch import load_file, save_file

    weights = load_file(work / "moved" / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.01
    save_file(weights, work / "moved" / "model.safetensors", metadata={"format": "pt"})
    with caplog.at_level(logging.WARNING):
        status = main(check + ["--output_dir", "changed", "--base_model", "../work/moved"])
    assert status == 0
    assert f"The base model {work / 'moved'} does not hold the weights" in caplog.text
    assert "SHA-256 of model.safetensors differs" in caplog.text


def test_a_bare_peft_adapter_folder_takes_its_base_models_tokenizer(tmp_path, local_model_and_data):
    """PEFT's ``save_pretrained`` writes an adapter without a tokenizer: `eval` (and every command that loads a
    model) takes the base model's tokenizer instead of refusing the folder, and measures what the base measures
    (a fresh LoRA adapter changes nothing)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    root = local_model_and_data
    model = AutoModelForCausalLM.from_pretrained(root / "model")
    get_peft_model(model, LoraConfig(r=4, target_modules=["c_attn"])).save_pretrained(tmp_path / "adapter")
    assert not [name for name in os.listdir(tmp_path / "adapter") if name.startswith("tokenizer")]
    measure = ["eval", "--forget_data", str(root / "forget.json"), "--max_examples", "3"]
    adapter = ["--model_name_or_path", str(tmp_path / "adapter"), "--base_model", str(root / "model")]
    assert main(measure + adapter + ["--output_dir", str(tmp_path / "on-adapter")]) == 0
    base = ["--model_name_or_path", str(root / "model"), "--output_dir", str(tmp_path / "on-base")]
    assert main(measure + base) == 0
    on_adapter, on_base = (
        json.loads((tmp_path / folder / "eval.json").read_text())["forget"] for folder in ("on-adapter", "on-base")
    )
    assert on_adapter == on_base
    # `run` continues from such a folder too (merged into the base named in its adapter_config.json).
    run = ["run", "--model_name_or_path", str(tmp_path / "adapter"), "--forget_data", str(root / "forget.json"),
           "--retain_data", str(root / "retain.jsonl"), "--max_steps", "1", "--report_to", "none", "--use_cpu", "true",
           "--output_dir", str(tmp_path / "run")]  # fmt: skip
    assert main(run) == 0 and (tmp_path / "run" / "tokenizer_config.json").exists()
