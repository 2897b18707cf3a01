"""The ``hf-unlearn`` command line (:mod:`.main`) and its options (:mod:`.arguments`)."""

from .main import COMMANDS, USER_ERRORS, ConfigurationError, main, yaml_to_argv

__all__ = ["COMMANDS", "USER_ERRORS", "ConfigurationError", "main", "yaml_to_argv"]
