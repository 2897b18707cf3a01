"""The run report: ``report.json`` (machine-readable), ``report.md`` (a table a person reads) and a PNG plot."""

from __future__ import annotations

import json
import os
from typing import Any

METRICS = ("rouge_l_recall", "probability", "exact_match")


def build_report(trainer: Any, before: dict[str, dict], after: dict[str, dict], extra: dict | None = None) -> dict:
    """Collect what a run did from an :class:`~hf_unlearn.UnlearnTrainer` after ``train()``.

    ``before`` and ``after`` map ``"forget"`` and ``"retain"`` to metric dicts (see :mod:`hf_unlearn.metrics`).
    """
    args = trainer.args
    stopping = trainer.stopping_callback
    bound = trainer.exact_reproduction_bound()
    forget_objective, retain_objective = args.objectives
    report = {
        "method": args.method,
        "forget_objective": forget_objective,
        "retain_objective": retain_objective,
        "stopped_early": stopping.stopped_early,
        "stop_step": stopping.stop_step if stopping.stopped_early else trainer.state.global_step,
        "max_steps": trainer.state.max_steps,
        "wall_seconds": trainer.train_wall_seconds,
        "violation_rate": stopping.last_violation_rate,
        "alpha": args.stop_alpha,
        "stop_probe": args.stop_probe,
        "exact_reproduction_bound": bound["mean"],
        "exact_reproduction_bound_max": bound["max"],
        "exact_reproduction_bound_violation_rate": bound["violation_rate"],
        "hyperparameters": {
            "learning_rate": args.learning_rate,
            "per_device_train_batch_size": args.per_device_train_batch_size,
            "forget_weight": args.forget_weight,
            "retain_weight": args.retain_weight,
            "masc_k": args.masc_k,
            "masc_beta": args.masc_beta,
            "masc_rho": args.masc_rho,
            "masc_tau": args.masc_tau,
            "masc_eta": args.masc_eta,
            "competitor_source": args.competitor_source,
            "probe_interval": args.probe_interval,
            "holdout_fraction": args.holdout_fraction,
            "hoeffding": args.hoeffding,
            "gradient_surgery": args.gradient_surgery,
        },
        "before": before,
        "after": after,
        "history": stopping.history,
        "surgery_history": [
            {"step": log["step"], **{k: v for k, v in log.items() if k.startswith("surgery/")}}
            for log in trainer.state.log_history
            if any(k.startswith("surgery/") for k in log)
        ],
    }
    if extra:
        report.update(extra)
    return report


def format_value(value: Any, spec: str = ".3f") -> str:
    """A metric for a Markdown table: ``-`` for a missing one, floats with ``spec``, anything else as is."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def report_table(report: dict) -> str:
    """Before/after table in Markdown (also what the CLI prints)."""
    lines = ["| split | metric | before | after | change |", "|---|---|---|---|---|"]
    for split in ("forget", "retain"):
        if split not in report["before"] or split not in report["after"]:
            continue
        metrics = METRICS + (("truth_ratio",) if report["after"][split].get("truth_ratio") is not None else ())
        for metric in metrics:
            before = report["before"][split].get(metric)
            after = report["after"][split].get(metric)
            change = None if before is None or after is None else after - before
            cells = " | ".join(format_value(value) for value in (before, after, change))
            lines.append(f"| {split} | {metric} | {cells} |")
    return "\n".join(lines)


def forget_quality_line(report: dict) -> str | None:
    """The report's one line on TOFU forget quality before vs after, when it was measured."""
    from .evaluation import forget_quality_sentence

    tofu = report.get("tofu") or {}
    return forget_quality_sentence(
        (tofu.get("before") or {}).get("forget_quality"), (tofu.get("after") or {}).get("forget_quality")
    )


