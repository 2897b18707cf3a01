"""Embedded benchmarks: the fictitious authors (a TOFU-shaped, offline benchmark,
:mod:`hf_unlearn.benchmarks.fictitious_authors`) and the models learned on it
(:mod:`hf_unlearn.benchmarks.target_model`); the fictitious chronicles (a MUSE-shaped long-text corpus whose facts
recur across passages, :mod:`hf_unlearn.benchmarks.fictitious_chronicles`) and its learn stage
(:mod:`hf_unlearn.benchmarks.chronicles_target`)."""

from .chronicles_target import learn_chronicles_target_model
from .fictitious_authors import (
    BENCHMARK_SIZES,
    BENCHMARK_VERSION,
    SPLIT_NAMES,
    benchmark_size,
    build_tokenizer,
    generate_benchmark,
    load_split,
    retain_split_for,
)
from .fictitious_chronicles import (
    CHRONICLES_SPLIT_NAMES,
    build_chronicles_tokenizer,
    generate_chronicles,
    load_chronicles_split,
)
from .target_model import (
    default_cache_dir,
    learn_retain_only_model,
    learn_target_model,
    tiny_model,
    tiny_model_config,
)

__all__ = [
    "BENCHMARK_SIZES",
    "BENCHMARK_VERSION",
    "CHRONICLES_SPLIT_NAMES",
    "build_chronicles_tokenizer",
    "generate_chronicles",
    "learn_chronicles_target_model",
    "load_chronicles_split",
    "SPLIT_NAMES",
    "benchmark_size",
    "build_tokenizer",
    "default_cache_dir",
    "generate_benchmark",
    "learn_retain_only_model",
    "learn_target_model",
    "load_split",
    "retain_split_for",
    "tiny_model",
    "tiny_model_config",
]
