"""What the Min-K% stop reads of a finished TOFU run, against the region (issue 32, masc_landing section 13): under the
target, the never-trained model and the run's saved adapter, every role's Min-K% (k 0.4, the region's attack), and the
AUC of the forget answers against the region's holdout authors (the region), the calibration authors under the same
model ("current") and under the target ("start", what ``stop_target='membership'`` reads), the last both with every
calibration answer and with the probe's seeded sample of ``--probe_size``.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/auc_reference.py --tofu_dir ../shared/tofu --author_offset 5 \
        --run tofuB/B-memb-lr2e4-s0 [--seed 0] [--probe_size 64]

The split's roles are masc_landing's with four calibration and four holdout authors. Writes ``RUN/auc_reference.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from typing import Any

from peft import PeftModel

from hf_unlearn.cli.arguments import CompareArguments
from hf_unlearn.evaluation.bundle import qa_attack_scores
from hf_unlearn.evaluation.membership import membership_auc
from hf_unlearn.jobs.compare_setups import tofu_setting


def split_and_run(tofu_dir: str, author_offset: int, run: str, seed: int = 0) -> tuple[Any, Any]:
    """masc_landing's split (four calibration and four holdout authors; the target and the never-trained model from
    compare's cache) and the run's saved adapter on a copy of the target, in eval mode."""
    cli = CompareArguments(
        benchmark="tofu", tofu_dir=tofu_dir, author_offset=author_offset, seeds=[seed],
        num_retain_authors=4, num_calibration_authors=4, num_holdout_authors=4, real_knowledge_size=50,
        lora_dropout=0.0,
    )  # fmt: skip
    setting = tofu_setting(cli)
    copy = type(setting.target_model)(setting.target_model.config)
    copy.load_state_dict(setting.target_model.state_dict())
    return setting, PeftModel.from_pretrained(copy, os.path.join(run, "adapter")).eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tofu_dir", required=True)
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--run", required=True, help="A masc_landing output folder (its adapter/).")
    parser.add_argument("--seed", type=int, default=0, help="The run's seed (the probe's calibration sample).")
    parser.add_argument("--probe_size", type=int, default=64)
    args = parser.parse_args()
    setting, run = split_and_run(args.tofu_dir, args.author_offset, args.run, args.seed)
    models = {"target": setting.target_model, "never_trained": setting.reference_model, "run": run}
    roles = {
        "forget": setting.forget_records, "calibration": setting.calibration_records,
        "holdout": setting.holdout_records,
    }  # fmt: skip
    scores = {
        (model, role): qa_attack_scores(models[model], setting.tokenizer, [dict(r) for r in records])
        for model in models
        for role, records in roles.items()
    }
    # The probe's calibration sample: ProbeSets.sample draws probe_size of them with seed + 2, kept in order.
    import torch

    order = torch.randperm(len(roles["calibration"]), generator=torch.Generator().manual_seed(args.seed + 2))
    sample = sorted(order[: args.probe_size].tolist())
    result: dict[str, dict[str, float]] = {}
    for model in ("never_trained", "run"):
        forget = scores[(model, "forget")]
        start = scores[("target", "calibration")]
        result[model] = {
            "region: forget vs holdout, same model": membership_auc(forget, scores[(model, "holdout")]),
            "current: forget vs calibration, same model": membership_auc(forget, scores[(model, "calibration")]),
            "start: forget vs calibration under the target": membership_auc(forget, start),
            f"start, the probe's {len(sample)}-answer sample": membership_auc(forget, [start[i] for i in sample]),
        }
        for role in roles:
            result[model][f"{role} mean Min-K%"] = statistics.fmean(scores[(model, role)])
    print(json.dumps(result, indent=1))
    with open(os.path.join(args.run, "auc_reference.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
