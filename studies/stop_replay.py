"""Where a Min-K% condition on the calibrated stop would have ended a MASC run (issue 32), read offline from the
adapters ``studies/masc_landing.py --track_stop_statistics`` saved every 50 steps: at each saved step, the Min-K%
AUC of the forget answers against the calibration answers as the stop would read it (the calibration answers under
the model before unlearning: ``calibration_reference='start'``, the default; and under the model at that step:
'current'), beside the region's membership AUC (forget against holdout) at that step.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/stop_replay.py --tofu_dir ../shared/tofu --author_offset 5 \\
        --num_calibration_authors 4 --num_holdout_authors 4 --run tofuB/B-kl5-cal4-track-s0
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

from peft import PeftModel

from hf_unlearn.cli.arguments import CompareArguments
from hf_unlearn.evaluation.bundle import qa_attack_scores
from hf_unlearn.evaluation.membership import membership_auc
from hf_unlearn.jobs.compare_setups import tofu_setting


def tofu_sets(
    tofu_dir: str, author_offset: int, num_retain_authors: int, num_calibration_authors: int, num_holdout_authors: int
) -> tuple[Any, dict[str, list[dict]]]:
    """A TOFU split as ``hf-unlearn compare --benchmark tofu`` builds it (its cached target), and its forget,
    calibration and holdout records."""
    cli = CompareArguments(
        benchmark="tofu", tofu_dir=tofu_dir, author_offset=author_offset, seeds=[0],
        num_retain_authors=num_retain_authors, num_calibration_authors=num_calibration_authors,
        num_holdout_authors=num_holdout_authors,
    )  # fmt: skip
    setting = tofu_setting(cli)
    roles = {"forget": "forget_records", "calibration": "calibration_records", "holdout": "holdout_records"}
    return setting, {name: [dict(r) for r in getattr(setting, field)] for name, field in roles.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tofu_dir", required=True)
    parser.add_argument("--run", required=True, help="A masc_landing.py --track_stop_statistics output folder.")
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--num_retain_authors", type=int, default=4)
    parser.add_argument("--num_calibration_authors", type=int, default=2)
    parser.add_argument("--num_holdout_authors", type=int, default=2)
    args = parser.parse_args()
    setting, sets = tofu_sets(
        args.tofu_dir, args.author_offset, args.num_retain_authors, args.num_calibration_authors,
        args.num_holdout_authors,
    )  # fmt: skip
    tokenizer, target = setting.tokenizer, setting.target_model
    start = qa_attack_scores(target, tokenizer, sets["calibration"])
    folder = os.path.join(args.run, "trajectory")
    steps = sorted(int(m.group(1)) for name in os.listdir(folder) if (m := re.fullmatch(r"step-(\d+)", name)))
    rows = []
    for step in steps:
        model = PeftModel.from_pretrained(target, os.path.join(folder, f"step-{step}")).eval()
        scores = {name: qa_attack_scores(model, tokenizer, records) for name, records in sets.items()}
        rows.append({
            "step": step,
            "membership_auc": membership_auc(scores["forget"], scores["holdout"]),
            "auc_vs_calibration_start": membership_auc(scores["forget"], start),
            "auc_vs_calibration_current": membership_auc(scores["forget"], scores["calibration"]),
        })  # fmt: skip
        print(json.dumps(rows[-1]), flush=True)
        target = model.unload()  # the base weights back, without the adapter
    with open(os.path.join(args.run, "replay.json"), "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
