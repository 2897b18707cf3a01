"""Merge the compare.json of a comparison split over processes (`hf-unlearn compare --masc false ...` and
`--methods none ...` on the same benchmark) into one compare.json / compare.md / compare.png, and print MASC's probe
history (where each stop fired).

    python studies/merge_compare.py OUT_DIR A/compare.json B/compare.json [...]

The parts must share their region: the target and never-trained models are measured again by every process, and
the figures must agree (they are deterministic on one machine); a disagreement is an error that names the figure.
"""

from __future__ import annotations

import argparse
import json
import math

from hf_unlearn.evaluation import fluent_like
from hf_unlearn.jobs import compare_table, write_compare

REGION_KEYS = (
    "forget_rouge_l_recall_max",
    "membership_auc_reference",
    "retain_rouge_l_recall_min",
    "real_knowledge_mean_min",
)


def merge(parts: list[dict]) -> dict:
    merged = dict(parts[0])
    merged["methods"], merged["runs"] = {}, {}
    for part in parts:
        for key in REGION_KEYS:
            mine, first = part["region"].get(key), parts[0]["region"].get(key)
            if (mine is None) != (first is None) or (mine is not None and not math.isclose(mine, first, abs_tol=1e-6)):
                raise ValueError(f"The parts were measured on different regions: {key} {first} vs {mine}.")
        for name, summary in part["methods"].items():
            if name in merged["methods"]:
                raise ValueError(f"Method {name!r} is in more than one part.")
            merged["methods"][name] = summary
            merged["runs"][name] = part["runs"][name]
    # MASC first, as in one process.
    order = sorted(merged["methods"], key=lambda name: name != "masc")
    merged["methods"] = {name: merged["methods"][name] for name in order}
    merged["runs"] = {name: merged["runs"][name] for name in order}
    merged["learning_rates"] = sorted({lr for part in parts for lr in part["learning_rates"]})
    rejudge_fluency(merged)
    return merged


def rejudge_fluency(result: dict) -> None:
    """`fluent` by the current rule (the NLL level of the target's answers), for parts written before it."""
    region = result["region"]
    never = region["never_trained"]["forget"].get("fluency")
    level = region["before"]["forget"].get("fluency", {}).get("reference_nll")
    if never is None:
        return
    for runs in result["runs"].values():
        for run in runs:
            final = run["epochs"][-1]["forget"] if "epochs" in run else run["forget"]
            fluency = final.get("fluency") or run["forget"].get("fluency")
            if fluency:
                run["fluent"] = fluent_like(fluency, never, fluent_nll=level)


def probe_history_table(result: dict) -> str:
    lines = []
    for run in result["runs"].get("masc", []):
        lines.append(f"\nMASC lr {run['learning_rate']:g} seed {run['seed']}: {run.get('stop_reason', '')}")
        lines.append("| step | violation (train) | violation (never-seen) | gap | Min-K% AUC | read exactly | "
                     "running Min-K% AUC | retain prob | retain measured | forget prob (train) |")  # fmt: skip
        lines.append("|---" * 10 + "|")
        for h in run.get("probe_history", []):
            cells = [
                h.get("violation_rate_train"), h.get("violation_rate_calibration"), h.get("calibration_gap"),
                h.get("calibration_min_k_auc"), h.get("stop_read_exact"), h.get("running_calibration_min_k_auc"),
                h.get("retain_probability"), h.get("retain_probability_measured"), h.get("forget_probability_train"),
            ]  # fmt: skip
            text = ["-" if c is None else f"{c:.3f}" for c in cells]
            lines.append(f"| {h['step']} | " + " | ".join(text) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("parts", nargs="+")
    cli = parser.parse_args()
    parts = []
    for path in cli.parts:
        with open(path) as f:
            parts.append(json.load(f))
    merged = merge(parts)
    write_compare(merged, cli.output_dir)
    print(compare_table(merged))
    print(probe_history_table(merged))


if __name__ == "__main__":
    main()
