"""The tables and the figure of `hf-unlearn compare` (compare.md, compare.png), read from its result alone."""

from __future__ import annotations

import json
import os
from typing import Any


def fmt(value: Any, spec: str = ".1f") -> str:
    return "never" if value is None else format(value, spec)


def knowledge_text(measured: dict | None) -> str:
    """Real knowledge as "mean (harmonic mean)" (``real_knowledge_utility``), or "-" where not measured."""
    if not measured:
        return "-"
    return f"{fmt(measured.get('mean'), '.3f')} ({fmt(measured.get('utility'), '.3f')})"


def misses_text(misses: dict | None) -> str:
    """What of the region a run misses, by how much: "AUC +0.004; retain -0.060; not fluent"."""
    if misses is None:
        return "-"
    names = {
        "forget_rouge_l_recall": "forget ROUGE-L", "membership_auc": "AUC", "retain_rouge_l_recall": "retain",
        "real_knowledge_mean": "real knowledge",
    }  # fmt: skip

    def name(key: str) -> str | None:
        if key in names:
            return names[key]
        if key.startswith("membership_auc") and key.endswith("_interval"):
            return None  # said below: too few answers to judge
        if key.startswith("membership_auc_"):
            return f"{key.removeprefix('membership_auc_')} AUC"
        if key.startswith("real_knowledge_"):
            return key.removeprefix("real_knowledge_")
        return None

    parts = [f"{name(key)} {value:+.3f}" for key, value in misses.items() if name(key) and not isinstance(value, bool)]
    for key, value in misses.items():
        if key.startswith("membership_auc") and key.endswith("_interval"):
            attack = key.removeprefix("membership_auc").removesuffix("_interval").strip("_") or "min_k"
            parts.append(f"{attack} AUC: too few answers to judge (±{value:.2f})")
    if "fluent" in misses:
        failed = [key.removeprefix("fluency_") for key in misses if key.startswith("fluency_")]
        parts.append("not fluent" + (f" ({', '.join(failed)})" if failed else ""))
    return "; ".join(parts) or "in the region"


def auc_text(forget: dict) -> str:
    """A measurement's Min-K% AUC with its 95 % interval where it was read with one."""
    interval = (forget.get("membership_auc_intervals") or {}).get("min_k")
    text = f"{forget['membership_auc']:.3f}"
    return text + (f" [{interval[0]:.2f}, {interval[1]:.2f}]" if interval else "")


def compare_table(result: dict) -> str:
    masc = result["methods"].get("masc")  # absent when the comparison ran the baselines alone (--masc false)
    tofu = "real_knowledge_mean_min" in result["region"]
    header = (
        "| method | runs landing in the region | best lr (seeds landing) | time to region at best lr (s) | "
        "single run at best lr (s) | grid cost (s) | forget ROUGE-L | Min-K% AUC [95 % interval] | forget quality | "
        "retain ROUGE-L | "
    )
    if tofu:
        header += "real-knowledge mean (harmonic) | "
    lines = [header + "time / MASC's | MASC's run / grid |", "|---" * (header.count("|") + 1) + "|"]
    for name, row in result["methods"].items():
        if name == "masc":
            landed = f"{row['landed']}/{row['runs']} (stopped itself)"
            ratio, cost = "1.0x", "-"
        else:
            landed = f"{row['landed_at_end']}/{row['runs']} at budget end, {row['landed']}/{row['runs']} at some epoch"
            mine = row["time_to_region_seconds"]
            masc_time = masc["time_to_region_seconds"] if masc else None
            ratio = "-" if mine is None or masc_time is None else f"{mine / masc_time:.1f}x"
            cost = f"1/{row['grid_seconds'] / masc['single_run_seconds']:.1f}" if masc else "-"
        shown = row["shown"]
        knowledge = f"{knowledge_text(shown.get('real_knowledge'))} | " if tofu else ""
        lines.append(
            f"| {name} | {landed} | {row['best_learning_rate']:g} ({row['seeds_landed_at_best']}) | "
            f"{fmt(row['time_to_region_seconds'])} | {row['single_run_seconds']:.1f} | {row['grid_seconds']:.1f} | "
            f"{shown['forget']['rouge_l_recall']:.3f} | {auc_text(shown['forget'])} | "
            f"{fmt(shown['forget'].get('forget_quality'), '.3g')} | "
            f"{shown['retain']['rouge_l_recall']:.3f} | {knowledge}{ratio} | {cost} |"
        )
    return "\n".join(lines)


