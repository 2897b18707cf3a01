"""hf_unlearn: make a language model forget specific training data, as a Hugging Face Trainer plugin."""

import importlib
from typing import TYPE_CHECKING, Any

# First, before transformers imports bitsandbytes (through peft): its note about an optional CPU kernel package.
from . import third_party  # noqa: F401

# The public names, imported on first use (PEP 562), as transformers does: `hf-unlearn --help` and a command's help
# then start without torch, and `import hf_unlearn.cli` costs no more than the command line needs.
_PUBLIC = {
    "build_qa_dataset": ".data.examples",
    "tokenize_qa": ".data.examples",
    "restricted_margin": ".objectives.masc.margin",
    "threshold_from_probability": ".objectives.masc.margin",
    "FORGET_OBJECTIVES": ".objectives.registry",
    "RETAIN_OBJECTIVES": ".objectives.registry",
    "register_forget_objective": ".objectives.registry",
    "register_retain_objective": ".objectives.registry",
    "ViolationStoppingCallback": ".objectives.masc.stopping",
    "METHODS": ".training.choices",
    "UnlearnConfig": ".training.config",
    "UnlearnRecord": ".training.record",
    "UnlearnTrainer": ".training.trainer",
}


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'hf_unlearn' has no attribute {name!r}")
    value = getattr(importlib.import_module(_PUBLIC[name], __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


if TYPE_CHECKING:  # the names, for type checkers and IDEs
    from .data.examples import build_qa_dataset, tokenize_qa
    from .objectives.masc.margin import restricted_margin, threshold_from_probability
    from .objectives.masc.stopping import ViolationStoppingCallback
    from .objectives.registry import (
        FORGET_OBJECTIVES,
        RETAIN_OBJECTIVES,
        register_forget_objective,
        register_retain_objective,
    )
    from .training.choices import METHODS
    from .training.config import UnlearnConfig
    from .training.record import UnlearnRecord
    from .training.trainer import UnlearnTrainer

__version__ = "0.1.0"

__all__ = [
    "FORGET_OBJECTIVES",
    "METHODS",
    "RETAIN_OBJECTIVES",
    "UnlearnConfig",
    "UnlearnRecord",
    "UnlearnTrainer",
    "ViolationStoppingCallback",
    "build_qa_dataset",
    "register_forget_objective",
    "register_retain_objective",
    "restricted_margin",
    "threshold_from_probability",
    "tokenize_qa",
]
