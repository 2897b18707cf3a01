"""The ``hf-unlearn`` command line (:mod:`.main`) and its options (:mod:`.arguments`)."""

from typing import Any

from .main import COMMANDS, USER_ERRORS, ConfigurationError, main, yaml_to_argv


def __getattr__(name: str) -> Any:
    # the options import transformers: resolved on first use, so that `hf-unlearn --help` starts without torch
    if name == "CompareArguments":
        from .arguments import CompareArguments

        return CompareArguments
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["COMMANDS", "CompareArguments", "USER_ERRORS", "ConfigurationError", "main", "yaml_to_argv"]
