"""MASC on the fictitious chronicles (passages whose facts recur): scoring mode x stopping probe x stopping target.

    python studies/chronicles_study.py [--lr 3e-4] [--holdout-fraction 0.25] [--probe-interval 5]

For each combination of ``forget_scoring`` (``answer``: every token of a passage; ``continuation``: the MASC
reference's MUSE mode, a prefix given and only the continuation scored), ``stop_probe`` (``train``: passages being
trained on; ``holdout``: forget passages never trained on, which share their facts with trained ones) and
``stop_target`` (``alpha``: violation rate <= stop_alpha; ``calibration``: the probe looks no more familiar than
never-learned towns' passages), MASC unlearns the two forget towns from the same cached target, then MUSE's
metrics are measured (VerbMem on forget passages, KnowMem on forget and retain towns' QA, Min-K% PrivLeak against
the retain-only model). Prints one table; every run also reports whether its probe fired and at which step.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn import UnlearnConfig, UnlearnTrainer  # noqa: E402
from hf_unlearn.benchmarks import learn_chronicles_target_model, load_chronicles_split  # noqa: E402
from hf_unlearn.data.examples import build_text_dataset  # noqa: E402
from hf_unlearn.evaluation.suites import chronicles_evaluation_sets, evaluate_muse  # noqa: E402


def row(label: str, muse: dict, extra: str) -> str:
    return (
        f"| {label} | {extra} | {muse['verbmem_forget']:.3f} | {muse['knowmem_forget']:.3f} | "
        f"{muse['knowmem_retain']:.3f} | {muse['auc']['min_k']:.3f} | "
        f"{'-' if muse.get('privleak') is None else format(muse['privleak']['min_k'], '+.1f')} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--holdout-fraction", type=float, default=0.25)
    parser.add_argument("--probe-interval", type=int, default=5)
    parser.add_argument("--max-steps", type=int, default=80)
    cli = parser.parse_args()
    start = time.time()
    target, tokenizer, _ = learn_chronicles_target_model(show_progress=False)
    reference, _, _ = learn_chronicles_target_model(show_progress=False, learn_split="retain")
    sets = chronicles_evaluation_sets()
    retrained = evaluate_muse(reference, tokenizer, sets)
    forget = build_text_dataset(load_chronicles_split("forget"), tokenizer)
    retain = build_text_dataset(load_chronicles_split("retain"), tokenizer, name="retain")
    calibration = build_text_dataset(load_chronicles_split("calibration"), tokenizer, name="calibration")
    header = (
        "| run | stop | VerbMem forget | KnowMem forget | KnowMem retain | Min-K% AUC | PrivLeak (%) |\n"
        "|---|---|---|---|---|---|---|"
    )
    lines = [header, row("target", evaluate_muse(target, tokenizer, sets, retrained["auc"]), "-")]
    lines.append(row("retain-only (never saw the forget towns)", retrained, "-"))
    print("\n".join(lines), flush=True)
    for scoring, probe, stop_target in itertools.product(
        ("answer", "continuation"), ("train", "holdout"), ("alpha", "calibration")
    ):
        with tempfile.TemporaryDirectory() as output_dir:
            config = UnlearnConfig(
                output_dir=output_dir,
                method="masc",
                learning_rate=cli.lr,
                max_steps=cli.max_steps,
                probe_interval=cli.probe_interval,
                forget_scoring=scoring,
                stop_probe=probe,
                holdout_fraction=cli.holdout_fraction,
                stop_target=stop_target,
                report_to="none",
                save_strategy="no",
                disable_tqdm=True,
                logging_strategy="no",
                use_cpu=True,
            )
            trainer = UnlearnTrainer(
                copy.deepcopy(target),
                config,
                forget,
                retain,
                processing_class=tokenizer,
                calibration_dataset=calibration if stop_target == "calibration" else None,
            )
            trainer.train()
        record = trainer.record
        history = record.probe_history
        holdout_rates = [round(p["violation_rate_holdout"], 2) for p in history if "violation_rate_holdout" in p]
        fired = "fired" if record.stop_kind == "target" else f"no ({record.stop_kind})"
        extra = f"{fired} at step {record.global_step}; holdout rate {holdout_rates[0]} -> {holdout_rates[-1]}"
        muse = evaluate_muse(trainer.model, tokenizer, sets, retrained["auc"])
        lines.append(row(f"{scoring} / {probe} probe / {stop_target}", muse, extra))
        print(lines[-1], flush=True)
    print("\n" + "\n".join(lines))
    print(f"\n{time.time() - start:.0f} s in all")


if __name__ == "__main__":
    main()