def report_markdown(report: dict) -> str:
    stop = (
        f"stopped itself at step {report['stop_step']} of at most {report['max_steps']}"
        if report["stopped_early"]
        else f"ran the whole budget ({report['max_steps']} steps) without meeting the stopping rule"
    )
    summary = [
        f"# Unlearning report: {report['method']}",
        "",
        f"- Objectives: forget `{report['forget_objective']}`, retain `{report['retain_objective']}`.",
        f"- Training {stop} in {format_value(report['wall_seconds'])} s (probes included).",
        f"- Last violation rate ({report['stop_probe']} probe): {format_value(report['violation_rate'])} "
        f"(alpha = {format_value(report['alpha'])}).",
        f"- Exact-reproduction bound (MASC Proposition 1, mean over forget answers): "
        f"{format_value(report['exact_reproduction_bound'])}; measured exact match after: "
        f"{format_value(report['after'].get('forget', {}).get('exact_match'))}.",
        "",
    ]
    if forget_quality_line(report):
        summary.insert(-1, f"- {forget_quality_line(report)}")
    if report["before"] and report["after"]:
        summary += [report_table(report), ""]
    return "\n".join(summary)


def plot_history(
    history: list[dict], path: str, alpha: float | None = None, surgery: list[dict] | None = None
) -> str | None:
    """Violation rate(s), forget/retain answer probability and, with gradient surgery, the cosines and conflict
    fraction over optimizer steps, one PNG."""
    if not history:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    panels = 3 if surgery else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    ax_rate, ax_prob = axes[0], axes[1]
    for key, label in (("violation_rate_train", "train probe"), ("violation_rate_holdout", "held-out probe")):
        if key in history[0]:
            ax_rate.plot(steps, [h[key] for h in history], marker="o", label=label)
    if alpha is not None:
        ax_rate.axhline(alpha, color="grey", linestyle="--", label=f"alpha = {alpha:g}")
    ax_rate.set_xlabel("optimizer step")
    ax_rate.set_ylabel("violation rate")
    ax_rate.set_ylim(-0.02, 1.02)
    ax_rate.set_title("Forget-set violation rate")
    ax_rate.legend()
    for key, label in (
        ("forget_probability_train", "forget (trained)"),
        ("forget_probability_holdout", "forget (held out)"),
        ("retain_probability", "retain"),
    ):
        if key in history[0]:
            ax_prob.plot(steps, [h[key] for h in history], marker="o", label=label)
    ax_prob.set_xlabel("optimizer step")
    ax_prob.set_ylabel("answer probability (exp -mean NLL)")
    ax_prob.set_ylim(-0.02, 1.02)
    ax_prob.set_title("Forget vs retain answer probability")
    ax_prob.legend()
    if surgery:
        ax_surgery = axes[2]
        surgery_steps = [h["step"] for h in surgery]
        for key, label in (
            ("surgery/cos_update_retain", "cos(update, g_retain)"),
            ("surgery/cos_forget_retain", "cos(g_forget, g_retain)"),
            ("surgery/conflict_fraction", "conflict fraction"),
        ):
            ax_surgery.plot(surgery_steps, [h.get(key) for h in surgery], marker=".", label=label)
        ax_surgery.axhline(0, color="grey", linewidth=0.8)
        ax_surgery.set_xlabel("optimizer step")
        ax_surgery.set_title("Gradient surgery")
        ax_surgery.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(report: dict, output_dir: str) -> dict[str, str]:
    """Write report.json, report.md and training_curves.png into ``output_dir``; return their paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {"json": os.path.join(output_dir, "report.json"), "markdown": os.path.join(output_dir, "report.md")}
    with open(paths["json"], "w") as f:
        json.dump(report, f, indent=2)
    with open(paths["markdown"], "w") as f:
        f.write(report_markdown(report))
    plot = plot_history(
        report.get("history", []),
        os.path.join(output_dir, "training_curves.png"),
        report["alpha"],
        report.get("surgery_history"),
    )
    if plot:
        paths["plot"] = plot
    return paths
