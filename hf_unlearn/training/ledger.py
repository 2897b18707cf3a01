"""The ledger of unlearning requests a model has gone through: ``unlearning_ledger.json`` next to its weights.

Deletion requests arrive one after another (MUSE's "sustainability", Shi et al., arXiv 2407.06460, §3.2); a model
unlearned again must say what it forgot before. Each entry names one request by a hash of its forget set (never
the data itself), when it was done, how, where and why training stopped, and the metrics after it. The entries of
earlier requests travel with the model: :class:`~hf_unlearn.UnlearnTrainer` reads the ledger of the folder the
model was loaded from and the run record carries them (``earlier_requests``); saving writes them back with this
run's entry appended, and the model card shows the whole list. Like :mod:`hf_unlearn.training.record` this is plain
data.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

from .record import UnlearnRecord

LEDGER_FILE = "unlearning_ledger.json"
#: Columns that say what an example is; tokenized ids are hashed only when none of them is there.
_CONTENT_COLUMNS = ("question", "answer", "text", "prompt", "continuation")
_AFTER_METRICS = ("rouge_l_recall", "probability", "exact_match", "truth_ratio")


def forget_set_fingerprint(examples: Iterable[Mapping[str, Any]]) -> str:
    """``sha256:<hex>`` of a forget set's content (its text columns, else its token ids), independent of row order,
    so the same request has the same fingerprint whichever way it was shuffled or tokenized."""
    rows = []
    for example in examples:
        content = {key: example[key] for key in _CONTENT_COLUMNS if key in example}
        if not content:
            # Token ids may be lists, tensors or arrays (a dataset in torch or numpy format).
            content = {key: [int(t) for t in example[key]] for key in ("input_ids", "labels") if key in example}
        rows.append(json.dumps(content, sort_keys=True, ensure_ascii=False))
    digest = hashlib.sha256("\n".join(sorted(rows)).encode()).hexdigest()
    return f"sha256:{digest}"


def ledger_entry(record: UnlearnRecord) -> dict[str, Any]:
    """This run's entry, from its record: the request, its forget set's fingerprint and size, the date, the method,
    where and why it stopped, and the metrics after it (the job's measurements, else the last stopping probe)."""
    forget = record.forget_dataset or {}
    after = {
        split: {key: values[key] for key in _AFTER_METRICS if key in values}
        for split, values in (record.after or {}).items()
    }
    if not after and record.probe_history:
        last = record.probe_history[-1]
        after = {"probe": {k: v for k, v in last.items() if k != "step" and isinstance(v, int | float)}}
    return {
        "request": len(record.earlier_requests) + 1,
        "name": record.extra.get("request_name") or forget.get("name"),
        "forget_fingerprint": record.forget_fingerprint,
        "num_forget_examples": forget.get("num_examples"),
        "date": record.finished_at,
        "method": record.method,
        "gradient_surgery": record.gradient_surgery,
        "base_model": record.base_model,
        "stop_step": record.global_step,
        "stop_kind": record.stop_kind,
        "stop_reason": record.stop_reason,
        "complete": record.complete,
        "after": after,
    }


def full_ledger(record: UnlearnRecord) -> list[dict[str, Any]]:
    """The earlier requests the model came with, then this run's (not for a record written before the ledger
    existed, which has no fingerprint of its forget set)."""
    own = [ledger_entry(record)] if record.forget_fingerprint is not None else []
    return [*record.earlier_requests, *own]


def load_ledger(path: str | os.PathLike[str] | None) -> list[dict[str, Any]]:
    """The entries of ``unlearning_ledger.json`` (or of the folder holding it); ``[]`` when there is none."""
    if path is None:
        return []
    path = os.fspath(path)
    if os.path.isdir(path):
        path = os.path.join(path, LEDGER_FILE)
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        data = json.load(f)
    entries = data.get("requests") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path} is not an unlearning ledger: expected {{'requests': [...]}}.")
    return entries


def save_ledger(entries: list[dict[str, Any]], output_dir: str) -> str:
    """Write ``unlearning_ledger.json`` into ``output_dir``; returns its path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LEDGER_FILE)
    with open(path, "w") as f:
        json.dump({"requests": entries}, f, indent=2)
    return path


def _after_phrase(after: Mapping[str, Mapping[str, Any]]) -> str:
    parts = []
    for split in ("forget", "retain"):
        values = after.get(split) or {}
        if "rouge_l_recall" in values:
            parts.append(f"{split} ROUGE-L {values['rouge_l_recall']:.3f}")
    probe = after.get("probe") or {}
    if not parts and "violation_rate" in probe:
        parts.append(f"violation rate {probe['violation_rate']:.3f}")
    return ", ".join(parts) or "-"


def ledger_markdown(entries: list[dict[str, Any]]) -> str:
    """The ledger as a markdown table (the model card's "Unlearning requests" section)."""
    lines = [
        "| # | date (UTC) | forget set | method | stopped at step | why | after |",
        "|---|---|---|---|---|---|---|",
    ]
    for entry in entries:
        fingerprint = (entry.get("forget_fingerprint") or "").removeprefix("sha256:")[:12]
        forget = " ".join(
            filter(None, [entry.get("name"), f"({entry.get('num_forget_examples')} examples, `{fingerprint}`)"])
        )
        method = entry.get("method", "?") + (
            f" + {entry['gradient_surgery']}" if entry.get("gradient_surgery") not in (None, "sum") else ""
        )
        why = (entry.get("stop_reason") or "-").replace("|", "\\|")
        lines.append(
            f"| {entry.get('request')} | {(entry.get('date') or '-')[:19]} | {forget} | {method} | "
            f"{entry.get('stop_step')} | {why} | {_after_phrase(entry.get('after') or {})} |"
        )
    return "\n".join(lines)


__all__ = [
    "LEDGER_FILE",
    "forget_set_fingerprint",
    "full_ledger",
    "ledger_entry",
    "ledger_markdown",
    "load_ledger",
    "save_ledger",
]


def loaded_from(model: Any, is_peft: bool) -> str | None:
    """The local folder the (base) model was loaded from, if it was loaded from one: where its request ledger is."""
    base = model.get_base_model() if is_peft else model
    path = getattr(getattr(base, "config", None), "_name_or_path", None) or None
    return path if path and os.path.isdir(path) else None
