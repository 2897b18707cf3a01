"""Which base model a saved run (above all a LoRA adapter) needs, named so that it loads from any working directory
and on any machine that has it: a base loaded from a local folder by that folder's absolute path and the SHA-256 of
each of its weights files, a Hub id as it was given (never hashed: its files are not here).

The trainer anchors the names when it is built (:func:`anchored_base`: the run record and ``adapter_config.json``
are written from them) and adds the hashes to the record when it saves (:func:`with_base_weights`); the commands
that load a saved adapter compare them with the base they load it on (:func:`changed_weights`)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

from ..data.loaders import looks_like_path

#: Suffixes of the files that hold a model's weights (safetensors, or PyTorch's pickles), and files with those
#: suffixes that do not (Trainer's pickled arguments).
WEIGHT_SUFFIXES = (".safetensors", ".bin")
NOT_WEIGHTS = ("training_args.bin",)
CHUNK_BYTES = 1 << 20

# (absolute path, size, modification time) -> SHA-256: a file is read once per process however often it is saved.
_file_digests: dict[tuple[str, int, int], str] = {}


def local_folder(name: str | None) -> str | None:
    """The absolute path of ``name`` when it is a local folder (relative to the working directory, ``~``
    expanded); ``None`` for a Hub id or nothing."""
    if not name:
        return None
    path = os.path.expanduser(name)
    return os.path.abspath(path) if os.path.isdir(path) else None


def names_local_path(name: str | None) -> bool:
    """Whether a base model name is a path on this machine (one that can only be a path, or a folder that is there),
    which nobody else can load."""
    return bool(name) and (looks_like_path(name) or os.path.isdir(os.path.expanduser(name)))


def anchored_base(model: Any) -> Any:
    """``model`` with a base loaded from a local folder named by its absolute path: in the base's config (which the
    run record reads), its ``name_or_path`` (which PEFT names the base by) and every PEFT adapter config already on
    it (which ``adapter_config.json`` is written from). A Hub id is left as it is."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    config = getattr(base, "config", None)
    path = local_folder(getattr(config, "_name_or_path", None))
    if path is not None:
        config._name_or_path = path
        base.name_or_path = path
    adapters = getattr(model, "peft_config", None)
    for adapter in adapters.values() if isinstance(adapters, dict) else ():
        path = local_folder(getattr(adapter, "base_model_name_or_path", None))
        if path is not None:
            adapter.base_model_name_or_path = path
    return model


def weights_files(folder: str) -> list[str]:
    """The weights files of a model folder (``*.safetensors``, ``*.bin``), by name."""
    return sorted(
        name
        for name in os.listdir(folder)
        if name.endswith(WEIGHT_SUFFIXES) and name not in NOT_WEIGHTS and os.path.isfile(os.path.join(folder, name))
    )


def file_sha256(path: str) -> str:
    """The SHA-256 (hex) of a file, read in 1 MiB chunks; remembered for the file's size and modification time."""
    stat = os.stat(path)
    key = (os.path.abspath(path), stat.st_size, stat.st_mtime_ns)
    if key not in _file_digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            chunk = f.read(CHUNK_BYTES)
            while chunk:
                digest.update(chunk)
                chunk = f.read(CHUNK_BYTES)
        _file_digests[key] = digest.hexdigest()
    return _file_digests[key]


def weights_sha256(folder: str) -> dict[str, str]:
    """File name -> SHA-256 of each weights file of a local model folder (what ``sha256sum`` prints, and what the Hub
    shows for a file stored with Git LFS)."""
    return {name: file_sha256(os.path.join(folder, name)) for name in weights_files(folder)}


def with_base_weights(record: Any) -> Any:
    """The run record with the SHA-256 of its base's weights files when the base is a local folder (computed when
    the run is saved, and read once however many checkpoints are saved); a Hub id is not hashed."""
    folder = local_folder(record.base_model)
    if folder is not None and record.base_model_weights is None:
        record.base_model_weights = weights_sha256(folder) or None
    return record


def changed_weights(recorded: dict[str, str], folder: str) -> list[str]:
    """The weights files whose SHA-256 in ``folder`` differs from ``recorded`` (name -> hex), or that only one side
    has; empty when the folder holds the recorded weights."""
    found = weights_sha256(folder)
    return sorted(name for name in set(recorded) | set(found) if recorded.get(name) != found.get(name))
