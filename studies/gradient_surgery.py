"""Gradient surgery: step time, peak memory and retained utility of each strategy vs `sum`, in one run.

    python studies/gradient_surgery.py [--steps 40] [--rounds 3] [--epochs 10]

1. Step time: the same model, batches and optimizer for every strategy; strategies alternate over several
   rounds and the median time per optimizer step is compared with `sum`'s (ratio). Two models: the embedded
   benchmark's ~1M-parameter target and a ~20M-parameter Llama of the same vocabulary.
2. Peak memory: one subprocess per strategy on the 20M model; peak resident memory (ru_maxrss) as a ratio to
   `sum`, and the difference in MB (the stored forget gradient is one fp32 copy of the trainable parameters).
3. Utility: GradDiff (forget GA + retain NLL) on the embedded benchmark, 10 epochs at lr 3e-4, with each
   strategy: forget/retain ROUGE-L recall and answer probability after, and the retain ROUGE-L kept relative to
   the target model ("utility recovery" in arXiv 2604.14808 terms).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from transformers import TrainerCallback  # noqa: E402

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks import learn_target_model, load_split, tiny_model  # noqa: E402
from hf_unlearn.evaluation.metrics import evaluate_qa  # noqa: E402

STRATEGIES = ["sum", "pcgrad", "pcgrad_global", "sago", "sago_prefer_retain"]
# Step-time rows: (label, strategy, UnlearnConfig overrides). The "logged every step" pair prices the surgery
# statistics (cosines, conflict fraction), computed only when Trainer logs, against sum logged as often.
TIMED = [(s, s, {}) for s in STRATEGIES + ["blur"]] + [
    ("sum, logged every step", "sum", {"logging_strategy": "steps", "logging_steps": 1}),
    ("sago, logged every step", "sago", {"logging_strategy": "steps", "logging_steps": 1}),
]
BIG = {"hidden_size": 512, "num_layers": 6, "num_heads": 8}


class StepTimer(TrainerCallback):
    def __init__(self) -> None:
        self.durations: list[float] = []
        self._last: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._last = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.durations.append(time.perf_counter() - self._last)


def make_trainer(model, tokenizer, forget, retain, strategy, output_dir, **overrides):
    values = dict(
        output_dir=output_dir,
        method="graddiff",
        gradient_surgery=strategy,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_strategy="no",
        probe_interval=0,
        learning_rate=3e-4,
        seed=0,
    )
    values.update(overrides)
    return UnlearnTrainer(
        model=model,
        args=UnlearnConfig(**values),
        train_dataset=forget,
        retain_dataset=retain,
        processing_class=tokenizer,
    )


def step_times(make_model, tokenizer, forget, retain, steps: int, rounds: int) -> dict[str, float]:
    per_row: dict[str, list[float]] = {label: [] for label, _, _ in TIMED}
    with tempfile.TemporaryDirectory() as output_dir:
        for _ in range(rounds):
            for label, strategy, overrides in TIMED:
                timer = StepTimer()
                trainer = make_trainer(
                    make_model(), tokenizer, forget, retain, strategy, output_dir, max_steps=steps, **overrides
                )
                trainer.add_callback(timer)
                trainer.train()
                per_row[label] += timer.durations[3:]  # skip warm-up steps
    return {label: statistics.median(d) for label, d in per_row.items()}


def memory_child(strategy: str, steps: int) -> None:
    """Run in a subprocess: train the 20M model for a few steps and print peak RSS in MB."""
    _, tokenizer, _ = learn_target_model(show_progress=False)
    forget = build_qa_dataset(load_split("forget10"), tokenizer)
    retain = build_qa_dataset(load_split("retain90"), tokenizer)
    with tempfile.TemporaryDirectory() as output_dir:
        model = tiny_model(tokenizer, "llama", **BIG)
        make_trainer(model, tokenizer, forget, retain, strategy, output_dir, max_steps=steps).train()
    print(json.dumps({"peak_mb": peak_rss_mb()}))


def peak_rss_mb() -> float:
    """Peak resident memory of this process. VmHWM, not ru_maxrss: Linux carries ru_maxrss across exec, so a
    child would report its parent's peak."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_memory(steps: int) -> dict[str, float]:
    result = {}
    for strategy in STRATEGIES:
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", strategy, "--steps", str(steps)],
            capture_output=True,
            text=True,
            check=True,
        )
        result[strategy] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]
    return result


