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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "spiece.model")


def looks_like_path(name: str) -> bool:
    """A name that can only mean a local file or folder: Hub ids are ``name`` or ``owner/name``, never absolute,
    relative with ``./``/``../``/``~``, deeper than one slash, or ending in a data-file extension."""
    return (
        os.path.isabs(name)
        or name.startswith(("./", "../", "~", ".\\", "..\\"))
        or name in (".", "..")
        or name.count("/") > 1
        or "\\" in name
        or os.path.splitext(name)[1].lower() in DATA_FILE_FORMATS
    )


def missing_path_error(name: str, what: str) -> FileNotFoundError:
    """The error for a local path that does not exist (never sent to the Hub as an id)."""
    return FileNotFoundError(
        f"{what} {name!r} does not exist ({os.path.abspath(os.path.expanduser(name))}). It looks like a local path, "
        "so it was not looked up on the Hub; check the path (a Hub id looks like 'owner/name')."
    )


def load_records(name: str, subset: str | None = None, split: str = "train") -> Dataset:
    """Load one split from a Hub id, a local copy of a Hub repository, a ``save_to_disk`` folder or a
    JSON/JSONL/CSV/Parquet file. A local path that does not exist, an empty file or an unreadable line is named in
    the error; with no network, the error says so and what to do."""
    if looks_like_path(name) and not os.path.exists(os.path.expanduser(name)):
        raise missing_path_error(name, "The dataset file or folder")
    name = os.path.expanduser(name)
    extension = os.path.splitext(name)[1].lower()
    if os.path.isfile(name):
        if extension not in DATA_FILE_FORMATS:
            raise ValueError(
                f"{name!r} is a {extension or 'extension-less'} file; hf_unlearn reads {', '.join(DATA_FILE_FORMATS)} "
                "files, folders saved with save_to_disk, and Hub datasets."
            )
        return _load_data_file(name, DATA_FILE_FORMATS[extension])
    if os.path.isdir(name) and (
        os.path.exists(os.path.join(name, "dataset_info.json"))
        or os.path.exists(os.path.join(name, "dataset_dict.json"))
    ):
        loaded = load_from_disk(name if subset is None else os.path.join(name, subset))
        return loaded[split] if isinstance(loaded, DatasetDict) else loaded
    try:
        return load_dataset(name, subset, split=split)
    except Exception as error:  # datasets raises several types for "not reachable"
        local = "" if os.path.exists(name) else f" (no local file or folder {name!r} exists either)"
        raise RuntimeError(
            offline_hint(f"Could not load dataset {name!r}{local} (subset {subset!r}, split {split!r})", error)
        ) from error


def _load_data_file(path: str, file_format: str) -> Dataset:
    """One data file through ``datasets``; on failure, the file and the line or row at fault."""
    with open(path, "rb") as f:
        empty = not f.read(1 << 16).strip()
    if empty:
        raise ValueError(f"{path!r} is empty: it holds no examples.")
    try:
        dataset = load_dataset(file_format, data_files=path, split="train")
    except Exception as error:  # DatasetGenerationError, ArrowInvalid, StopIteration, ...
        found = _json_problem(path) if file_format == "json" else None
        raise ValueError(f"Could not read {path!r}: {found or f'{type(error).__name__}: {error}'}") from error
    if len(dataset) == 0:
        raise ValueError(f"{path!r} holds no examples.")
    return dataset


