"""How much of the Min-K% stop's window reading is sampling (issue 32, masc_landing section 14). At a finished TOFU
run's saved adapter: the forget answers' Min-K% (``qa_attack_scores``, the region's attack) against every calibration
answer held under the target (the start reference); then the AUC of windows drawn as training draws them (a new
permutation of the forget answers each epoch, batch 4, the last ``probe_size`` answers), scored at those weights.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/window_noise.py --tofu_dir ../shared/tofu --author_offset 5 \
        --run tofuB/B-memb80-s0 [--draws 2000]

The split's roles are masc_landing's with four calibration and four holdout authors. Writes ``RUN/window_noise.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics

from auc_reference import split_and_run

from hf_unlearn.evaluation.bundle import qa_attack_scores
from hf_unlearn.evaluation.membership import membership_auc


def window_aucs(
    forget: list[float], calibration: list[float], draws: int, size: int, batch: int, seed: int
) -> list[float]:
    """AUCs of ``draws`` windows: the last ``size`` answers of epochs of shuffled answers, cut at a random step."""
    rng = random.Random(seed)
    count = len(forget)
    aucs = []
    for _ in range(draws):
        order: list[int] = []
        while len(order) < size + count:
            epoch = list(range(count))
            rng.shuffle(epoch)
            order += epoch
        end = len(order) - rng.randrange(0, count, batch)
        aucs.append(membership_auc([forget[i] for i in order[:end][-size:]], calibration))
    return aucs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tofu_dir", required=True)
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--run", required=True, help="A masc_landing output folder (its adapter/).")
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--probe_size", type=int, default=64)
    parser.add_argument("--batch_size", type=int, default=4)
    args = parser.parse_args()
    setting, run = split_and_run(args.tofu_dir, args.author_offset, args.run)
    calibration = qa_attack_scores(
        setting.target_model, setting.tokenizer, [dict(r) for r in setting.calibration_records]
    )
    forget = qa_attack_scores(run, setting.tokenizer, [dict(r) for r in setting.forget_records])
    aucs = sorted(window_aucs(forget, calibration, args.draws, args.probe_size, args.batch_size, seed=0))
    result = {
        "all answers": membership_auc(forget, calibration),
        "window mean": statistics.fmean(aucs),
        "window sd": statistics.pstdev(aucs),
        "window 5%": aucs[len(aucs) // 20],
        "window 95%": aucs[len(aucs) * 19 // 20],
    }
    print(json.dumps(result, indent=1))
    with open(os.path.join(args.run, "window_noise.json"), "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