def runs_table(result: dict) -> str:
    """Every run's final state: forget/retain/real-knowledge figures, fluency of the forget answers, NF4 and the time
    split (training, probes, measurement)."""
    never = result["region"]["never_trained"]["forget"].get("fluency", {})
    lines = [
        "| method | lr | seed | steps | landed | forget ROUGE-L | Min-K% AUC [95 % interval] | retain ROUGE-L | "
        "real-knowledge mean (harmonic) | repetitive answers | NLL under never-trained | "
        "NF4 forget ROUGE-L (change) | seconds | of it probes | of it measuring | misses the region by |",
        "|---" * 16 + "|",
        f"| never-trained | | | | | {result['region']['never_trained']['forget']['rouge_l_recall']:.3f} | "
        f"{auc_text(result['region']['never_trained']['forget'])} | "
        f"{result['region']['never_trained']['retain']['rouge_l_recall']:.3f} | "
        f"{knowledge_text(result['region']['never_trained'].get('real_knowledge'))} | "
        f"{fmt(never.get('repetitive_share'), '.2f')} | {fmt(never.get('reference_nll'), '.2f')} | | | | | "
        f"{misses_text(result['region'].get('never_trained_misses'))} |",
    ]
    for name, runs in result["runs"].items():
        for run in runs:
            landed = run["landed"] if "landed" in run else (run["landed_at_end"], run["landed_at_some_epoch"])
            # a baseline's row shows its first in-region epoch (or its last); its fluency and NF4 are at the budget end
            fluency = (
                run["forget"].get("fluency") or run["epochs"][-1]["forget"].get("fluency", {})
                if "epochs" in run
                else run["forget"].get("fluency", {})
            )
            nf4 = run.get("nf4")
            nf4_text = f"{nf4['forget_rouge_l_recall']:.3f} ({nf4['rouge_l_change']:+.3f})" if nf4 else "-"
            lines.append(
                f"| {name} | {run['learning_rate']:g} | {run['seed']} | {run['steps']} | {landed} | "
                f"{run['forget']['rouge_l_recall']:.3f} | {auc_text(run['forget'])} | "
                f"{run['retain']['rouge_l_recall']:.3f} | "
                f"{knowledge_text(run.get('real_knowledge'))} | "
                f"{fmt((fluency or {}).get('repetitive_share'), '.2f')} | "
                f"{fmt((fluency or {}).get('reference_nll'), '.2f')} | {nf4_text} | {run['seconds']:.0f} | "
                f"{fmt(run.get('probe_seconds'), '.0f')} | {fmt(run.get('measure_seconds'), '.0f')} | "
                f"{misses_text(run.get('misses'))} |"
            )
    return "\n".join(lines)


def answers_section(result: dict) -> str:
    """Three forget answers of every run beside the never-trained model's (where fluency was measured)."""
    never = result["region"]["never_trained"]["forget"].get("fluency", {}).get("examples")
    if not never:
        return ""
    lines = ["| run | " + " | ".join(f"answer {n + 1}" for n in range(len(never))) + " |", "|---" * 4 + "|"]

    def row(name: str, answers: list[str]) -> str:
        cells = [" ".join(str(a).split()).replace("|", "\\|")[:200] for a in answers]
        return f"| {name} | " + " | ".join(cells) + " |"

    lines.append(row("never-trained", never))
    for name, runs in result["runs"].items():
        for run in runs:
            fluency = run["forget"].get("fluency") or (run.get("epochs") or [{}])[-1].get("forget", {}).get("fluency")
            if fluency and fluency.get("examples"):
                lines.append(row(f"{name} lr {run['learning_rate']:g} seed {run['seed']}", fluency["examples"]))
    return "\n".join(lines)


def lm_eval_table(result: dict) -> str:
    """lm-evaluation-harness accuracy of the target, the never-trained model and every final model ("" without)."""
    region = result["region"]
    rows = [("target", region["before"].get("lm_eval")), ("never-trained", region["never_trained"].get("lm_eval"))]
    for name, runs in result["runs"].items():
        rows += [(f"{name} lr {run['learning_rate']:g} seed {run['seed']}", run.get("lm_eval")) for run in runs]
    tasks = sorted({task for _, scores in rows if scores for task in scores if task != "seconds"})
    if not tasks:
        return ""
    lines = ["| model | " + " | ".join(f"{task} acc" for task in tasks) + " |", "|---" * (len(tasks) + 1) + "|"]
    for label, scores in rows:
        if scores:
            cells = [fmt(scores.get(task, {}).get("acc"), ".3f") for task in tasks]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
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


def reference_text(result: dict) -> str:
    """The calibrated stop's reference against the region's (:meth:`~hf_unlearn.jobs.compare.Race.check_reference`),
    in one sentence; "" where it was not measured."""
    check = result["region"].get("calibration_reference")
    if not check:
        return ""
    return (
        "MASC's never-seen reference, read by the never-trained model: Min-K% AUC of the forget answers against the "
        f"calibration authors' {check['forget_vs_calibration_auc']:.3f} (0.5: alike; the calibrated stop ends the "
        f"forget set near the calibration set), of the calibration against the holdout authors' "
        f"{check['calibration_vs_holdout_auc']:.3f}."
    )


def write_compare(result: dict, output_dir: str) -> None:
    os.makedirs(output_dir, exist_ok=True)
    with open(os.path.join(output_dir, "compare.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(output_dir, "compare.md"), "w") as f:
        f.write(f"# Methods compared on {result['split']}\n\n{compare_table(result)}\n\n## Every run\n\n")
        f.write(runs_table(result) + "\n")
        reference, answers, lm_eval = reference_text(result), answers_section(result), lm_eval_table(result)
        if reference:
            f.write("\n" + reference + "\n")
        if answers:
            f.write("\n## Three forget answers of each run\n\n" + answers + "\n")
        if lm_eval:
            f.write("\n## lm-evaluation-harness\n\n" + lm_eval + "\n")
    plot_compare(result, os.path.join(output_dir, "compare.png"))


__all__ = [
    "answers_section",
    "compare_table",
    "knowledge_text",
    "lm_eval_table",
    "auc_text",
    "misses_text",
    "plot_compare",
    "reference_text",
    "runs_table",
    "write_compare",
]
