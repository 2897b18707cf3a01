"""The ``hf-unlearn`` commands, each declared once: :func:`command` registers the function that parses the command's
arguments (its dataclasses) and runs its job, and the first line of that function's docstring is the command's line
in ``hf-unlearn --help``. A command imports its dataclasses and its job when it runs, so this module and the top-level
help import neither torch nor transformers.

``hf-unlearn COMMAND --help`` lists every field of the command's dataclasses (for ``run`` all of ``UnlearnConfig`` and
``TrainingArguments``), which needs them imported, torch included (transformers' ``TrainingArguments`` module
imports torch, and PEFT through ``trainer_utils``). Whenever they are imported anyway, by a command's first ``--help``
or by any command that runs, the options of every command's help are kept (:func:`keep_help`, one file in
:func:`help_cache_path`) under a key of the installed versions and of this package's source, and later ``--help``
calls are formatted from them (:func:`kept_help`) at the width of the terminal, without importing them; a stale text
is never shown.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Where the help texts are kept: ``$HF_UNLEARN_CACHE``, else ``$XDG_CACHE_HOME/hf_unlearn`` (``~/.cache/hf_unlearn``).
CACHE_VARIABLE = "HF_UNLEARN_CACHE"
#: How many sources' (or environments') help options are kept in the folder at once.
KEPT_SOURCES = 8


@dataclass(frozen=True)
class Command:
    """One ``hf-unlearn`` command: ``run(argv)`` parses the command's arguments and runs its job."""

    name: str
    run: Callable[[list[str]], Any]

    @property
    def help(self) -> str:
        return (self.run.__doc__ or "").strip().splitlines()[0] if self.run.__doc__ else ""


COMMANDS: dict[str, Command] = {}


def command(name: str) -> Callable[[Callable[[list[str]], Any]], Callable[[list[str]], Any]]:
    """Register ``run(argv)`` as the command ``name``; its docstring's first line is its help."""

    def decorator(run: Callable[[list[str]], Any]) -> Callable[[list[str]], Any]:
        known = COMMANDS.get(name)
        # `python -m hf_unlearn.cli.main` runs main.py a second time as __main__: the same function, not a clash.
        same = known is not None and known.run.__code__.co_filename == run.__code__.co_filename
        if known is not None and not same:
            raise ValueError(f"The command {name!r} is declared twice.")
        COMMANDS[name] = Command(name, run)
        return run

    return decorator


def source_key() -> str:
    """A digest of what a command's help is made of: the Python version, the installed transformers (whose
    ``TrainingArguments`` are flags) and torch (whose version sets the default of ``--optim``), and every source file
    of this package."""
    digest = hashlib.sha256(sys.version.encode())
    for distribution in ("transformers", "torch", "hf_unlearn"):
        try:
            digest.update(f"{distribution}={metadata.version(distribution)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{distribution}=absent".encode())
    for folder, subfolders, files in sorted(os.walk(PACKAGE_DIR)):
        subfolders[:] = sorted(d for d in subfolders if d != "__pycache__")
        for name in sorted(files):
            if name.endswith((".py", ".json", ".md")):
                digest.update(os.path.relpath(os.path.join(folder, name), PACKAGE_DIR).encode())
                with open(os.path.join(folder, name), "rb") as f:
                    digest.update(f.read())
    return digest.hexdigest()[:20]


def help_cache_path() -> str:
    """The file holding the options of every command's help for the current source and versions."""
    root = os.environ.get(CACHE_VARIABLE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hf_unlearn"
    )
    return os.path.join(root, "help", f"{source_key()}.json")