def utility(tokenizer, forget, retain, forget_records, retain_records, epochs: int, lr: float) -> dict[str, dict]:
    rows = {}
    with tempfile.TemporaryDirectory() as output_dir:
        for strategy in STRATEGIES:
            model, _, _ = learn_target_model(show_progress=False)
            trainer = make_trainer(
                model, tokenizer, forget, retain, strategy, output_dir, num_train_epochs=epochs, learning_rate=lr
            )
            trainer.train()
            rows[strategy] = {
                "forget": evaluate_qa(trainer.model, tokenizer, forget_records),
                "retain": evaluate_qa(trainer.model, tokenizer, retain_records),
                "steps": trainer.state.global_step,
            }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--utility-lr", type=float, default=3e-4, help="GradDiff learning rate in part 3.")
    parser.add_argument("--parts", default="time,memory,utility", help="Comma-separated subset to run.")
    parser.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.memory_child:
        memory_child(cli.memory_child, cli.steps)
        return

    target, tokenizer, _ = learn_target_model(show_progress=False)
    forget_records, retain_records = load_split("forget10"), load_split("retain90")
    forget = build_qa_dataset(forget_records, tokenizer)
    retain = build_qa_dataset(retain_records, tokenizer)
    state = {k: v.clone() for k, v in target.state_dict().items()}

    def target_copy():
        model = tiny_model(tokenizer, "llama")
        model.load_state_dict(state)
        return model

    def big_model():
        return tiny_model(tokenizer, "llama", seed=1, **BIG)

    parts = set(cli.parts.split(","))
    if "time" in parts:
        print_step_times(target_copy, big_model, tokenizer, forget, retain, cli)
    if "memory" in parts:
        print_memory()
    if "utility" in parts:
        print_utility(target, tokenizer, forget, retain, forget_records, retain_records, cli)


def print_step_times(target_copy, big_model, tokenizer, forget, retain, cli) -> None:
    print(f"1. Median time per optimizer step, {cli.rounds} rounds x {cli.steps} steps (batch 4 forget + 4 retain)")
    print("| strategy | 1.2M target: ms | ratio to sum | 20M Llama: ms | ratio to sum (logged as often) |")
    print("|---|---|---|---|---|")
    small = step_times(target_copy, tokenizer, forget, retain, cli.steps, cli.rounds)
    big = step_times(big_model, tokenizer, forget, retain, cli.steps, cli.rounds)
    for label, _, overrides in TIMED:
        base = "sum, logged every step" if overrides else "sum"
        print(
            f"| {label} | {1e3 * small[label]:.1f} | {small[label] / small[base]:.3f} | {1e3 * big[label]:.1f} | "
            f"{big[label] / big[base]:.3f} |",
            flush=True,
        )


def print_memory() -> None:
    print("\n2. Peak resident memory, 20M Llama, one process per strategy")
    print("| strategy | peak MB | ratio to sum | extra MB |")
    print("|---|---|---|---|")
    memory = peak_memory(10)
    for s in STRATEGIES:
        print(f"| {s} | {memory[s]:.0f} | {memory[s] / memory['sum']:.3f} | {memory[s] - memory['sum']:+.0f} |")


def print_utility(target, tokenizer, forget, retain, forget_records, retain_records, cli) -> None:
    before_forget = evaluate_qa(target, tokenizer, forget_records)
    before_retain = evaluate_qa(target, tokenizer, retain_records)
    print(
        f"\n3. GradDiff, {cli.epochs} epochs, lr {cli.utility_lr:g}, embedded forget10 "
        f"(target model: forget ROUGE-L {before_forget['rouge_l_recall']:.3f}, "
        f"retain ROUGE-L {before_retain['rouge_l_recall']:.3f}, retain prob {before_retain['probability']:.3f})"
    )
    print("| strategy | forget ROUGE-L | forget prob | retain ROUGE-L | retain prob | retain ROUGE-L kept |")
    print("|---|---|---|---|---|---|")
    rows = utility(tokenizer, forget, retain, forget_records, retain_records, cli.epochs, cli.utility_lr)
    for s, row in rows.items():
        kept = row["retain"]["rouge_l_recall"] / before_retain["rouge_l_recall"]
        print(
            f"| {s} | {row['forget']['rouge_l_recall']:.3f} | {row['forget']['probability']:.3f} | "
            f"{row['retain']['rouge_l_recall']:.3f} | {row['retain']['probability']:.3f} | {kept:.1%} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
