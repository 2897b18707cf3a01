"""`hf-unlearn` command line. Each command is one function here, registered with
:func:`~hf_unlearn.cli.commands.command`: it parses its arguments dataclasses and runs its job, and its docstring's
first line is its help (``hf-unlearn --help`` lists them from that registry).

Arguments are parsed with `HfArgumentParser`, so every `UnlearnConfig` field is a flag, and a single YAML file
may hold them all (`hf-unlearn run config.yaml`). The jobs themselves live in :mod:`hf_unlearn.jobs`. A command
imports its dataclasses and its job when it runs: the top-level help imports neither torch nor transformers, and a
command's help is answered from a cache once it was rendered (:mod:`.commands`).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
import sys
import time
from typing import Any

from .commands import COMMANDS, command, help_is_kept, keep_help, kept_help


def get_logger() -> Any:
    """This module's logger, transformers' (imported when something is to be said, not for ``--help``)."""
    from transformers.utils import logging

    return logging.get_logger(__name__)


# The demo's target is a ~1M-parameter model trained from scratch, not a 7B model under LoRA, so it takes a
# larger learning rate than UnlearnConfig's default (1e-4, the MASC paper's LoRA runs); why 3e-4 and not 1e-3:
# docs/studies/calibrated_target.md. The epoch cap is only a budget: MASC stops itself (80 epochs, 400 steps: with
# masc_rival_kl the stop came at steps 135-155 of the demo, docs/studies/masc_landing.md section 4).
DEMO_DEFAULTS = {
    "output_dir": "hf-unlearn-demo",
    "learning_rate": 3e-4,
    "num_train_epochs": 80,
    "report_to": "none",
    "save_strategy": "no",
}

#: The fictitious authors' Min-K% stop, chosen on demo seeds 0-2 of the judge size and held out on seeds 3-5
#: (docs/studies/judge_size.md): it reads every forget answer the verdict reads (320 at the judge size, 20 at the
#: quick one; the calibration side already reads all of its answers) and stops at AUC 0.5 against the calibration
#: authors, the never-seen level, not 0.45: at 0.45 on a 64-answer sample the runs stopped with every forward attack
#: still 0.08-0.11 on the member side.
AUTHORS_STOP = {"calibration_auc_slack": 0.0, "probe_size": 320}


def own_folder_defaults(argv: list[str], defaults: dict[str, Any]) -> dict[str, Any]:
    """``defaults`` with ``overwrite_output_dir=True`` when the command writes to its own default folder (the demo is
    meant to be run again there); a folder the user named is refused while it holds a run, as ``run`` refuses it,
    unless ``--overwrite_output_dir`` says otherwise."""
    named = any(arg.partition("=")[0] == "--output_dir" for arg in expanded_argv(argv))
    return defaults if named else {**defaults, "overwrite_output_dir": True}


class ConfigurationError(ValueError):
    """A flag or YAML key that cannot be read: names the key and what it expected."""


class HelpRequested(Exception):  # noqa: N818 (a request, not an error)
    """``--help`` among a command's flags: ``parser`` formats the command's help."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("help")
        self.parser = parser


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


YAML_SUFFIXES = (".yaml", ".yml")


def expanded_argv(argv: list[str]) -> list[str]:
    """``argv`` with a leading YAML config file (``hf-unlearn run config.yaml --flag ...``) read into flags."""
    return yaml_to_argv(argv[0]) + argv[1:] if argv and argv[0].endswith(YAML_SUFFIXES) else argv


def named_value(argv: list[str], flag: str) -> str | None:
    """The value ``argv`` gives ``flag`` (``--flag value`` or ``--flag=value``), else None."""
    for position, arg in enumerate(argv):
        name, equals, value = arg.partition("=")
        if name == flag:
            return value if equals else (argv[position + 1] if position + 1 < len(argv) else None)
    return None


