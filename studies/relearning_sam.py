"""MASC and NPO+KLR with and without sharpness-aware unlearning (``sam_rho``) on the embedded benchmark, each then
attacked by the relearning sweep (``hf-unlearn relearn-check --sweep``'s default grid: lr 1e-4/1e-3 x 10/20/50 steps on
half of the forget set, the other half measured, the retain-only model relearned the same way as the baseline).

    OMP_NUM_THREADS=1 python studies/relearning_sam.py --seeds 0 1 --rhos 0 0.1 [--methods masc npo_klr]

Per run: forget / retain ROUGE-L recall after unlearning (before the attack), the training wall time, and the sweep's
worst case (excess ROUGE-L over the reference, largest recovered share of the gap to the target). Prints one
markdown row per run as it finishes, and a table at the end; the study page is docs/studies/relearning_sam.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn import UnlearnConfig  # noqa: E402
from hf_unlearn.benchmarks import learn_retain_only_model, learn_target_model, load_split  # noqa: E402
from hf_unlearn.cli.arguments import DemoArguments  # noqa: E402
from hf_unlearn.jobs.demo import run_demo  # noqa: E402
from hf_unlearn.robustness.relearn import relearning_sweep  # noqa: E402

HEADER = (
    "| method | sam_rho | seed | forget ROUGE-L | retain ROUGE-L | train s | worst excess ROUGE-L | worst setting | "
    "largest recovered share |\n|---|---|---|---|---|---|---|---|---|"
)


def one_run(method: str, rho: float, seed: int, split: str) -> str:
    with tempfile.TemporaryDirectory() as out:
        config = UnlearnConfig(
            output_dir=out, method=method, sam_rho=rho, seed=seed, use_cpu=True, report_to="none",
            save_strategy="no", disable_tqdm=True,
        )  # fmt: skip
        trainer = run_demo(DemoArguments(split=split), config)
    record = trainer.record
    model, tokenizer = trainer.model, trainer.processing_class
    sweep = relearning_sweep(
        model, tokenizer, load_split(split), reference_model=learn_retain_only_model(split)[0],
        target_model=learn_target_model()[0], seed=seed,
    )  # fmt: skip
    worst = sweep["worst"]
    return (
        f"| {method} | {rho:g} | {seed} | {record.after['forget']['rouge_l_recall']:.3f} | "
        f"{record.after['retain']['rouge_l_recall']:.3f} | {record.wall_seconds:.0f} | "
        f"{worst['excess_rouge_l_recall']:+.3f} | lr {worst['learning_rate']:g}, {worst['steps']} steps | "
        f"{sweep['largest_recovered_fraction']:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["masc", "npo_klr"])
    parser.add_argument("--rhos", nargs="+", type=float, default=[0.0, 0.1])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--split", default="forget10")
    args = parser.parse_args()
    rows = []
    print(HEADER, flush=True)
    for seed in args.seeds:
        for method in args.methods:
            for rho in args.rhos:
                rows.append(one_run(method, rho, seed, args.split))
                print(rows[-1], flush=True)
    print("\n" + HEADER + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
