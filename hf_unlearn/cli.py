"""`hf-unlearn` command line: `demo`, `run`, `sequence`, `compare`, `eval`, `quant-check`, `relearn-check`, `audit`
and `push`.

Arguments are parsed with `HfArgumentParser`, so every `UnlearnConfig` field is a flag, and a single YAML file
may hold them all (`hf-unlearn run config.yaml`). The jobs themselves live in :mod:`hf_unlearn.jobs`.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from transformers import HfArgumentParser
from transformers.utils import logging

from .config import UnlearnConfig

logger = logging.get_logger(__name__)

PROMPT_TEMPLATE_HELP = (
    "The format the model was fine-tuned in: default the tokenizer's chat template if it has one, else "
    "'Question: {question}\\nAnswer: {answer}'; 'chat', 'plain', or your own format string with {question} and "
    "{answer}, e.g. '### Q: {question}\\n### A: {answer}'."
)
COMMANDS = ("demo", "run", "sequence", "compare", "quant-check", "relearn-check", "audit", "push", "eval")

# The demo's target is a ~1M-parameter model trained from scratch, not a 7B model under LoRA, so it takes a
# larger learning rate than UnlearnConfig's default (1e-4, the MASC paper's LoRA runs). With the calibrated target
# (the benchmark's never-learned calibration authors) lr 3e-4 stops at step ~50 with retain ROUGE-L 0.97x; at 1e-3
# the calibration gap falls from 2.4 to 0.3 logits between two probes and the run overshoots (retain 0.91x,
# membership AUC 0.33 where never-seen data sits at 0.55). The epoch cap is only a budget: MASC stops itself.
DEMO_DEFAULTS = {
    "output_dir": "hf-unlearn-demo",
    "learning_rate": 3e-4,
    "num_train_epochs": 40,
    "report_to": "none",
    "save_strategy": "no",
    # The demo is meant to be run again; its own folder holds nothing else.
    "overwrite_output_dir": True,
}


@dataclass
class DemoArguments:
    """Options of `hf-unlearn demo` besides the `UnlearnConfig` fields."""

    benchmark: str = field(
        default="fictitious_authors",
        metadata={
            "help": "Embedded benchmark: fictitious_authors (TOFU-shaped QA) or chronicles (MUSE-shaped passages "
            "of fictitious towns whose facts recur across passages; unlearns the forget towns' passages)."
        },
    )
    split: str = field(default="forget10", metadata={"help": "Forget split of the fictitious authors."})
    architecture: str = field(default="llama", metadata={"help": "Tiny target model: llama, qwen2 or gpt2."})
    cache_dir: str | None = field(
        default=None, metadata={"help": "Where the learned target model is cached (default ~/.cache/hf_unlearn)."}
    )
    audit: bool = field(
        default=False,
        metadata={
            "help": "After unlearning, run the robustness audit (NF4 reload, relearning attack, membership attacks "
            "against the benchmark's holdout authors) and add it to the report and card."
        },
    )
    calibrate: bool = field(
        default=True,
        metadata={
            "help": "Give the trainer the benchmark's calibration authors (never learned), so that stop_target='auto' "
            "stops where the forget set looks as unfamiliar as they do. false: the fixed stop_alpha."
        },
    )


@dataclass
class RunArguments:
    """Options of `hf-unlearn run` besides the `UnlearnConfig` fields."""

    model_name_or_path: str = field(metadata={"help": "Model to unlearn: a local folder or a Hub id."})
    dataset_name: str = field(
        metadata={"help": "Dataset: a Hub id (e.g. locuslab/TOFU), a folder saved with save_to_disk, or a JSON file."}
    )
    forget_subset: str | None = field(
        default=None, metadata={"help": "Config name of the forget data (e.g. forget10)."}
    )
    retain_subset: str | None = field(
        default=None, metadata={"help": "Config name of the retain data (e.g. retain90)."}
    )
    forget_split: str = field(default="train", metadata={"help": "Split holding the forget examples."})
    retain_split: str | None = field(
        default=None, metadata={"help": "Split holding the retain examples (default: same split name as forget)."}
    )
    retain_dataset_name: str | None = field(
        default=None, metadata={"help": "Retain data from another dataset (default: dataset_name)."}
    )
    calibration_dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "Never-trained examples of the same kind as the forget set (e.g. TOFU's holdout10 with "
            "--calibration_subset): the stopping rule's calibrated target. Default: dataset_name when "
            "--calibration_subset is given."
        },
    )
    calibration_subset: str | None = field(
        default=None, metadata={"help": "Config name of the calibration data (e.g. TOFU's holdout10)."}
    )
    calibration_split: str | None = field(
        default=None, metadata={"help": "Split holding the calibration examples (default: same as forget)."}
    )
    question_column: str = field(default="question", metadata={"help": "Column holding the prompt/question."})
    answer_column: str = field(default="answer", metadata={"help": "Column holding the answer to forget or keep."})
    prompt_template: str | None = field(default=None, metadata={"help": PROMPT_TEMPLATE_HELP})
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Tokenizer folder or Hub id, when it is not saved with the model."}
    )
    max_length: int | None = field(default=None, metadata={"help": "Reject examples longer than this many tokens."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow custom model code from the Hub. Off unless you trust the source."}
    )
    load_in_4bit: bool = field(
        default=False, metadata={"help": "Load the base model in NF4 (bitsandbytes) for QLoRA; pair with LoRA."}
    )
    lora_r: int = field(default=0, metadata={"help": "Train LoRA adapters of this rank (0: full fine-tuning)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], metadata={"help": "Modules LoRA adapts."}
    )
    torch_dtype: str = field(
        default="auto", metadata={"help": "dtype to load the model in (auto, float32, bfloat16)."}
    )
    evaluate: bool = field(default=True, metadata={"help": "Measure forget/retain metrics before and after."})
    audit: bool = field(
        default=False,
        metadata={
            "help": "After unlearning, run the robustness audit (NF4 reload, relearning attack, and with "
            "--audit_holdout_data the membership attacks) and add it to the report, record and card."
        },
    )
    audit_holdout_data: str | None = field(
        default=None,
        metadata={"help": "Audit: examples of the same kind never trained on (file or Hub id), for membership."},
    )
    audit_reference_model: str | None = field(
        default=None,
        metadata={"help": "Audit: a model trained without the forget set (PrivLeak, the relearning baseline)."},
    )


class _Parser(HfArgumentParser):
    """HfArgumentParser whose errors are exceptions, so that ``main`` prints one readable message."""

    def error(self, message: str):
        raise ConfigurationError(message)


class ConfigurationError(ValueError):
    """A flag or YAML key that cannot be read: names the key and what it expected."""


def yaml_to_argv(path: str) -> list[str]:
    """A YAML config file as command-line flags, so that every value goes through the same type conversion and
    checks as a flag (YAML reads ``1e-3`` as text; ``--learning_rate 1e-3`` is a float)."""
    import yaml

    if not os.path.isfile(path):
        raise FileNotFoundError(f"Config file {path!r} does not exist.")
    with open(path) as f:
        try:
            values = yaml.safe_load(f)
        except yaml.YAMLError as error:
            raise ConfigurationError(f"{path} is not valid YAML: {error}") from error
    if values is None:
        return []
    if not isinstance(values, dict):
        raise ConfigurationError(f"{path} must map option names to values, e.g. 'learning_rate: 1e-4'.")
    argv: list[str] = []
    for key, value in values.items():
        if value is None:
            continue
        argv.append(f"--{key}")
        if isinstance(value, list):
            argv += [json.dumps(v) if isinstance(v, dict) else str(v) for v in value]
        elif isinstance(value, dict):
            argv.append(json.dumps(value))
        else:
            argv.append(str(value))
    return argv


def _parse(dataclasses: tuple, argv: list[str], defaults: dict | None = None):
    """Flags, or a YAML file (``hf-unlearn run config.yaml``, optionally followed by flags that override it)."""
    parser = _Parser(dataclasses)
    if defaults:
        parser.set_defaults(**defaults)
    source = "command line"
    if argv and argv[0].endswith((".yaml", ".yml")):
        source = argv[0]
        argv = yaml_to_argv(argv[0]) + argv[1:]
    try:
        return parser.parse_args_into_dataclasses(args=argv)
    except ValueError as error:
        message = str(error)
        if not isinstance(error, ConfigurationError):
            if not message.startswith("Some specified arguments are not used"):
                raise
            unused = [word[2:] for word in ast.literal_eval(message.split(":", 1)[1].strip()) if word.startswith("--")]
            message = f"unknown option(s): {', '.join(unused)}; `hf-unlearn COMMAND --help` lists them"
        if source != "command line":
            message = re.sub(r"argument --(\w+)(/--[\w-]+)?", r"key \1", message).replace("option(s)", "key(s)")
        raise ConfigurationError(f"{source}: {message}") from None


def demo_main(argv: list[str]) -> Any:
    """Learn the embedded benchmark, unlearn its forget split with MASC, print and write the report."""
    demo_args, config = _parse(
        (DemoArguments, UnlearnConfig),
        argv,
        defaults=DEMO_DEFAULTS,
    )
    from .jobs import run_demo

    return run_demo(demo_args, config)


def run_main(argv: list[str]) -> Any:
    """Unlearn a forget dataset from a model given by path or Hub id."""
    run_args, config = _parse((RunArguments, UnlearnConfig), argv)
    from .jobs import run_unlearning_job

    return run_unlearning_job(run_args, config)


@dataclass
class SequenceArguments:
    """Options of `hf-unlearn sequence` besides the `UnlearnConfig` fields."""

    model: str | None = field(
        default=None,
        metadata={"help": "The model (folder or Hub id). Default: the embedded benchmark's target model."},
    )
    requests: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Forget sets in the order the requests arrive, one file (JSON/JSONL/CSV/Parquet) or dataset each, "
            "named by their file name. Default (embedded): one request per author of --split, the first "
            "--num_requests authors."
        },
    )
    retain_data: str | None = field(
        default=None, metadata={"help": "Retain set (same forms). Default (embedded): the matching retain split."}
    )
    calibration_data: str | None = field(
        default=None,
        metadata={"help": "Never-trained examples of the same kind (the calibrated stop). Default (embedded): yes."},
    )
    question_column: str = field(default="question", metadata={"help": "Question column of your own data."})
    answer_column: str = field(default="answer", metadata={"help": "Answer column of your own data."})
    prompt_template: str | None = field(default=None, metadata={"help": PROMPT_TEMPLATE_HELP})
    lora_r: int = field(default=0, metadata={"help": "One LoRA adapter of this rank per request, merged (0: full)."})
    lora_target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], metadata={"help": "Modules LoRA adapts."}
    )
    max_eval_examples: int = field(
        default=100, metadata={"help": "Measure at most this many examples of each set after every request."}
    )
    split: str = field(default="forget10", metadata={"help": "Embedded: the split whose authors are the requests."})
    num_requests: int = field(default=3, metadata={"help": "Embedded: how many of its authors, one request each."})
    architecture: str = field(default="llama", metadata={"help": "Embedded: tiny target model (llama, qwen2, gpt2)."})
    cache_dir: str | None = field(default=None, metadata={"help": "Embedded: where the target model is cached."})


def sequence_main(argv: list[str]) -> Any:
    """Unlearn several forget requests one after another, re-measuring every earlier one after each."""
    expanded = yaml_to_argv(argv[0]) + argv[1:] if argv and argv[0].endswith((".yaml", ".yml")) else argv
    embedded = not any(arg == "--model" or arg.startswith("--model=") for arg in expanded)
    # The demo's learning rate suits the embedded tiny model only; a model of the user's keeps UnlearnConfig's.
    defaults = dict(DEMO_DEFAULTS, output_dir="hf-unlearn-sequence")
    if not embedded:
        defaults = {key: defaults[key] for key in ("output_dir", "report_to", "save_strategy")}
    sequence_args, config = _parse((SequenceArguments, UnlearnConfig), argv, defaults=defaults)
    from .jobs import run_sequence_job

    return run_sequence_job(sequence_args, config)


@dataclass
class ModelAndDataArguments:
    """What `eval` and `quant-check` share: the model, and the user's own question/answer data."""

    model: str = field(metadata={"help": "The model: a local folder (or Hub id) with its tokenizer."})
    forget_data: str | None = field(
        default=None,
        metadata={
            "help": "Your own forget set (JSON/JSONL/CSV/Parquet file, save_to_disk folder or Hub id) with "
            "question/answer columns: used instead of a benchmark."
        },
    )
    retain_data: str | None = field(default=None, metadata={"help": "Your own retain set (same forms)."})
    question_column: str = field(default="question", metadata={"help": "Question column of your own data."})
    answer_column: str = field(default="answer", metadata={"help": "Answer column of your own data."})
    prompt_template: str | None = field(
        default=None, metadata={"help": "Default: the one the run recorded, else as in `run`. " + PROMPT_TEMPLATE_HELP}
    )


