"""`hf-unlearn --help` and `hf-unlearn COMMAND --help` answer without importing torch: the commands are declared
once (hf_unlearn.cli.commands), and the options of every command's help, which lists TrainingArguments' flags, are
kept whenever they were imported, and formatted from there at any terminal width."""

import argparse
import json
import os
import subprocess
import sys

import pytest

from hf_unlearn.cli import commands
from hf_unlearn.cli.main import help_parsers, main

HEAVY = ("torch", "transformers", "peft", "datasets")
PROBE = (
    "import sys\nfrom hf_unlearn.cli.main import main\ncode = main(sys.argv[1:])\n"
    "print('HEAVY', sorted(m for m in {heavy!r} if m in sys.modules))\nsys.exit(code)\n"
)


def hf_unlearn(args, cache, columns=100):
    env = dict(os.environ, HF_UNLEARN_CACHE=str(cache), COLUMNS=str(columns), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    script = PROBE.format(heavy=HEAVY)
    return subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, env=env, timeout=300)


def test_the_top_level_help_lists_every_command_once_and_imports_no_library(tmp_path):
    result = hf_unlearn(["--help"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "HEAVY []" in result.stdout
    for name, entry in commands.COMMANDS.items():
        assert entry.help and f"  {name:<15}{entry.help}" in result.stdout
    assert len(commands.COMMANDS) >= 9 and "compare" in commands.COMMANDS


def test_a_commands_help_is_rendered_once_then_every_help_is_answered_without_torch(tmp_path):
    first = hf_unlearn(["push", "--help"], tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("usage: hf-unlearn push [-h]") and "--repo_id" in first.stdout
    assert "'torch'" in first.stdout.rsplit("HEAVY", 1)[1]  # rendering it needed the dataclasses
    second = hf_unlearn(["push", "--help"], tmp_path)
    assert second.returncode == 0 and "HEAVY []" in second.stdout
    assert second.stdout.rsplit("HEAVY", 1)[0] == first.stdout.rsplit("HEAVY", 1)[0]
    # Another command, in a narrower terminal: kept too, and the text HfArgumentParser formats at that width.
    kept = hf_unlearn(["run", "--help"], tmp_path, columns=70)
    assert kept.returncode == 0 and "HEAVY []" in kept.stdout and "--forget_loss_kwargs" in kept.stdout
    # A flag next to --help is not the plain help: rendered for real.
    rendered = hf_unlearn(["run", "--output_dir", "x", "--help"], tmp_path, columns=70)
    assert rendered.returncode == 0 and "'torch'" in rendered.stdout.rsplit("HEAVY", 1)[1]
    assert kept.stdout.rsplit("HEAVY", 1)[0] == rendered.stdout.rsplit("HEAVY", 1)[0]
    assert len(os.listdir(tmp_path / "help")) == 1


def test_the_kept_options_format_what_hf_argument_parser_formats_for_every_command(monkeypatch):
    """Every command answers --help before its job, and its kept options (through JSON, as they are kept) format the
    same text as its HfArgumentParser at every terminal width."""
    parsers = help_parsers()
    assert set(parsers) == set(commands.COMMANDS)
    for columns in (60, 100, 200):
        monkeypatch.setenv("COLUMNS", str(columns))
        for name, parser in parsers.items():
            kept = json.loads(json.dumps(commands.help_options(parser)))
            assert commands.parser_of(kept).format_help() == parser.format_help(), (name, columns)


def test_any_command_keeps_every_commands_help(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(commands.CACHE_VARIABLE, str(tmp_path))
    assert not commands.help_is_kept()
    assert main(["push"]) == 1  # refused (no --repo_id), after it imported what the help needs
    assert "--repo_id" in capsys.readouterr().err
    for name in commands.COMMANDS:
        assert commands.kept_help(name).startswith(f"usage: hf-unlearn {name} [-h]")


def test_the_kept_help_is_keyed_on_the_source_and_the_versions(tmp_path, monkeypatch):
    package = tmp_path / "package"
    package.mkdir()
    (package / "arguments.py").write_text("x: int = 1\n")
    monkeypatch.setattr(commands, "PACKAGE_DIR", str(package))
    monkeypatch.setenv(commands.CACHE_VARIABLE, str(tmp_path / "cache"))
    parser = argparse.ArgumentParser(prog="hf-unlearn run", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--x", type=int, default=1, choices=[1, 2], help="An option.")
    commands.keep_help({"run": parser})
    assert commands.kept_help("run") == parser.format_help()
    (package / "arguments.py").write_text("x: int = 2\n")  # a default changed: the kept text is not shown
    assert commands.kept_help("run") is None
    commands.keep_help({"run": parser})
    installed = commands.metadata.version
    # torch's version sets the default of TrainingArguments' --optim
    monkeypatch.setattr(commands.metadata, "version", lambda name: "2.99" if name == "torch" else installed(name))
    assert commands.kept_help("run") is None


def test_a_bad_command_is_refused_without_a_traceback(capsys):
    try:
        main(["bogus"])
    except SystemExit as error:
        code = error.code
    assert code == 2 and "invalid choice: 'bogus'" in capsys.readouterr().err


def test_a_command_declared_twice_is_refused_unless_it_is_the_same_source_run_as_main():
    """`python -m hf_unlearn.cli.main` executes main.py again as __main__ (accelerate launch does that): the same
    functions register once more and must not clash; another function under a taken name must."""
    from hf_unlearn.cli.commands import COMMANDS, command

    existing = COMMANDS["demo"].run
    rerun = type(existing)(existing.__code__, existing.__globals__, existing.__name__)
    assert command("demo")(rerun) is rerun

    def demo(argv):
        """Another demo."""

    with pytest.raises(ValueError, match="'demo' is declared twice"):
        command("demo")(demo)
    COMMANDS["demo"] = type(COMMANDS["demo"])("demo", existing)


@pytest.mark.parametrize(("flags", "shown"), [(["--method", "npo"], False), (["--forget_loss=simnpo"], False),
                                              (["--method", "masc"], True), ([], True)])  # fmt: skip
def test_a_methods_help_leaves_out_the_options_it_does_not_read(capsys, flags, shown):
    """Issue 67: `hf-unlearn run --method npo --help` does not list MASC's margin and hinge options (NPO reads none of
    them) and says so; the stopping rule's options, which work with every objective, stay."""
    from hf_unlearn.objectives.masc.options import MARGIN_OPTIONS

    assert main(["run", *flags, "--help"]) == 0
    text = capsys.readouterr().out
    assert all((f"--{name} " in text) is shown for name in MARGIN_OPTIONS)
    assert "--stop_at_target" in text and "--utility_floor" in text and "--forget_loss_kwargs" in text
    assert ("does not read them" in " ".join(text.split())) is not shown  # the help wraps its lines
