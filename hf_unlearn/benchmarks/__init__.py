"""Embedded benchmarks: the fictitious authors (a TOFU-shaped, offline benchmark,
:mod:`hf_unlearn.benchmarks.fictitious_authors`) and the models learned on it
(:mod:`hf_unlearn.benchmarks.target_model`)."""

from hf_unlearn.benchmarks.fictitious_authors import (
    BENCHMARK_VERSION,
    SPLIT_NAMES,
    build_tokenizer,
    generate_benchmark,
    load_split,
    retain_split_for,
)
from hf_unlearn.benchmarks.target_model import (
    default_cache_dir,
    learn_retain_only_model,
    learn_target_model,
    tiny_model,
    tiny_model_config,
)

__all__ = [
    "BENCHMARK_VERSION",
    "SPLIT_NAMES",
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
