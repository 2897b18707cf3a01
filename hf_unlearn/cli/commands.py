"""The ``hf-unlearn`` commands, each declared once: :func:`command` registers the function that parses the command's
arguments (its dataclasses) and runs its job, and the first line of that function's docstring is the command's line
in ``hf-unlearn --help``. A command imports its dataclasses and its job when it runs, so this module and the top-level
help import neither torch nor transformers.

``hf-unlearn COMMAND --help`` lists every field of the command's dataclasses (for ``run`` all of ``UnlearnConfig`` and
``TrainingArguments``), which needs them imported, torch included. The text is therefore kept in a cache
(:func:`help_cache_path`) under a key of the installed versions and of this package's source, so the second
``--help`` after an install or an edit answers without importing them, and a stale text is never shown.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Where the help texts are kept: ``$HF_UNLEARN_CACHE``, else ``$XDG_CACHE_HOME/hf_unlearn`` (``~/.cache/hf_unlearn``).
CACHE_VARIABLE = "HF_UNLEARN_CACHE"


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
    ``TrainingArguments`` are flags) and every source file of this package."""
    digest = hashlib.sha256(sys.version.encode())
    for distribution in ("transformers", "hf_unlearn"):
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


def help_cache_path(name: str) -> str:
    """The file holding ``hf-unlearn NAME --help`` for the current source, versions and terminal width (argparse
    wraps the text to it)."""
    root = os.environ.get(CACHE_VARIABLE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "hf_unlearn"
    )
    width = shutil.get_terminal_size().columns
    return os.path.join(root, "help", f"{name}-{source_key()}-{width}.txt")


def cached_help(name: str) -> str | None:
    """The help text kept for ``name``, or None when there is none for this source."""
    try:
        with open(help_cache_path(name), encoding="utf-8") as f:
            return f.read()
    except OSError:
        return None


def keep_help(name: str, text: str) -> None:
    """Keep ``text`` as the help of ``name`` (silently not, where the cache folder cannot be written)."""
    path = help_cache_path(name)
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.{os.getpid()}", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(f"{path}.{os.getpid()}", path)
    except OSError:
        pass


__all__ = ["CACHE_VARIABLE", "COMMANDS", "Command", "cached_help", "command", "help_cache_path", "keep_help"]