def hide_unread_options(parser: argparse.ArgumentParser, argv: list[str]) -> None:
    """``--help`` with a method (or a forget loss) whose forget objective is not MASC's: leave MASC's margin and hinge
    options (:data:`~hf_unlearn.objectives.masc.options.MARGIN_OPTIONS`) out of the help, which that run does not
    read."""
    from ..objectives.masc.options import MARGIN_OPTIONS
    from ..objectives.registry import METHODS

    method, forget_loss = named_value(argv, "--method"), named_value(argv, "--forget_loss")
    forget = forget_loss or (METHODS.get(method, (None, None))[0] if method else None)
    if forget is None or forget == "masc":
        return
    for action in parser._actions:
        if action.dest in MARGIN_OPTIONS:
            action.help = argparse.SUPPRESS
    parser.epilog = (
        f"MASC's margin and hinge options ({', '.join(MARGIN_OPTIONS)}) are left out: the forget objective "
        f"{forget!r} does not read them."
    )


def _parse(dataclasses: tuple, argv: list[str], defaults: dict | None = None):
    """Flags, or a YAML file (``hf-unlearn run config.yaml``, optionally followed by flags that override it)."""
    from transformers import HfArgumentParser

    class Parser(HfArgumentParser):
        """HfArgumentParser whose errors are exceptions, so that ``main`` prints one readable message."""

        def error(self, message: str):
            raise ConfigurationError(message)

    parser = Parser(dataclasses)
    if defaults:
        parser.set_defaults(**defaults)
    source = "command line"
    if argv and argv[0].endswith(YAML_SUFFIXES):
        source = argv[0]
    argv = expanded_argv(argv)
    if "-h" in argv or "--help" in argv:
        hide_unread_options(parser, argv)
        raise HelpRequested(parser)
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


def demo_defaults(argv: list[str]) -> dict[str, Any]:
    """The demo's own defaults for ``argv``: :data:`DEMO_DEFAULTS` and MASC in our calibrated mode, against the
    benchmark's calibration authors (the Min-K% stop, or the calibration gap for the chronicles' eight texts a side,
    too few to read an AUC within 0.1), on the fictitious authors with :data:`AUTHORS_STOP`; ``--masc_threshold rho
    --stop_target alpha`` is the paper's mode."""
    from ..objectives.masc.options import CALIBRATED_MODE

    given = expanded_argv(argv)
    chronicles = named_value(given, "--benchmark") == "chronicles"
    calibrated = {**CALIBRATED_MODE, **({"stop_target": "calibration"} if chronicles else {})}
    if not chronicles and (named_value(given, "--stop_target") or calibrated["stop_target"]) == "membership":
        calibrated.update(AUTHORS_STOP)
    return own_folder_defaults(argv, {**DEMO_DEFAULTS, **calibrated})


def sequence_defaults(argv: list[str]) -> dict[str, Any]:
    """``hf-unlearn sequence``'s own defaults for ``argv``. On the embedded benchmark: the demo's learning rate and
    our calibrated mode with the calibration gap (a request is one author, ten answers: too few to read the Min-K%
    stop's AUC within 0.1), and no epoch count: ten examples are 3 steps an epoch, so the demo's 80 epochs would be a
    budget of 160-240 steps, which a freshly learned target's first request used up at calibration gap 0.633 (slack
    0.5); a request gets the step budget of any run that stops itself (self_stop_max_steps). A model of the user's
    keeps UnlearnConfig's."""
    from ..objectives.masc.options import CALIBRATED_MODE

    embedded = not any(arg.partition("=")[0] == "--model_name_or_path" for arg in expanded_argv(argv))
    defaults = {key: value for key, value in DEMO_DEFAULTS.items() if key != "num_train_epochs"}
    defaults.update(CALIBRATED_MODE, output_dir="hf-unlearn-sequence", stop_target="calibration")
    if not embedded:
        defaults = {key: defaults[key] for key in ("output_dir", "report_to", "save_strategy")}
    return own_folder_defaults(argv, defaults)


@command("demo")
def demo_main(argv: list[str]) -> Any:
    """Learn the embedded benchmark, unlearn its forget split with MASC, print and write the report."""
    from ..training.config import UnlearnConfig
    from .arguments import DemoArguments

    demo_args, config = _parse((DemoArguments, UnlearnConfig), argv, defaults=demo_defaults(argv))
    from ..jobs.demo import run_demo

    return run_demo(demo_args, config)


@command("run")
def run_main(argv: list[str]) -> Any:
    """Unlearn a forget dataset from a model given by path or Hub id."""
    from ..training.config import UnlearnConfig
    from .arguments import RunArguments

    run_args, config = _parse((RunArguments, UnlearnConfig), argv)
    from ..jobs.unlearn import run_unlearning_job

    return run_unlearning_job(run_args, config)


