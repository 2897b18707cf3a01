"""What sharpness-aware unlearning (``sam_rho``) costs per optimizer step, in one run.

    OMP_NUM_THREADS=1 python perf/sam_cost.py [--method masc] [--rho 0.1] [--steps 20] [--repeats 3]

On the embedded benchmark's target model (learned once, cached) and its forget10 / retain90 splits, ``--steps``
optimizer steps of :class:`~hf_unlearn.UnlearnTrainer` without and with ``sam_rho`` (no probes, no stopping rule, so
only the step is timed), alternating ``--repeats`` times; prints the median seconds per step of each and their
ratio. Expected: one more forward/backward on each forget batch (the first pass, at the unperturbed weights), so a
ratio below 2 when a retain part shares the step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks import learn_target_model, load_split  # noqa: E402


def seconds_per_step(method: str, rho: float, steps: int) -> float:
    model, tokenizer, _ = learn_target_model()
    forget = build_qa_dataset(load_split("forget10"), tokenizer)
    retain = build_qa_dataset(load_split("retain90"), tokenizer)
    with tempfile.TemporaryDirectory() as out:
        args = UnlearnConfig(
            output_dir=out, method=method, sam_rho=rho, max_steps=steps, probe_interval=0, stop_at_target=False,
            use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True, logging_strategy="no",
        )  # fmt: skip
        trainer = UnlearnTrainer(model=model, args=args, train_dataset=forget, retain_dataset=retain,
                                 processing_class=tokenizer)  # fmt: skip
        start = time.perf_counter()
        trainer.train()
        return (time.perf_counter() - start) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--method", default="masc")
    parser.add_argument("--rho", type=float, default=0.1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    timings: dict[float, list[float]] = {0.0: [], args.rho: []}
    for _ in range(args.repeats):
        for rho in timings:
            timings[rho].append(seconds_per_step(args.method, rho, args.steps))
    plain, sam = (statistics.median(timings[rho]) for rho in timings)
    print(f"method {args.method}, {args.steps} steps x {args.repeats} repeats, median seconds per optimizer step:")
    print(f"  sam_rho=0: {plain:.4f} s   sam_rho={args.rho:g}: {sam:.4f} s   ratio {sam / plain:.2f}")


if __name__ == "__main__":
    main()
