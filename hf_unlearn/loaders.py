"""Loading forget/retain data by Hub name or local path, and the public unlearning benchmarks' splits.

The benchmarks' own column names are mapped onto hf_unlearn's in one place, :data:`COLUMN_MAPPING`:

* TOFU (``locuslab/TOFU``; Maini et al. 2024): ``question``, ``answer``, ``paraphrased_answer`` and
  ``perturbed_answer`` already have hf_unlearn's names. Its ``real_authors_perturbed`` and
  ``world_facts_perturbed`` have no paraphrase; TOFU compares their perturbed answers with the answer itself, so
  the answer becomes the ``paraphrased_answer``.
* MUSE (``muse-bench/MUSE-News``, ``muse-bench/MUSE-Books``; Shi et al. 2024): ``verbmem`` has ``prompt`` and
  ``gt`` (renamed ``continuation``), ``knowmem`` ``question`` and ``answer``, ``privleak`` ``text``.

Every loader goes through :func:`load_records`, so a local folder laid out like the Hub repository (a README
with ``configs``, or data files per config) works the same as the Hub name: that is how the tests run offline.
"""

from __future__ import annotations

import os
from typing import Any

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk

TOFU_HUB_ID = "locuslab/TOFU"
MUSE_HUB_IDS = {"muse_news": "muse-bench/MUSE-News", "muse_books": "muse-bench/MUSE-Books"}
BENCHMARKS = ("embedded", "tofu", "muse_news", "muse_books")
TOFU_FORGET_SPLITS = ("forget01", "forget05", "forget10")

#: Source column -> hf_unlearn column, per kind of data. The only place benchmark column names appear.
COLUMN_MAPPING: dict[str, dict[str, str]] = {
    "tofu_qa": {
        "question": "question",
        "answer": "answer",
        "paraphrased_answer": "paraphrased_answer",
        "perturbed_answer": "perturbed_answer",
    },
    # TOFU's real authors / world facts: the truth ratio's base answer is the answer itself.
    "tofu_multiple_choice": {
        "question": "question",
        "answer": "answer",
        "perturbed_answer": "perturbed_answer",
    },
    "qa": {"question": "question", "answer": "answer"},  # TOFU's plain configs, MUSE's knowmem
    "muse_verbmem": {"prompt": "prompt", "gt": "continuation"},
    "muse_text": {"text": "text"},
}

DATA_FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_records(name: str, subset: str | None = None, split: str = "train") -> Dataset:
    """Load one split from a Hub id, a local copy of a Hub repository, a ``save_to_disk`` folder or a
    JSON/CSV/Parquet file. With no network, the error says so and what to do."""
    extension = os.path.splitext(name)[1].lower()
    if os.path.isfile(name) and extension in DATA_FILE_FORMATS:
        return load_dataset(DATA_FILE_FORMATS[extension], data_files=name, split="train")
    if os.path.isdir(name) and (
        os.path.exists(os.path.join(name, "dataset_info.json"))
        or os.path.exists(os.path.join(name, "dataset_dict.json"))
    ):
        loaded = load_from_disk(name if subset is None else os.path.join(name, subset))
        return loaded[split] if isinstance(loaded, DatasetDict) else loaded
    try:
        return load_dataset(name, subset, split=split)
    except Exception as error:  # datasets raises several types for "not reachable"
        raise RuntimeError(
            offline_hint(f"Could not load dataset {name!r} (subset {subset!r}, split {split!r})", error)
        ) from error


def offline_hint(message: str, error: Exception) -> str:
    """``message`` plus the cause and, when ``HF_HUB_OFFLINE=1``, what to do without a network."""
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    hint = (
        " HF_HUB_OFFLINE=1 is set, so only local files and the cache are used: download it once with network, "
        "or pass a local path."
        if offline
        else " Check the name, your network connection and, for gated repos, `hf auth login`."
    )
    return f"{message}: {type(error).__name__}: {str(error).rstrip('.')}.{hint}"


def map_columns(dataset: Dataset, kind: str) -> Dataset:
    """Keep and rename the columns :data:`COLUMN_MAPPING` names for ``kind``; a missing one is an error."""
    mapping = COLUMN_MAPPING[kind]
    missing = [column for column in mapping if column not in dataset.column_names]
    if missing:
        raise ValueError(
            f"The {kind} data lacks the column(s) {missing}; it has {dataset.column_names}. "
            f"Expected the columns {list(mapping)}."
        )
    dataset = dataset.select_columns(list(mapping))
    renames = {source: target for source, target in mapping.items() if source != target}
    return dataset.rename_columns(renames) if renames else dataset


def load_tofu(config: str, path: str = TOFU_HUB_ID) -> Dataset:
    """One TOFU config (``forget10_perturbed``, ``retain_perturbed``, ``real_authors_perturbed``, ...) with
    hf_unlearn's columns. Plain configs (``forget10``, ``retain90``) have question and answer only."""
    dataset = load_records(path, config, "train")
    if config.startswith(("real_authors", "world_facts")) and "paraphrased_answer" not in dataset.column_names:
        if "perturbed_answer" not in dataset.column_names:
            return map_columns(dataset, "qa")
        dataset = map_columns(dataset, "tofu_multiple_choice")
        return dataset.add_column("paraphrased_answer", list(dataset["answer"]))
    if "perturbed_answer" in dataset.column_names:
        return map_columns(dataset, "tofu_qa")
    return map_columns(dataset, "qa")


