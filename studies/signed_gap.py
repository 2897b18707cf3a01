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

import json
from typing import Any

import torch
from stop_floor import MATCHES, by_example, saved_adapters, study_arguments, study_setting, subset

from hf_unlearn.objectives.margin import NeverSeenLevels, matched_thresholds, spread_by_id, token_levels


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
    args = study_arguments(__doc__.split("\n\n")[0])
    setting, read, authors = study_setting(args)
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
        for step, model in saved_adapters(args.run, args.every, setting.target_model):
            measured = read(model, ("forget", "holdout"))
            entry = {
                "step": step,
                **{f"forget {k}": v for k, v in readings(measured["forget"], cal).items()},
                **{f"holdout {k}": v for k, v in readings(measured["holdout"], cal).items()},
            }
            trajectory.append(entry)
            print(json.dumps(entry), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "trajectory": trajectory}, f, indent=1)


if __name__ == "__main__":
    main()