@command("sequence")
def sequence_main(argv: list[str]) -> Any:
    """Unlearn several forget requests one after another, re-measuring every earlier one after each."""
    from ..training.config import UnlearnConfig
    from .arguments import SequenceArguments

    sequence_args, config = _parse((SequenceArguments, UnlearnConfig), argv, defaults=sequence_defaults(argv))
    from ..jobs.sequence import run_sequence_job

    return run_sequence_job(sequence_args, config)


@command("quant-check")
def quant_check_main(argv: list[str]) -> dict:
    """Reload a model in 4-bit and 8-bit and measure whether forgotten knowledge came back."""
    from .arguments import QuantCheckArguments

    (cli,) = _parse((QuantCheckArguments,), argv)
    from ..jobs.checks import run_quant_check_job

    return run_quant_check_job(cli)


@command("relearn-check")
def relearn_check_main(argv: list[str]) -> dict:
    """Fine-tune a copy of an unlearned model on part of its forget set and measure whether the rest comes back."""
    from .arguments import RelearnCheckArguments

    (cli,) = _parse((RelearnCheckArguments,), argv)
    from ..jobs.checks import run_relearn_check_job

    return run_relearn_check_job(cli)


@command("audit")
def audit_main(argv: list[str]) -> dict:
    """Quantization, relearning and membership checks in one report, and a Robustness section in the model card."""
    from .arguments import AuditArguments

    (cli,) = _parse((AuditArguments,), argv)
    from ..jobs.checks import run_audit_job

    return run_audit_job(cli)


@command("distill")
def distill_main(argv: list[str]) -> dict:
    """Distil an unlearned model into a noised copy of itself on the retain data (UNDO), saved in a new folder."""
    from ..jobs.distill import run_distill_job
    from .arguments import DistillArguments

    (cli,) = _parse((DistillArguments,), argv)
    return run_distill_job(cli)


@command("push")
def push_main(argv: list[str]) -> str:
    """Push an unlearned model and its model card to the Hub."""
    from ..outputs.hub import push_folder
    from .arguments import PushArguments

    (cli,) = _parse((PushArguments,), argv)
    if not cli.repo_id:
        raise ValueError("hf-unlearn push: name the Hub repository to push to, --repo_id you/model-unlearned.")
    url = push_folder(
        cli.require_model("push"), cli.repo_id, cli.merge_adapter, cli.private, cli.base_model_id, cli.push_unverified
    )
    print(f"Pushed to {url}")
    return url


@command("eval")
def eval_main(argv: list[str]) -> dict:
    """TOFU- and MUSE-style evaluation: eval.json, eval.md, a radar chart and truth-ratio histograms."""
    from .arguments import EvalArguments

    (cli,) = _parse((EvalArguments,), argv)
    from ..jobs.checks import run_eval_job

    return run_eval_job(cli)


@command("compare")
def compare_main(argv: list[str]) -> dict:
    """Every method on the embedded benchmark or TOFU, side by side (see hf_unlearn.jobs.compare)."""
    from .arguments import CompareArguments

    (compare_args,) = _parse((CompareArguments,), argv)
    from ..jobs.compare_setups import run_compare

    return run_compare(compare_args)


def help_parsers() -> dict[str, argparse.ArgumentParser]:
    """The parser each command's ``--help`` formats, by command: each command run with ``--help`` alone, which imports
    its dataclasses and stops at :class:`HelpRequested`, before its job. A command whose help cannot be formatted is
    left out (its own ``--help`` then says why)."""
    parsers = {}
    for name, entry in COMMANDS.items():
        try:
            entry.run(["--help"])
        except HelpRequested as request:
            request.parser.prog = f"hf-unlearn {name}"
            parsers[name] = request.parser
        except Exception as error:  # noqa: BLE001 (the other commands' help is still kept)
            get_logger().info(f"hf-unlearn {name} --help cannot be formatted: {error}")
    return parsers


#: Errors a user can fix from the message alone; anything else is a bug and keeps its traceback.
USER_ERRORS = (ValueError, TypeError, FileNotFoundError, FileExistsError, PermissionError, RuntimeError, OSError)
TRACEBACK_VARIABLE = "HF_UNLEARN_TRACEBACK"


