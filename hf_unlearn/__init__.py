"""hf_unlearn: make a language model forget specific training data, as a Hugging Face Trainer plugin."""

# First, before transformers imports bitsandbytes (through peft): its note about an optional CPU kernel package.
from . import third_party  # noqa: F401
from .data.examples import build_qa_dataset, tokenize_qa
from .objectives.margin import restricted_margin, threshold_from_probability
from .objectives.registry import (
    FORGET_OBJECTIVES,
    RETAIN_OBJECTIVES,
    register_forget_objective,
    register_retain_objective,
)
from .training.callbacks import ViolationStoppingCallback
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