@dataclass
class QuantCheckArguments(ModelAndDataArguments):
    """Options of `hf-unlearn quant-check`."""

    benchmark: str | None = field(
        default=None,
        metadata={
            "help": "'embedded', or a dataset path/Hub id with --split/--retain_split subsets. Default: the "
            "benchmark the model's run record names; without one, give --forget_data."
        },
    )
    split: str = field(default="forget10", metadata={"help": "Forget split (embedded) or subset (dataset)."})
    retain_split: str | None = field(default=None, metadata={"help": "Retain split/subset (default: the matching)."})
    modes: list[str] = field(default_factory=lambda: ["nf4", "fp4", "int8"], metadata={"help": "Quantizations."})
    output_dir: str = field(default=".", metadata={"help": "Where quant_check.json goes."})


def quant_check_main(argv: list[str]) -> dict:
    """Reload a model in 4-bit and 8-bit and measure whether forgotten knowledge came back."""
    from .jobs import run_quant_check_job

    (cli,) = _parse((QuantCheckArguments,), argv)
    return run_quant_check_job(cli)


@dataclass
class RelearnCheckArguments(ModelAndDataArguments):
    """Options of `hf-unlearn relearn-check`."""

    relearn_data: str | None = field(
        default=None,
        metadata={
            "help": "Text to relearn on (question/answer file); default: a part of the forget set (relearn_fraction), "
            "the rest being measured."
        },
    )
    reference_model: str | None = field(
        default=None,
        metadata={
            "help": "A model trained without the forget set: relearned the same way, it shows what the relearning "
            "data teaches on its own (embedded benchmark: its retain-only model)."
        },
    )
    target_model: str | None = field(
        default=None, metadata={"help": "The model before unlearning, for scale (embedded benchmark: its target)."}
    )
    steps: int = field(default=20, metadata={"help": "Fine-tuning steps of the attack."})
    learning_rate: float = field(default=1e-4, metadata={"help": "AdamW learning rate of the attack."})
    relearn_fraction: float = field(default=0.5, metadata={"help": "Share of the forget set relearned on."})
    batch_size: int = field(default=4, metadata={"help": "Examples per attack step."})
    measure_every: int = field(default=5, metadata={"help": "Measure the rest of the forget set every N steps."})
    seed: int = field(default=0, metadata={"help": "Seed of the split and the batch order."})
    benchmark: str | None = field(
        default=None, metadata={"help": "As in quant-check: 'embedded' or a dataset path/Hub id."}
    )
    split: str = field(default="forget10", metadata={"help": "Forget split (embedded) or subset (dataset)."})
    retain_split: str | None = field(default=None, metadata={"help": "Unused by the attack; accepted for symmetry."})
    output_dir: str = field(default=".", metadata={"help": "Where relearn_check.json goes."})


