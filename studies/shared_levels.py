"""Where MASC holds the forget answers' shared words (issue 32, section 8 of docs/studies/masc_landing.md): every
answer token whose id both the forget answers and the calibration answers use, as its margin minus that id's mean
never-seen margin under the start model (the level ``calibration_match="token"`` holds it to), for the forget,
calibration and holdout answers under the start model and under an adapter ``studies/masc_landing.py
--track_stop_statistics`` saved: does the run reach the levels, with never-seen data's spread around them, and do
never-seen answers' shared words stay at their start levels under the unlearned model?

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/shared_levels.py --tofu_dir ../shared/tofu --author_offset 5 \\
        --run tofuB/B-kl5-cal4-track-s0 --step 800
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from masc_landing import token_table  # the studies next to this one (scripts run from their folder)
from peft import PeftModel
from stop_replay import tofu_sets


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[int(share * (len(ordered) - 1))]


def summary(rows: list[dict], levels: dict[int, float]) -> dict[str, float]:
    """Deviation from the level (mean, percentiles, mean excess) and log-probability of the shared tokens."""
    shared = [r for r in rows if r["id"] in levels]
    deviations = [r["margin"] - levels[r["id"]] for r in shared]
    log_probs = [r["log_prob"] for r in shared]
    return {
        "shared_tokens": len(shared),
        "shared_share": len(shared) / len(rows),
        "deviation_mean": statistics.mean(deviations),
        **{f"deviation_p{p}": percentile(deviations, p / 100) for p in (10, 50, 90)},
        "excess_mean": statistics.mean(max(0.0, d) for d in deviations),
        "log_prob_mean": statistics.mean(log_probs),
        "log_prob_p10": percentile(log_probs, 0.1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tofu_dir", required=True)
    parser.add_argument("--run", required=True, help="A masc_landing.py --track_stop_statistics output folder.")
    parser.add_argument("--step", type=int, required=True, help="Which saved adapter (trajectory/step-N).")
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--num_calibration_authors", type=int, default=4)
    parser.add_argument("--num_holdout_authors", type=int, default=4)
    args = parser.parse_args()
    setting, sets = tofu_sets(
        args.tofu_dir, args.author_offset, 4, args.num_calibration_authors, args.num_holdout_authors
    )
    tokenizer, target = setting.tokenizer, setting.target_model
    tables = {(name, "start"): token_table(target, tokenizer, records) for name, records in sets.items()}
    model = PeftModel.from_pretrained(target, os.path.join(args.run, "trajectory", f"step-{args.step}")).eval()
    tables.update({(name, "step"): token_table(model, tokenizer, records) for name, records in sets.items()})
    forget_ids = {r["id"] for r in tables[("forget", "start")]}
    by_id: dict[int, list[float]] = {}
    for row in tables[("calibration", "start")]:
        if row["id"] in forget_ids:
            by_id.setdefault(row["id"], []).append(row["margin"])
    levels = {token: statistics.mean(margins) for token, margins in by_id.items()}
    result = {f"{name}@{when}": summary(rows, levels) for (name, when), rows in tables.items()}
    for key, values in result.items():
        print(key, json.dumps({k: round(v, 3) for k, v in values.items()}))
    with open(os.path.join(args.run, f"shared_levels-{args.step}.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
