"""Is the calibrated stop's floor on TOFU the one-sided statistic's own bias? (issue 32, section 11)

The probe's gap is the mean over forget tokens of ``relu(m_i - c_i)``, each margin's excess over its matched
never-seen counterpart (:func:`~hf_unlearn.objectives.margin.calibration_gap`). Two samples of the *same* never-seen
distribution matched token by token still differ token by token, and the relu keeps every positive difference: the
statistic has a positive floor that grows with the matching noise. This script reads, with the same matched
thresholds (:func:`~hf_unlearn.objectives.margin.matched_thresholds`, ``token`` and ``id_spread`` levels), the
one-sided gap next to the *signed* mean ``mean(m_i - c_i)``, which is zero in expectation for two never-seen samples,
for the rows of ``studies/stop_floor.py`` and, with ``--run``, along a saved run.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/signed_gap.py --benchmark tofu --tofu_dir ../shared/tofu \\
        --author_offset 5 [--run tofuB/B-idspread-kl5-s0 --every 100] --output signedB.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any

import torch
from peft import PeftModel
from stop_floor import MATCHES, by_example, margins_of, subset

from hf_unlearn import build_qa_dataset
from hf_unlearn.cli.arguments import CompareArguments
from hf_unlearn.jobs.compare_setups import embedded_setting, tofu_setting
from hf_unlearn.objectives.margin import NeverSeenLevels, matched_thresholds, spread_by_id, token_levels
from hf_unlearn.training.config import UnlearnConfig


def differences(measured: dict[str, Any], never_seen: dict[str, Any], match: str) -> torch.Tensor:
    """Each measured token's margin minus its never-seen counterpart, as the probe matches them."""
    ids, levels, own, _, spread = token_levels(
        never_seen["margins"], never_seen["tokens"], torch.unique(measured["tokens"])
    )
    offsets = None
    if match == "id_spread":
        spread, offsets = spread_by_id(never_seen["margins"], never_seen["tokens"], ids, levels)
    reference = NeverSeenLevels(ids, levels, None, spread if match == "id_spread" else None, offsets)
    margins = measured["margins"].detach().float()
    return margins - matched_thresholds(margins, own, measured["tokens"], reference)


def readings(measured: dict[str, Any], never_seen: dict[str, Any]) -> dict[str, float]:
    out = {}
    for match in MATCHES:
        diff = differences(measured, never_seen, match)
        out[f"one-sided {match}"] = torch.relu(diff).mean().item()
        out[f"signed {match}"] = diff.mean().item()
    return out


def leave_one_out(pieces: list[dict[str, torch.Tensor]], authors: list[Any]) -> dict[str, list[float]]:
    """Each calibration author against the other calibration authors, both statistics."""
    result: dict[str, list[float]] = {}
    for name in sorted(set(authors)):
        inside = [i for i, a in enumerate(authors) if a == name]
        rest = [i for i, a in enumerate(authors) if a != name]
        for key, value in readings(subset(pieces, inside), subset(pieces, rest)).items():
            result.setdefault(key, []).append(value)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--benchmark", choices=("tofu", "embedded"), default="tofu")
    parser.add_argument("--tofu_dir", default=None)
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--num_calibration_authors", type=int, default=4)
    parser.add_argument("--num_holdout_authors", type=int, default=4)
    parser.add_argument("--run", default=None, help="A masc_landing.py --track_stop_statistics output folder.")
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    if args.benchmark == "tofu":
        cli = CompareArguments(
            benchmark="tofu", tofu_dir=args.tofu_dir, author_offset=args.author_offset, seeds=[0],
            num_calibration_authors=args.num_calibration_authors, num_holdout_authors=args.num_holdout_authors,
        )  # fmt: skip
        setting = tofu_setting(cli)
    else:
        setting = embedded_setting(CompareArguments(benchmark="embedded", seeds=[0]))
    tokenizer = setting.tokenizer
    config = UnlearnConfig(output_dir="/tmp/signed_gap", method="masc", report_to="none")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    examples = {
        "forget": [dict(e) for e in setting.forget],
        "calibration": [dict(e) for e in setting.calibration],
        "holdout": [dict(e) for e in build_qa_dataset(setting.holdout_records, tokenizer)],
    }
    authors = [r.get("author", i) for i, r in enumerate(setting.calibration_records)]

    def read(model: Any, sets: tuple[str, ...] = ("forget", "calibration", "holdout")) -> dict[str, dict[str, Any]]:
        model.eval()
        return {s: margins_of(model, examples[s], pad, config) for s in sets}

    target, never = read(setting.target_model), read(setting.reference_model)
    cal = target["calibration"]
    rows = {
        "target forget (the probe at step 0)": readings(target["forget"], cal),
        "target holdout (never-seen under the target)": readings(target["holdout"], cal),
        "never-trained forget (where the stop should read)": readings(never["forget"], cal),
        "never-trained holdout": readings(never["holdout"], cal),
        "never-trained forget vs never-trained calibration": readings(never["forget"], never["calibration"]),
        "target calibration, leave one author out": leave_one_out(by_example(cal), authors),
    }
    for name, row in rows.items():
        print(json.dumps({"row": name, **row}), flush=True)
    trajectory = []
    if args.run:
        folder = os.path.join(args.run, "trajectory")
        steps = sorted(int(m.group(1)) for n in os.listdir(folder) if (m := re.fullmatch(r"step-(\d+)", n)))
        base = setting.target_model
        for step in (s for s in steps if s % args.every == 0):
            model = PeftModel.from_pretrained(base, os.path.join(folder, f"step-{step}")).eval()
            measured = read(model, ("forget", "holdout"))
            entry = {
                "step": step,
                **{f"forget {k}": v for k, v in readings(measured["forget"], cal).items()},
                **{f"holdout {k}": v for k, v in readings(measured["holdout"], cal).items()},
            }
            trajectory.append(entry)
            print(json.dumps(entry), flush=True)
            base = model.unload()
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "trajectory": trajectory}, f, indent=1)


if __name__ == "__main__":
    main()