def tofu_evaluation_sets(split: str = "forget10", path: str = TOFU_HUB_ID) -> dict[str, Dataset]:
    """The four sets TOFU evaluates on: ``forget`` (``<split>_perturbed``), ``retain`` (``retain_perturbed``),
    ``real_authors`` and ``world_facts`` (their ``_perturbed`` configs)."""
    if split not in TOFU_FORGET_SPLITS:
        raise ValueError(f"TOFU forget split must be one of {', '.join(TOFU_FORGET_SPLITS)}, got {split!r}.")
    return {
        "forget": load_tofu(f"{split}_perturbed", path),
        "retain": load_tofu("retain_perturbed", path),
        "real_authors": load_tofu("real_authors_perturbed", path),
        "world_facts": load_tofu("world_facts_perturbed", path),
    }


def muse_evaluation_sets(benchmark: str = "muse_news", path: str | None = None) -> dict[str, Dataset]:
    """MUSE's evaluation sets: ``verbmem`` (forget prompts and continuations), ``knowmem_forget`` and
    ``knowmem_retain`` (QA), their in-context examples ``knowmem_forget_icl`` / ``knowmem_retain_icl``, and
    ``privleak_forget`` / ``privleak_holdout`` (texts) for the membership attack."""
    if benchmark not in MUSE_HUB_IDS:
        raise ValueError(f"MUSE benchmark must be one of {', '.join(MUSE_HUB_IDS)}, got {benchmark!r}.")
    path = path or MUSE_HUB_IDS[benchmark]
    return {
        "verbmem": map_columns(load_records(path, "verbmem", "forget"), "muse_verbmem"),
        "knowmem_forget": map_columns(load_records(path, "knowmem", "forget_qa"), "qa"),
        "knowmem_retain": map_columns(load_records(path, "knowmem", "retain_qa"), "qa"),
        "knowmem_forget_icl": map_columns(load_records(path, "knowmem", "forget_qa_icl"), "qa"),
        "knowmem_retain_icl": map_columns(load_records(path, "knowmem", "retain_qa_icl"), "qa"),
        "privleak_forget": map_columns(load_records(path, "privleak", "forget"), "muse_text"),
        "privleak_holdout": map_columns(load_records(path, "privleak", "holdout"), "muse_text"),
    }


def embedded_evaluation_sets(split: str = "forget10") -> dict[str, Any]:
    """The embedded benchmark seen both ways: TOFU's sets (forget, retain) and MUSE's (VerbMem on each forget
    answer's second half given the question and first half, KnowMem on forget and retain QA, and the membership
    attack on the answers of forget vs holdout-author QA, given their questions)."""
    from .benchmarks.fictitious_authors import load_split, retain_split_for
    from .data import PLAIN_PROMPT_TEMPLATE

    forget, retain, holdout = load_split(split), load_split(retain_split_for(split)), load_split("holdout")

    def prompt(record: dict[str, Any]) -> str:
        return PLAIN_PROMPT_TEMPLATE.format(question=record["question"])

    def answer(record: dict[str, Any]) -> str:
        return " " + record["answer"]

    prompts, continuations = [], []
    for record in forget:
        words = record["answer"].split(" ")
        half = max(1, len(words) // 2)
        prompts.append(PLAIN_PROMPT_TEMPLATE.format(question=record["question"]) + " " + " ".join(words[:half]))
        continuations.append(" ".join(words[half:]))
    return {
        "forget": forget,
        "retain": retain,
        "verbmem": Dataset.from_dict({"prompt": prompts, "continuation": continuations}),
        "knowmem_forget": forget.select_columns(["question", "answer"]),
        "knowmem_retain": retain.select_columns(["question", "answer"]),
        # The question is a prompt the model never trained on (masked from the loss), so the membership attack
        # scores the answer given the question, not the whole text.
        "privleak_forget": Dataset.from_dict(
            {"prompt": [prompt(r) for r in forget], "text": [answer(r) for r in forget]}
        ),
        "privleak_holdout": Dataset.from_dict(
            {"prompt": [prompt(r) for r in holdout], "text": [answer(r) for r in holdout]}
        ),
    }


def benchmark_sets(benchmark: str, split: str = "forget10", path: str | None = None) -> dict[str, Any]:
    """The evaluation sets of ``benchmark`` (one of :data:`BENCHMARKS`); ``path`` replaces the Hub id."""
    if benchmark == "embedded":
        return embedded_evaluation_sets(split)
    if benchmark == "tofu":
        return tofu_evaluation_sets(split, **({"path": path} if path else {}))
    if benchmark in MUSE_HUB_IDS:
        return muse_evaluation_sets(benchmark, path)
    raise ValueError(f"Unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}.")
