"""MASC and NPO+KLR with and without sharpness-aware unlearning (``sam_rho``), and with UNDO after unlearning
(``--undo``: :func:`hf_unlearn.robustness.distill.distill_into_perturbed`, Lee et al. 2025), on the embedded benchmark,
each then attacked by the relearning sweep (``hf-unlearn relearn-check --sweep``'s default grid: lr 1e-4/1e-3 x
10/20/50 steps on half of the forget set, the other half measured, the retain-only model relearned the same way as
the baseline).

    OMP_NUM_THREADS=1 python studies/relearning_sam.py --seeds 0 1 --rhos 0 0.01 0.1 [--methods masc npo_klr]
    OMP_NUM_THREADS=1 python studies/relearning_sam.py --seeds 0 1 --rhos 0 0.01 0.1 --undo 0.7:500 0.9:1000 1:1000

Each unlearning run is :func:`~hf_unlearn.jobs.demo.run_demo` with ``UnlearnConfig``'s defaults (learning rate
1e-4; the ``hf-unlearn demo`` command's is 3e-4) and the method, ``sam_rho`` and seed shown. Per run: forget /
retain ROUGE-L recall before the attack, the training wall time (``train()``, probes included; an UNDO row adds the
distillation's) and its ratio to the plain run of the same method and seed, the excess ROUGE-L over the reference
at relearn-check's default attack (lr 1e-4, 20 steps, a cell of the grid), and the sweep's worst case (excess
ROUGE-L, the attacked model's and the reference's ROUGE-L in that cell, largest recovered share of the gap to the
target), and the answers' probability at its worst over the grid (excess over the reference, recovered share). An
UNDO row (``ALPHA:STEPS``) distils the plain (``sam_rho`` 0) run of its method (``--undo_methods``, MASC
by default) and seed into a noised copy of itself on the retain split (retain90). Prints one markdown row per run as
it finishes, and a table at the end; the study page is docs/studies/relearning_sam.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn import UnlearnConfig  # noqa: E402
from hf_unlearn.benchmarks import (  # noqa: E402
    learn_retain_only_model,
    learn_target_model,
    load_split,
    retain_split_for,
)
from hf_unlearn.cli.arguments import DemoArguments  # noqa: E402
from hf_unlearn.evaluation.metrics import evaluate_qa  # noqa: E402
from hf_unlearn.jobs.demo import run_demo  # noqa: E402
from hf_unlearn.robustness.distill import distill_into_perturbed  # noqa: E402
from hf_unlearn.robustness.relearn import relearning_sweep  # noqa: E402

HEADER = (
    "| method | sam_rho | undo (alpha, steps) | seed | forget ROUGE-L | retain ROUGE-L | train s | time ratio | "
    "excess ROUGE-L, default attack | worst excess ROUGE-L | worst setting | worst cell: model / reference ROUGE-L | "
    "largest recovered share | largest probability excess / share |\n" + "|---" * 14 + "|"
)
#: `hf-unlearn relearn-check`'s attack without --sweep (check_relearning_robustness's defaults): lr, steps.
DEFAULT_ATTACK = (1e-4, 20)


def unlearn(method: str, rho: float, seed: int, split: str) -> Any:
    """The demo's unlearning run (its defaults) with ``method`` and ``sam_rho``; the trainer."""
    with tempfile.TemporaryDirectory() as out:
        config = UnlearnConfig(
            output_dir=out, method=method, sam_rho=rho, seed=seed, use_cpu=True, report_to="none",
            save_strategy="no", disable_tqdm=True,
        )  # fmt: skip
        return run_demo(DemoArguments(split=split), config)


def share(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.2f}"


