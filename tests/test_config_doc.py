"""UnlearnConfig reads like TRL's configs: the docstrings of its own classes (MASC's parameters are
``MascArguments``', which it inherits, then its own) give every parameter they add to TrainingArguments, in the
field order and groups, with the field's type and default, so the two cannot drift apart."""

from __future__ import annotations

import ast
import dataclasses
import re

from transformers import TrainingArguments

from hf_unlearn import UnlearnConfig
from hf_unlearn.objectives.masc import MascArguments

ENTRY = re.compile(r"^        (\w+) \((.+), \*optional\*, defaults to `(.*)`\):$", re.M)


#: The classes whose docstrings document UnlearnConfig's fields, in field order (a base's fields come first).
DOCUMENTED = (MascArguments, UnlearnConfig)
DOCSTRING = "\n".join(cls.__doc__ for cls in DOCUMENTED)


def annotation(name: str) -> str:
    """The annotation as written in whichever class defines the field."""
    return next(cls.__annotations__[name] for cls in reversed(DOCUMENTED) if name in cls.__annotations__)


def own_fields() -> list[dataclasses.Field]:
    inherited = {f.name for f in dataclasses.fields(TrainingArguments)}
    return [f for f in dataclasses.fields(UnlearnConfig) if f.name not in inherited]


def test_docstring_lists_every_parameter_in_field_order_with_its_type_and_default() -> None:
    entries = ENTRY.findall(DOCSTRING)
    fields = own_fields()
    assert [name for name, _, _ in entries] == [f.name for f in fields]
    for (name, type_doc, default_doc), f in zip(entries, fields):
        assert ast.literal_eval(default_doc) == f.default, name
        types = re.findall(r"`([^`]+)`", type_doc)
        # the annotation as written: HfArgumentParser resolves (and strips the None of) ``Field.type`` in place
        # once any parser is built on UnlearnConfig, which an earlier test in the same process may have done
        assert " | ".join(types) == annotation(f.name), name


def test_each_group_of_the_docstring_is_a_block_of_fields() -> None:
    """The fields of one '> Parameters that ...' group come one after another, in the docstring's group order."""
    groups = re.split(r"^    > Parameters that ", DOCSTRING, flags=re.M)[1:]
    assert len(groups) >= 6
    order = [[name for name, _, _ in ENTRY.findall(group)] for group in groups]
    assert all(order), "a group without parameters"
    assert [name for group in order for name in group] == [f.name for f in own_fields()]
