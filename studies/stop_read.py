"""The stop's read against the evaluation's, per demo seed (issue 66, part 1).

For each seed: run ``hf-unlearn demo --seed S`` (skipped where ``OUT/seed-S`` already holds a run), then read, at the
saved weights, the Min-K% AUC of the forget10 answers against the calibration answers as the evaluation reads it
(``qa_membership_reads``), beside what the stop acted on (its last exact read; on code before the exact read, the
last probe's ``calibration_min_k_auc``). Prints one JSON line per seed and a Markdown table.

    python studies/stop_read.py OUT --seeds 0 1 2 [--cache_dir C] [--pythonpath OLD_CHECKOUT]

``--pythonpath`` runs the demo from another checkout (the code before a change); the fresh read is this checkout's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_unlearn.benchmarks import load_split
from hf_unlearn.evaluation.bundle import qa_membership_reads
from hf_unlearn.objectives.masc import last_exact_read


def run_demo(out: str, seed: int, cache_dir: str | None, pythonpath: str | None) -> None:
    if os.path.exists(os.path.join(out, "unlearn_record.json")):
        return
    command = [sys.executable, "-m", "hf_unlearn.cli.main", "demo", "--seed", str(seed), "--output_dir", out]
    if cache_dir:
        command += ["--cache_dir", cache_dir]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)


def measure(out: str) -> dict:
    with open(os.path.join(out, "unlearn_record.json")) as f:
        record = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    tokenizer = AutoTokenizer.from_pretrained(out)
    forget = [dict(r) for r in load_split("forget10")]
    calibration = [dict(r) for r in load_split("calibration")]
    fresh = qa_membership_reads(model, tokenizer, forget, calibration, attacks=("min_k",))
    read = last_exact_read(record["probe_history"])  # before the exact read: the last probe, which decided
    return {
        "stop_step": record.get("stop_step"),
        "stop_kind": record.get("stop_kind"),
        "stop_auc": read.get("calibration_min_k_auc"),
        "stop_auc_step": read.get("step"),
        "fresh_auc": fresh["auc"]["min_k"],
        "fresh_interval": fresh["auc_interval"]["min_k"],
        "answers": [len(forget), len(calibration)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--pythonpath", default=None)
    cli = parser.parse_args()
    rows = []
    for seed in cli.seeds:
        out = os.path.join(cli.output_dir, f"seed-{seed}")
        run_demo(out, seed, cli.cache_dir, cli.pythonpath)
        row = {"seed": seed, **measure(out)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    print("\n| seed | stop | stop's AUC (step) | fresh AUC at the saved weights [95 % interval] | apart |")
    print("|---|---|---|---|---|")
    for r in rows:
        low, high = r["fresh_interval"]
        apart = r["stop_auc"] - r["fresh_auc"]
        print(
            f"| {r['seed']} | {r['stop_kind']} at {r['stop_step']} | {r['stop_auc']:.3f} ({r['stop_auc_step']}) | "
            f"{r['fresh_auc']:.3f} [{low:.3f}, {high:.3f}] | {apart:+.3f} |"
        )


if __name__ == "__main__":
    main()