def relearn_check_main(argv: list[str]) -> dict:
    """Fine-tune a copy of an unlearned model on part of its forget set and measure whether the rest comes back."""
    from .jobs import run_relearn_check_job

    (cli,) = _parse((RelearnCheckArguments,), argv)
    return run_relearn_check_job(cli)


@dataclass
class AuditArguments(ModelAndDataArguments):
    """Options of `hf-unlearn audit`."""

    holdout_data: str | None = field(
        default=None,
        metadata={"help": "Examples of the same kind never trained on, for the membership attacks (own data)."},
    )
    reference_model: str | None = field(
        default=None,
        metadata={
            "help": "A model trained without the forget set: PrivLeak, the Reference attack and the relearning "
            "baseline (embedded benchmark: its retain-only model)."
        },
    )
    target_model: str | None = field(
        default=None, metadata={"help": "The model before unlearning, for scale (embedded benchmark: its target)."}
    )
    modes: list[str] = field(default_factory=lambda: ["nf4"], metadata={"help": "Quantizations to check."})
    relearn_steps: int = field(default=20, metadata={"help": "Fine-tuning steps of the relearning attack."})
    relearn_learning_rate: float = field(default=1e-4, metadata={"help": "Learning rate of the relearning attack."})
    benchmark: str | None = field(
        default=None, metadata={"help": "As in quant-check: 'embedded' or a dataset path/Hub id."}
    )
    split: str = field(default="forget10", metadata={"help": "Forget split (embedded) or subset (dataset)."})
    retain_split: str | None = field(default=None, metadata={"help": "Retain split/subset (default: the matching)."})
    output_dir: str = field(default=".", metadata={"help": "Where audit.json and audit.md go."})