class ListedOption(argparse.Action):
    """An option as ``--help`` lists it, in a parser rebuilt from kept options: it formats, it never parses."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None):
        raise NotImplementedError("A parser rebuilt from kept help options only formats its help.")


def shown(value: Any) -> str | None:
    """``value`` as argparse shows it in a help text (``%(default)s``: a name for what has one, else ``str``); None
    for ``argparse.SUPPRESS``, which it leaves out."""
    if value is argparse.SUPPRESS:
        return None
    return value.__name__ if hasattr(value, "__name__") else str(value)


def help_options(parser: argparse.ArgumentParser) -> dict | None:
    """What ``parser.format_help()`` is made of, as JSON: its name, description and formatter, and every option with
    what its help shows (option strings, metavar, choices, default, help); None for a parser that has positional
    arguments, which are not kept."""
    options = []
    for action in parser._actions:  # argparse keeps them there; it has no public accessor
        if action.dest == "help":  # the rebuilt parser adds its own
            continue
        if not action.option_strings:
            return None
        options.append(
            {
                "option_strings": action.option_strings,
                "dest": action.dest,
                "nargs": action.nargs,
                "const": shown(action.const),
                "default": shown(action.default),
                "choices": None if action.choices is None else [str(choice) for choice in action.choices],
                "required": action.required,
                "help": action.help,
                "metavar": action.metavar,
            }
        )
    formatter = parser.formatter_class
    if getattr(argparse, formatter.__name__, None) is not formatter:
        return None
    return {
        "prog": parser.prog,
        "description": parser.description,
        "epilog": parser.epilog,
        "formatter": formatter.__name__,
        "options": options,
    }


def parser_of(kept: dict) -> argparse.ArgumentParser:
    """A parser whose ``format_help()`` is that of the parser :func:`help_options` read ``kept`` from."""
    parser = argparse.ArgumentParser(
        prog=kept["prog"],
        description=kept["description"],
        epilog=kept["epilog"],
        formatter_class=getattr(argparse, kept["formatter"]),
    )
    for option in kept["options"]:
        metavar = option["metavar"]
        parser.add_argument(
            *option["option_strings"],
            action=ListedOption,
            dest=option["dest"],
            nargs=option["nargs"],
            const=argparse.SUPPRESS if option["const"] is None else option["const"],
            default=argparse.SUPPRESS if option["default"] is None else option["default"],
            choices=option["choices"],
            required=option["required"],
            help=argparse.SUPPRESS if option["help"] == argparse.SUPPRESS else option["help"],
            metavar=tuple(metavar) if isinstance(metavar, list) else metavar,
        )
    return parser


def keep_help(parsers: dict[str, argparse.ArgumentParser]) -> None:
    """Keep the options of each command's help (``parsers``: command -> the parser its ``--help`` formats), those
    whose rebuilt parser formats the same text; silently not, where the cache folder cannot be written."""
    kept = {}
    for name, parser in parsers.items():
        options = help_options(parser)
        try:
            same = options is not None and parser_of(options).format_help() == parser.format_help()
        except (ValueError, KeyError, TypeError):  # a help text argparse cannot format; its --help says why
            same = False
        if same:
            kept[name] = options
    path = help_cache_path()
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        with open(f"{path}.{os.getpid()}", "w", encoding="utf-8") as f:
            json.dump(kept, f)
        os.replace(f"{path}.{os.getpid()}", path)
        # The newest few sources stay (other environments may share the folder), so edits do not pile up files.
        known = sorted(
            (os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".json")), key=os.path.getmtime
        )
        for old in known[:-KEPT_SOURCES]:
            os.remove(old)
    except OSError:
        pass


def help_is_kept() -> bool:
    """Whether the help of the commands is kept for the current source and versions."""
    return os.path.isfile(help_cache_path())


def kept_help(name: str) -> str | None:
    """``hf-unlearn NAME --help`` formatted from its kept options at the terminal's width, or None when they are not
    kept for this source and these versions."""
    try:
        with open(help_cache_path(), encoding="utf-8") as f:
            kept = json.load(f)
    except (OSError, ValueError):
        return None
    return parser_of(kept[name]).format_help() if name in kept else None


__all__ = [
    "CACHE_VARIABLE",
    "COMMANDS",
    "Command",
    "ListedOption",
    "command",
    "help_cache_path",
    "help_is_kept",
    "help_options",
    "keep_help",
    "kept_help",
    "parser_of",
    "source_key",
]