def _json_problem(path: str) -> str | None:
    """Where a JSON or JSON Lines file goes wrong: the first line that is not JSON, or a column whose rows hold
    different kinds of values (a number in one row, text in another)."""
    import json

    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    try:
        whole = json.loads(text)
    except json.JSONDecodeError as whole_error:
        records = []
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as error:
                if number == 1 and text.lstrip().startswith("["):
                    return f"line {whole_error.lineno}, column {whole_error.colno}: {whole_error.msg}"
                return f"line {number} is not valid JSON ({error.msg}, column {error.colno}): {line.strip()[:80]!r}"
    else:
        records = whole if isinstance(whole, list) else whole.get("data", []) if isinstance(whole, dict) else []
    if not records:
        return "it holds no examples"
    kinds: dict[str, dict[str, int]] = {}
    for row, record in enumerate(records):
        if not isinstance(record, dict):
            return f"row {row} is a {type(record).__name__}, not an object with named columns"
        for column, value in record.items():
            kinds.setdefault(column, {}).setdefault(type(value).__name__, row)
    for column, first_rows in kinds.items():
        if len(first_rows) > 1:
            described = ", ".join(f"{kind} (first in row {row})" for kind, row in first_rows.items())
            return f"column {column!r} mixes kinds of values: {described}; every row must hold the same kind."
    return None


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
    return _tofu_columns(load_records(path, config, "train"), config.startswith(("real_authors", "world_facts")))


def _tofu_columns(dataset: Dataset, real_knowledge: bool) -> Dataset:
    """TOFU rows with hf_unlearn's columns; the real-authors / world-facts sets (``real_knowledge``) get their answer
    as the truth ratio's base answer, as TOFU compares their perturbed answers with the answer itself."""
    if real_knowledge and "paraphrased_answer" not in dataset.column_names:
        if "perturbed_answer" not in dataset.column_names:
            return map_columns(dataset, "qa")
        dataset = map_columns(dataset, "tofu_multiple_choice")
        return dataset.add_column("paraphrased_answer", list(dataset["answer"]))
    if "perturbed_answer" in dataset.column_names:
        return map_columns(dataset, "tofu_qa")
    return map_columns(dataset, "qa")


#: TOFU's layout: each fictitious author has 20 consecutive question/answer pairs (``full``, 4,000 rows).
TOFU_QUESTIONS_PER_AUTHOR = 20
#: The files of a TOFU folder (:func:`load_tofu_folder`): the authors' QA, then the optional real-knowledge sets.
TOFU_FOLDER_FILES = ("authors.jsonl", "real_authors.jsonl", "world_facts.jsonl")


def load_tofu_folder(folder: str) -> dict[str, Dataset]:
    """A folder of TOFU rows: ``authors`` (``authors.jsonl`` with ``question``, ``answer`` and an ``author`` id;
    without the id, rows are grouped 20 per author in order, TOFU's own layout) and, when their files are there,
    ``real_authors`` and ``world_facts`` (``question``, ``answer``, ``perturbed_answer``: TOFU's utility on real
    knowledge). Each file is read with :func:`load_records` (JSON, JSONL, CSV or Parquet by extension: the ``.jsonl``
    names may also be ``.json``, ``.csv`` or ``.parquet``)."""
    folder = os.path.expanduser(folder)
    if not os.path.isdir(folder):
        raise missing_path_error(folder, "The TOFU folder")

    def find(stem: str) -> str | None:
        for extension in DATA_FILE_FORMATS:
            path = os.path.join(folder, stem + extension)
            if os.path.isfile(path):
                return path
        return None

    authors_file = find("authors")
    if authors_file is None:
        raise FileNotFoundError(
            f"{folder!r} holds no authors.jsonl (question, answer, author per row): a TOFU folder holds "
            f"{', '.join(TOFU_FOLDER_FILES)} (the last two optional)."
        )
    rows = load_records(authors_file)
    ids = (
        [int(a) for a in rows["author"]]
        if "author" in rows.column_names
        else [i // TOFU_QUESTIONS_PER_AUTHOR for i in range(len(rows))]
    )
    sets = {"authors": map_columns(rows, "qa").add_column("author", ids)}
    for name in ("real_authors", "world_facts"):
        path = find(name)
        if path is not None:
            sets[name] = _tofu_columns(load_records(path), real_knowledge=True)
    return sets


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


__all__ = [
    "BENCHMARKS",
    "COLUMN_MAPPING",
    "TOFU_FORGET_SPLITS",
    "load_records",
    "load_tofu",
    "load_tofu_folder",
    "muse_evaluation_sets",
    "tofu_evaluation_sets",
]