def sweep_cells(model: Any, tokenizer: Any, seed: int, split: str) -> str:
    """The relearning sweep's cell at the default attack and its worst case (with the attacked model's and the
    reference's forget ROUGE-L there), and the likelihood's worst case, as the last six cells of a row."""
    sweep = relearning_sweep(
        model, tokenizer, load_split(split), reference_model=learn_retain_only_model(split)[0],
        target_model=learn_target_model()[0], seed=seed,
    )  # fmt: skip
    worst = sweep["worst"]
    default = next(r for r in sweep["grid"] if (r["learning_rate"], r["steps"]) == DEFAULT_ATTACK)
    reference = worst["rouge_l_recall"] - worst["excess_rouge_l_recall"]
    return (
        f"{default['excess_rouge_l_recall']:+.3f} | {worst['excess_rouge_l_recall']:+.3f} | "
        f"lr {worst['learning_rate']:g}, {worst['steps']} steps | {worst['rouge_l_recall']:.3f} / {reference:.3f} | "
        f"{share(sweep['largest_recovered_fraction'])} | {sweep['largest_excess_probability']:+.3f} / "
        f"{share(sweep['largest_probability_recovered_fraction'])} |"
    )


def row(method: str, rho: float, undo: str, seed: int, before: tuple[float, float], seconds: float, plain: Any) -> str:
    """The first cells of a row: the run, forget / retain ROUGE-L before the attack, wall time and its ratio."""
    ratio = "-" if plain is None else f"{seconds / plain:.2f}"
    return f"| {method} | {rho:g} | {undo} | {seed} | {before[0]:.3f} | {before[1]:.3f} | {seconds:.0f} | {ratio} | "


def undo_row(trainer: Any, setting: str, seed: int, split: str, args: argparse.Namespace) -> str:
    """Distil the unlearned model of ``trainer`` into a noised copy of itself (``ALPHA:STEPS``), then the sweep."""
    alpha, steps = float(setting.split(":")[0]), int(setting.split(":")[1])
    record, tokenizer = trainer.record, trainer.processing_class
    retain = load_split(retain_split_for(split))
    student, result = distill_into_perturbed(
        trainer.model, tokenizer, retain, alpha=alpha, beta=args.undo_beta, steps=steps,
        learning_rate=args.undo_lr, batch_size=args.undo_batch_size, seed=seed, use_cpu=True,
    )  # fmt: skip
    forget = evaluate_qa(student, tokenizer, load_split(split))["rouge_l_recall"]
    kept = evaluate_qa(student, tokenizer, retain)["rouge_l_recall"]
    kl = f"{result['kl_perturbed']:.4g} -> {result['kl_distilled']:.4g}"
    print(f"UNDO {setting}: KL to the unlearned model {kl}, {result['seconds']:.0f} s", flush=True)
    seconds = record.wall_seconds + result["seconds"]
    start = row(trainer.args.method, 0.0, f"{alpha:g}, {steps}", seed, (forget, kept), seconds, record.wall_seconds)
    return start + sweep_cells(student, tokenizer, seed, split)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["masc", "npo_klr"])
    parser.add_argument("--rhos", nargs="+", type=float, default=[0.0, 0.1])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--split", default="forget10")
    parser.add_argument("--undo", nargs="*", default=[], help="UNDO settings ALPHA:STEPS on each plain run")
    parser.add_argument("--undo_methods", nargs="+", default=["masc"], help="the methods UNDO follows")
    parser.add_argument("--undo_lr", type=float, default=1e-3)
    parser.add_argument("--undo_beta", type=float, default=0.1)
    parser.add_argument("--undo_batch_size", type=int, default=16)
    args = parser.parse_args()
    rows = []
    print(HEADER, flush=True)
    for seed in args.seeds:
        for method in args.methods:
            plain = None
            for rho in sorted(args.rhos):
                trainer = unlearn(method, rho, seed, args.split)
                record = trainer.record
                plain = record.wall_seconds if rho == 0 else plain
                before = (record.after["forget"]["rouge_l_recall"], record.after["retain"]["rouge_l_recall"])
                start = row(method, rho, "-", seed, before, record.wall_seconds, plain)
                rows.append(start + sweep_cells(trainer.model, trainer.processing_class, seed, args.split))
                print(rows[-1], flush=True)
                if rho == 0 and method in args.undo_methods:
                    for setting in args.undo:
                        rows.append(undo_row(trainer, setting, seed, args.split, args))
                        print(rows[-1], flush=True)
    print("\n" + HEADER + "\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