def audit_main(argv: list[str]) -> dict:
    """Quantization, relearning and membership checks in one report, and a Robustness section in the model card."""
    from .jobs import run_audit_job

    (cli,) = _parse((AuditArguments,), argv)
    return run_audit_job(cli)


@dataclass
class PushArguments:
    """Options of `hf-unlearn push`."""

    model_dir: str = field(metadata={"help": "Output folder of an unlearning run (model or adapter + README.md)."})
    repo_id: str = field(metadata={"help": "Hub repository to push to, e.g. you/model-unlearned."})
    merge_adapter: bool = field(default=False, metadata={"help": "Merge a LoRA adapter into its base before pushing."})
    private: bool | None = field(default=None, metadata={"help": "Create the repository as private."})


def push_main(argv: list[str]) -> str:
    """Push an unlearned model and its model card to the Hub."""
    from .hub import push_folder

    (cli,) = _parse((PushArguments,), argv)
    url = push_folder(cli.model_dir, cli.repo_id, cli.merge_adapter, cli.private)
    print(f"Pushed to {url}")
    return url


@dataclass
class EvalArguments(ModelAndDataArguments):
    """Options of `hf-unlearn eval`."""

    holdout_data: str | None = field(
        default=None,
        metadata={
            "help": "Examples of the same kind the model never trained on: the membership attack (and PrivLeak "
            "with a reference) compares the forget set with them."
        },
    )
    benchmark: str | None = field(
        default=None,
        metadata={
            "help": "embedded (the fictitious authors, TOFU and MUSE metrics), tofu (locuslab/TOFU), muse_news "
            "(muse-bench/MUSE-News) or muse_books (muse-bench/MUSE-Books). Default: the benchmark the model's run "
            "record names; without one, give --forget_data or --benchmark."
        },
    )
    split: str = field(default="forget10", metadata={"help": "Forget split (embedded, tofu): forget01/05/10."})
    dataset_path: str | None = field(
        default=None, metadata={"help": "A local copy of the benchmark's Hub repository, instead of the Hub id."}
    )
    reference_eval: str | None = field(
        default=None,
        metadata={
            "help": "eval.json of the model trained without the forget set (retain-only / retrained), for forget "
            "quality and PrivLeak. On the embedded benchmark it is learned automatically."
        },
    )
    reference_model: str | None = field(
        default=None,
        metadata={
            "help": "The model trained without the forget set, as a folder or Hub id: evaluated first (its eval is "
            "written to reference_eval.json) and used like --reference_eval."
        },
    )
    compare_with: list[str] = field(
        default_factory=list, metadata={"help": "Other eval.json files to draw on the radar chart (NAME=PATH)."}
    )
    max_examples: int | None = field(default=None, metadata={"help": "Keep the first N examples of each set."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the model's own code (off by default)."})
    output_dir: str = field(default=".", metadata={"help": "Where eval.json, eval.md and the PNGs go."})


def eval_main(argv: list[str]) -> dict:
    """TOFU- and MUSE-style evaluation: eval.json, eval.md, a radar chart and truth-ratio histograms."""
    from .jobs import run_eval_job

    (cli,) = _parse((EvalArguments,), argv)
    return run_eval_job(cli)


def compare_main(argv: list[str]) -> dict:
    """Every method on the embedded benchmark, side by side (see hf_unlearn.compare)."""
    from .compare import CompareArguments, run_compare

    (compare_args,) = _parse((CompareArguments,), argv)
    return run_compare(compare_args)


#: Errors a user can fix from the message alone; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, PermissionError, RuntimeError, OSError)
TRACEBACK_VARIABLE = "HF_UNLEARN_TRACEBACK"


def quiet_third_party() -> None:
    """No output a user cannot act on: bitsandbytes' note about an optional CPU kernel package, DeepSpeed's note that
    it found no GPU, and the per-call progress bars of datasets and of transformers' weight loading and saving (the
    run has one bar).

    DeepSpeed is imported by accelerate, not by this package, whenever it is installed (accelerate's
    ``extract_model_from_parallel``, which Trainer calls while it is built, does ``from deepspeed import
    DeepSpeedEngine``); on a machine without a GPU DeepSpeed then warns "Setting accelerator to CPU".
    ``DS_ACCELERATOR=cpu`` (unless set already) is the choice its detection makes there anyway, made explicit,
    which it does not warn about."""
    import logging as python_logging

    import torch

    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"
        logger.info("No GPU, so DS_ACCELERATOR=cpu for DeepSpeed (accelerate imports it when it is installed).")

    python_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(python_logging.ERROR)
    python_logging.getLogger("bitsandbytes.cextension").setLevel(python_logging.ERROR)
    from datasets.utils.logging import disable_progress_bar

    disable_progress_bar()
    # transformers' bars for loading and writing weight shards (the run's bar, and Trainer's, are tqdm's own).
    logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    """``hf-unlearn COMMAND ...``. Exit status: 0 done, 1 an input or setting is wrong (one message, no traceback
    unless --traceback or HF_UNLEARN_TRACEBACK=1), 2 bad command line, 3 the run failed its own checks."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(
        prog="hf-unlearn",
        description="Make a language model forget specific training data.",
        epilog="Run `hf-unlearn COMMAND --help` for a command's options (every UnlearnConfig field is a flag). "
        f"Errors print one message; --traceback (or {TRACEBACK_VARIABLE}=1) shows where they came from.",
    )
    top.add_argument("--traceback", action="store_true", help="Show the full traceback of an error.")
    top.add_argument("command", choices=COMMANDS)
    show_traceback = os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")
    if argv and argv[0] == "--traceback":
        show_traceback, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0 if argv else 2
    command = top.parse_args(argv[:1]).command
    commands = {
        "demo": demo_main,
        "run": run_main,
        "sequence": sequence_main,
        "compare": compare_main,
        "quant-check": quant_check_main,
        "relearn-check": relearn_check_main,
        "audit": audit_main,
        "push": push_main,
        "eval": eval_main,
    }
    quiet_third_party()
    try:
        result = commands[command](argv[1:])
    except USER_ERRORS as error:
        if show_traceback:
            raise
        print(f"hf-unlearn {command}: error: {error}", file=sys.stderr)
        print(f"(--traceback or {TRACEBACK_VARIABLE}=1 shows where it came from)", file=sys.stderr)
        return 1
    record = getattr(result, "record", None)
    if record is not None and not record.success:
        print(f"hf-unlearn {command}: the run failed ({record.stop_reason}).", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
