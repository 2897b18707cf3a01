"""The study scripts use the library as a user would: every ``hf_unlearn`` name they import comes from the package
root or from a module that docs/layout.md names as public, and is in that module's ``__all__`` (issue 56: a
refactor of the internals must not have to keep one-off experiments running)."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STUDIES = sorted((ROOT / "studies").glob("*.py"))


def public_modules() -> set[str]:
    """The package root and every module in the first column of docs/layout.md's table of module paths."""
    table = (ROOT / "docs" / "layout.md").read_text().split("Module paths named in these pages")[1]
    return {"hf_unlearn", *re.findall(r"^\| `(hf_unlearn[\w.]*)`", table, re.M)}


def imported_names(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` per ``from hf_unlearn... import name``; ``(module, "")`` per ``import hf_unlearn...``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "hf_unlearn":
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.split(".")[0] == "hf_unlearn"]
    return found


def test_the_layout_names_public_modules_that_exist() -> None:
    modules = public_modules()
    assert len(modules) > 10
    for module in modules:
        assert hasattr(importlib.import_module(module), "__all__"), module


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_studies_import_only_the_public_api(path: Path) -> None:
    public = public_modules()
    imports = imported_names(path)
    assert imports, f"{path.name} imports nothing of hf_unlearn"
    for module, name in imports:
        assert module in public, f"{path.name} imports {name or module} from {module}, which is not public"
        assert name in importlib.import_module(module).__all__, f"{path.name}: {module}.{name} is not public"
