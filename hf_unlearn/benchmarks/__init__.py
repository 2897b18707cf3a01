"""Embedded benchmarks: :mod:`hf_unlearn.benchmarks.fictitious_authors` (a TOFU-shaped, offline benchmark)."""

from hf_unlearn.benchmarks.fictitious_authors import (
    BENCHMARK_VERSION,
    SPLIT_NAMES,
    build_tokenizer,
    default_cache_dir,
    generate_benchmark,
    learn_target_model,
    load_split,
    retain_split_for,
    tiny_model,
    tiny_model_config,
)

__all__ = [
    "BENCHMARK_VERSION",
    "SPLIT_NAMES",
    "build_tokenizer",
    "default_cache_dir",
    "generate_benchmark",
    "learn_target_model",
    "load_split",
    "retain_split_for",
    "tiny_model",
    "tiny_model_config",
]
