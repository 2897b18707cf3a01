"""What a model card says to machines: the Hub's ``model-index`` (its results, which the Hub shows) and the
``unlearning`` block, a record of what was forgotten and how well, in the card's YAML; and whether a name is a Hub id.
The block's schema is documented in docs/hub.md so that other tools can write and read it too;
:data:`UNLEARNING_SCHEMA` names its version."""

from __future__ import annotations

import math
import os
import re
from typing import Any

from ..training.record import UnlearnRecord

#: The name and version of the ``unlearning`` block's schema (docs/hub.md).
UNLEARNING_SCHEMA = "hf_unlearn/unlearning-card/v1"

_HUB_ID = re.compile(r"^[\w.-]+/[\w.-]+$")

#: The metrics of the run record's before/after tables that go into the model-index, per split.
INDEXED_METRICS = ("rouge_l_recall", "probability", "truth_ratio", "exact_match")


def is_hub_id(name: str | None) -> bool:
    """Whether ``name`` reads as ``owner/name`` on the Hub and is not a local folder."""
    return bool(name) and bool(_HUB_ID.match(name)) and not os.path.exists(name)


def _number(value: Any) -> float | None:
    """A finite float, else None (YAML has no NaN a reader can rely on)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _interval(values: Any) -> list[float] | None:
    if not values or len(values) != 2:
        return None
    low, high = (_number(v) for v in values)
    return None if low is None or high is None else [low, high]


def membership_places(record: UnlearnRecord) -> tuple[tuple[str, dict[str, Any] | None, str], ...]:
    """Where a record may hold its membership measurement, ``(source, measured, key of its verdict)``, in the order the
    card and `push` read them: the audit's, the demo's evaluation, a MUSE evaluation's after unlearning."""
    evaluation = record.evaluation or {}
    return (
        ("audit", (record.audit or {}).get("membership"), "attacks"),
        ("evaluation", evaluation.get("membership"), "membership"),
        ("muse", (evaluation.get("muse") or {}).get("after"), "membership"),
    )


def membership_source(record: UnlearnRecord) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """Where the record's membership verdict is, the measurement it judged and the verdict: the first of
    :func:`membership_places` with both; None when the run was never judged."""
    for source, measured, key in membership_places(record):
        if measured and measured.get("auc") and measured.get(key):
            return source, measured, measured[key]
    return None


def membership_rows(record: UnlearnRecord) -> list[dict[str, Any]]:
    """Each attack's AUC with its interval, the never-trained model's level where known, the difference with its
    interval, and the verdict ("lands", "tells", "too few answers to judge")."""
    found = membership_source(record)
    if found is None:
        return []
    _, measured, verdict = found
    rows = []
    for attack, row in verdict.get("per_attack", {}).items():
        rows.append(
            {
                "attack": attack,
                "auc": _number(row.get("auc")),
                "auc_interval": _interval(row.get("auc_interval") or (measured.get("auc_interval") or {}).get(attack)),
                "never_trained_auc": _number(row.get("level")) if row.get("level_from") == "never_trained" else None,
                "difference": _number(row.get("off")),
                "difference_interval": _interval(row.get("off_interval")),
                "verdict": row.get("verdict") or ("tells" if row.get("distinguishes") else "lands"),
            }
        )
    return rows


def _check(record: UnlearnRecord, name: str) -> dict[str, Any] | None:
    verdict = ((record.audit or {}).get("verdicts") or {}).get(name)
    if verdict is None:
        return None
    return {"passed": verdict.get("passed"), "finding": verdict.get("finding"), "threshold": verdict.get("threshold")}


def unlearning_block(record: UnlearnRecord) -> dict[str, Any]:
    """The card's ``unlearning`` block (docs/hub.md): method and papers, base model, the forget set's name, size and
    fingerprint, how the run stopped, each membership attack's reading, the quantization and relearning verdicts,
    and what departs from the papers. Values that were not measured are ``null``."""
    forget = record.forget_dataset or {}
    found = membership_source(record)
    landed = None if found is None else bool(found[2].get("landed"))
    return {
        "schema": UNLEARNING_SCHEMA,
        "method": record.method,
        "objectives": {"forget": record.forget_objective, "retain": record.retain_objective},
        "papers": [{"title": p.get("title"), "url": p.get("url")} for p in record.papers],
        "base_model": record.base_model,
        "adapter": record.adapter,
        "forget_set": {
            "name": forget.get("name"),
            "num_examples": forget.get("num_examples"),
            "fingerprint": record.forget_fingerprint,
        },
        "stop": {
            "rule": record.hyperparameters.get("stop_target") if record.stopping_rule else None,
            "kind": record.stop_kind,
            "step": record.stop_step,
            "reason": record.stop_reason,
        },
        "membership": {
            "judged_by": None if found is None else found[0],
            "landed": landed,
            "tolerance": None if found is None else _number(found[2].get("tolerance")),
            "attacks": membership_rows(record),
        },
        "quantization": _check(record, "quantization"),
        "relearning": _check(record, "relearning"),
        "beyond_paper": list(record.beyond_paper),
        "pushed_unverified": record.extra.get("pushed_unverified"),
    }


def _result(dataset_name: str, split: str, metric_type: str, metric_name: str, value: float) -> Any:
    """One ``huggingface_hub.EvalResult`` of an unlearning run (the dataset type is its Hub id, else ``local``)."""
    from huggingface_hub import EvalResult

    hub_id = dataset_name.split(" / ")[0]
    return EvalResult(
        task_type="text-generation",
        task_name="Machine unlearning",
        dataset_type=hub_id if is_hub_id(hub_id) else "local",
        dataset_name=dataset_name,
        dataset_split=split,
        metric_type=metric_type,
        metric_name=metric_name,
        metric_value=value,
    )


def eval_results(record: UnlearnRecord) -> list[Any]:
    """The Hub's ``model-index`` results: each before/after metric of the forget and retain sets after unlearning,
    and each membership attack's AUC on the forget set (``huggingface_hub.EvalResult``)."""
    results = []
    for split, metrics in (record.after or {}).items():
        name = (getattr(record, f"{split}_dataset", None) or {}).get("name") or f"{split} set"
        for metric in INDEXED_METRICS:
            value = _number((metrics or {}).get(metric))
            if value is not None:
                results.append(_result(name, split, metric, f"{split} {metric} after unlearning", value))
    forget = (record.forget_dataset or {}).get("name") or "forget set"
    for row in membership_rows(record):
        if row["auc"] is not None:
            label = f"membership AUC ({row['attack']}; 0.5: like never-seen data)"
            results.append(_result(forget, "forget", "auc", label, row["auc"]))
    return results


__all__ = [
    "INDEXED_METRICS",
    "UNLEARNING_SCHEMA",
    "eval_results",
    "is_hub_id",
    "membership_places",
    "membership_rows",
    "unlearning_block",
]