def quiet_third_party() -> None:
    """No output a user cannot act on: bitsandbytes' CPU backend warnings (its note at import about an optional CPU
    kernel package is dropped earlier, by :mod:`hf_unlearn.third_party`), DeepSpeed's note that
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
        get_logger().info("No GPU, so DS_ACCELERATOR=cpu for DeepSpeed (accelerate imports it when it is installed).")

    python_logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(python_logging.ERROR)
    python_logging.getLogger("bitsandbytes.cextension").setLevel(python_logging.ERROR)
    from datasets.utils.logging import disable_progress_bar
    from transformers.utils import logging

    disable_progress_bar()
    # transformers' bars for loading and writing weight shards (the run's bar, and Trainer's, are tqdm's own).
    logging.disable_progress_bar()


def main(argv: list[str] | None = None) -> int:
    """``hf-unlearn COMMAND ...``. Exit status: 0 done, 1 an input or setting is wrong (one message, no traceback
    unless --traceback or HF_UNLEARN_TRACEBACK=1), 2 bad command line, 3 the run failed its own checks."""
    argv = list(sys.argv[1:] if argv is None else argv)
    top = argparse.ArgumentParser(
        prog="hf-unlearn",
        description="Make a language model forget specific training data.\n\ncommands:\n"
        + "\n".join(f"  {name:<15}{entry.help}" for name, entry in COMMANDS.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `hf-unlearn COMMAND --help` for a command's options (every UnlearnConfig field is a flag). "
        f"Errors print one message; --traceback (or {TRACEBACK_VARIABLE}=1) shows where they came from.",
    )
    top.add_argument("--traceback", action="store_true", help="Show the full traceback of an error.")
    top.add_argument("command", choices=list(COMMANDS), help="one of the commands above")
    show_traceback = os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")
    if argv and argv[0] == "--traceback":
        show_traceback, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        top.print_help()
        return 0 if argv else 2
    command = top.parse_args(argv[:1]).command
    asks_help = argv[1:] in (["-h"], ["--help"])  # the plain help: formatted from kept options
    if asks_help and (text := kept_help(command)) is not None:
        print(text, end="")
        return 0
    quiet_third_party()
    if not help_is_kept():
        # Every command's help needs what this command imports anyway (torch, transformers): keep them all, once
        # per source and versions, so that no later `--help` has to import them.
        keep_help(help_parsers())
    finished = False
    try:
        result = COMMANDS[command].run(argv[1:])
        finished = True
    except HelpRequested as request:
        request.parser.prog = f"hf-unlearn {command}"
        print(request.parser.format_help(), end="")
        return 0
    except USER_ERRORS as error:
        if show_traceback:
            raise
        print(f"hf-unlearn {command}: error: {error}", file=sys.stderr)
        print(f"(--traceback or {TRACEBACK_VARIABLE}=1 shows where it came from)", file=sys.stderr)
        return 1
    finally:
        end_process_group(finished)
    record = getattr(result, "record", None)
    if record is not None and not record.success:
        print(f"hf-unlearn {command}: the run failed ({record.stop_reason}).", file=sys.stderr)
        return 3
    return 0


def end_process_group(finished: bool) -> None:
    """Tear down the process group a launched command (torchrun, ``accelerate launch``) started, before the
    interpreter exits: left up, a backend thread can abort the process at exit after its work is done, and the
    launcher then reports the whole run as failed. torch is only looked at if the command imported it.

    Seen with DeepSpeed ZeRO-3 over gloo on CPU ("terminate called without an active exception", exit status -6, on 4
    of 20 launches with the cores busy). A core dump of the aborted rank showed the cause: ZeRO-3 prefetches parameters
    with all-gathers nobody waits for; one still queued when the command returned was finished by a gloo thread
    during the interpreter's finalisation, and that thread, releasing the work's Python tensors, needed the GIL and
    was ended mid-destructor (``ProcessGroupGloo::runLoop`` -> ``~AsyncAllgatherWork`` -> ``take_gil`` ->
    ``pthread_exit`` -> ``std::terminate``). So a command that ``finished`` first waits at a barrier, which completes
    only after every collective queued before it, then releases the GIL for a moment so the backend's threads can
    drop the works they ran. After an error there is no barrier: the other processes may never reach it."""
    torch = sys.modules.get("torch")
    if torch is None or not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    if finished:
        torch.distributed.barrier()
        time.sleep(0.1)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
