"""The run report: ``report.json`` (the run record), ``report.md`` (a table a person reads) and a PNG plot.

Everything here reads an :class:`~hf_unlearn.training.record.UnlearnRecord` or an evaluation result; nothing reaches
into a trainer or runs a model.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..evaluation.membership import membership_verdict, membership_verdict_line
from ..objectives.masc.stop_read import last_exact_read
from ..training.record import UnlearnRecord

METRICS = ("rouge_l_recall", "probability", "exact_match")
#: Shown when measured (open-unlearning's token-level memorisation, :mod:`hf_unlearn.evaluation.memorization`).
MEMORIZATION_METRICS = ("exact_memorization", "extraction_strength")


def format_value(value: Any, spec: str = ".3f") -> str:
    """A metric for a Markdown table: ``-`` for a missing one, floats with ``spec``, anything else as is."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def report_table(record: UnlearnRecord) -> str:
    """Before/after table in Markdown (also what the CLI prints)."""
    lines = ["| split | metric | before | after | change |", "|---|---|---|---|---|"]
    for split in ("forget", "retain"):
        if split not in record.before or split not in record.after:
            continue
        optional = ("truth_ratio", *MEMORIZATION_METRICS)
        metrics = METRICS + tuple(m for m in optional if record.after[split].get(m) is not None)
        for metric in metrics:
            before = record.before[split].get(metric)
            after = record.after[split].get(metric)
            change = None if before is None or after is None else after - before
            cells = " | ".join(format_value(value) for value in (before, after, change))
            lines.append(f"| {split} | {metric} | {cells} |")
    return "\n".join(lines)


def forget_quality_sentence(before: float | None, after: float | None) -> str | None:
    """One line saying whether unlearning moved the model towards one that never saw the forget set."""
    if before is None or after is None:
        return None
    verdict = (
        "higher than the target model's: closer to a model that never saw the forget set"
        if after > before
        else "not higher than the target model's: no closer to a model that never saw the forget set"
    )
    return (
        f"Forget quality (KS p-value of forget-set truth ratios vs a retain-only model) went from {before:.3g} "
        f"to {after:.3g}, {verdict}."
    )


def forget_quality_line(record: UnlearnRecord) -> str | None:
    """The report's one line on TOFU forget quality before vs after, when it was measured."""
    evaluation = record.evaluation or {}
    return forget_quality_sentence(
        (evaluation.get("before") or {}).get("forget_quality"), (evaluation.get("after") or {}).get("forget_quality")
    )


def stop_sentence(record: UnlearnRecord) -> str:
    """How the run ended, in one clause: the target, the utility floor (a failure), the budget, or something else."""
    if record.stop_kind == "target":
        return f"stopped itself at step {record.stop_step} of at most {record.max_steps} (target reached)"
    if record.stop_kind == "utility_floor":
        return f"FAILED at step {record.stop_step}: stopped by the utility floor"
    if record.stop_kind == "budget":
        if record.stopping_rule:
            return f"ran the whole budget ({record.max_steps} steps) without meeting the stopping rule"
        return f"ran the whole budget ({record.max_steps} steps; no stopping rule)"
    return f"ended at step {record.global_step} of {record.max_steps}"


def report_markdown(record: UnlearnRecord) -> str:
    bound = record.exact_reproduction_bound or {}
    summary = [
        f"# Unlearning report: {record.method}",
        "",
        f"- Objectives: forget `{record.forget_objective}`, retain `{record.retain_objective}`"
        + (f", gradient surgery `{record.gradient_surgery}`." if record.gradient_surgery != "sum" else "."),
        f"- Training {stop_sentence(record)} in {format_value(record.wall_seconds)} s "
        f"({format_value(record.probe_seconds)} s of it in probes).",
        f"- Why it stopped: {record.stop_reason}.",
    ]
    if record.beyond_paper:
        summary.append("- Beyond the papers: " + "; ".join(record.beyond_paper) + ".")
    if record.violation_rate is not None:
        hyperparameters = record.hyperparameters
        probe = hyperparameters.get("stop_probe", "train")
        if hyperparameters.get("stop_target") == "membership":
            auc = last_exact_read(record.probe_history).get("calibration_min_k_auc")
            slack = hyperparameters.get("calibration_auc_slack")
            target = f"Min-K% AUC against never-seen data {format_value(auc)}, target >= {format_value(0.5 - slack)}"
        elif hyperparameters.get("stop_target") == "calibration":
            gap = last_exact_read(record.probe_history).get("calibration_gap")
            target = f"calibration gap {format_value(gap)}, slack {format_value(hyperparameters['calibration_slack'])}"
        elif "stop_alpha" in hyperparameters:
            target = f"alpha = {format_value(hyperparameters['stop_alpha'])}"
        else:
            target = "no stopping rule"
        summary.append(f"- Last violation rate ({probe} probe): {format_value(record.violation_rate)} ({target}).")
    if bound:
        summary.append(
            f"- Exact-reproduction bound (MASC Proposition 1, mean over forget answers): "
            f"{format_value(bound.get('mean'))}; measured exact match after: "
            f"{format_value(record.after.get('forget', {}).get('exact_match'))}."
        )
    line = forget_quality_line(record)
    if line:
        summary.append(f"- {line}")
    summary.append("")
    if record.before and record.after:
        summary += [report_table(record), ""]
    membership = membership_section(record)
    if membership:
        summary += [membership]
    utility = lm_eval_section(record.lm_eval)
    if utility:
        summary += [utility]
    answers = forget_answers_section(record.extra.get("forget_answers"))
    if answers:
        summary += [answers]
    return "\n".join(summary)


def forget_answers_section(answers: list[dict[str, str]] | None) -> str:
    """Greedy answers to the first forget questions, beside a never-trained model's (``record.extra``): does the
    unlearned model answer like a model that never saw the data (fluent, wrong) or degenerate?"""
    if not answers:
        return ""
    lines = ["## Forget answers", "", "| question | answer learned | after unlearning | never-trained model |"]
    lines.append("|---|---|---|---|")
    for row in answers:
        cells = [
            " ".join(str(row[key]).split()).replace("|", "\\|")
            for key in ("question", "answer", "after", "never_trained")
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def lm_eval_section(lm_eval: dict[str, Any] | None, heading: str = "## Utility (lm-evaluation-harness)") -> str:
    """The "before -> after" table of the lm-eval tasks of a record or an evaluation, under ``heading``; ``""`` when
    none were run."""
    from ..evaluation.utility import lm_eval_markdown

    if not lm_eval:
        return ""
    table = lm_eval_markdown(lm_eval.get("before"), lm_eval.get("after"), fmt=lambda v: format_value(v, ".4g"))
    return f"{heading}\n\n{table}" if table else ""


def _series(history: list[dict[str, Any]], key: str) -> tuple[list[int], list[float]]:
    """The steps and values of the probes that read ``key`` (a calibrated stop's exact reads are not every probe)."""
    read = [h for h in history if h.get(key) is not None]
    return [h["step"] for h in read], [h[key] for h in read]


def plot_history(
    history: list[dict],
    path: str,
    alpha: float | None = None,
    surgery: list[dict] | None = None,
    calibration_slack: float | None = None,
    auc_threshold: float | None = None,
) -> str | None:
    """Violation rate(s), forget/retain answer probability, the calibration gap (with a calibration set) and, with
    gradient surgery, the cosines and conflict fraction over optimizer steps, one PNG."""
    if not history:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    calibrated = "calibration_gap" in history[0]
    panels = 2 + int(calibrated) + int(bool(surgery))
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4))
    ax_rate, ax_prob = axes[0], axes[1]
    for key, label in (
        ("violation_rate_train", "train probe"),
        ("violation_rate_holdout", "held-out probe"),
        ("violation_rate_calibration", "never seen (calibration)"),
    ):
        if key in history[0]:
            ax_rate.plot(*_series(history, key), marker="o", label=label)
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
        ("calibration_probability", "never seen (calibration)"),
        ("retain_probability", "retain"),
    ):
        if key in history[0]:
            ax_prob.plot(*_series(history, key), marker="o", label=label)
    ax_prob.set_xlabel("optimizer step")
    ax_prob.set_ylabel("answer probability (exp -mean NLL)")
    ax_prob.set_ylim(-0.02, 1.02)
    ax_prob.set_title("Forget vs retain answer probability")
    ax_prob.legend()
    if calibrated:
        ax_gap = axes[2]
        # exact reads (the stop decides on them) as points joined by a line; the running read between them dotted
        ax_gap.plot(*_series(history, "calibration_gap"), marker="o", label="calibration gap")
        if any("running_calibration_gap" in h for h in history):
            ax_gap.plot(*_series(history, "running_calibration_gap"), ":", color="tab:blue", label="running read")
        if calibration_slack is not None:
            ax_gap.axhline(calibration_slack, color="grey", linestyle="--", label=f"slack = {calibration_slack:g}")
        if any("calibration_min_k_auc" in h for h in history):  # the Min-K% stop's reading, on its own axis
            ax_auc = ax_gap.twinx()
            ax_auc.plot(*_series(history, "calibration_min_k_auc"), "s-", color="tab:red")
            if any("running_calibration_min_k_auc" in h for h in history):
                ax_auc.plot(*_series(history, "running_calibration_min_k_auc"), ":", color="tab:red")
            ax_auc.set_ylabel("Min-K% AUC, forget vs never-seen (red)")
            if auc_threshold is not None:
                ax_auc.axhline(auc_threshold, color="tab:red", linestyle="--", linewidth=0.8)
        ax_gap.set_xlabel("optimizer step")
        ax_gap.set_ylabel("logits above never-seen margins")
        ax_gap.set_title("Forget vs never-seen margins")
        ax_gap.legend()
    if surgery:
        ax_surgery = axes[-1]
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


def write_report(record: UnlearnRecord, output_dir: str) -> dict[str, str]:
    """Write report.json (the record), report.md and training_curves.png into ``output_dir``; return their paths."""
    os.makedirs(output_dir, exist_ok=True)
    paths = {"json": os.path.join(output_dir, "report.json"), "markdown": os.path.join(output_dir, "report.md")}
    with open(paths["json"], "w") as f:
        json.dump(record.to_dict(), f, indent=2)
    with open(paths["markdown"], "w") as f:
        f.write(report_markdown(record))
    target = record.hyperparameters.get("stop_target")
    plot = plot_history(
        record.probe_history,
        os.path.join(output_dir, "training_curves.png"),
        record.hyperparameters.get("stop_alpha") if target == "alpha" else None,
        record.surgery_history,
        record.hyperparameters.get("calibration_slack") if target == "calibration" else None,
        0.5 - record.hyperparameters["calibration_auc_slack"] if target == "membership" else None,
    )
    if plot:
        paths["plot"] = plot
    return paths


def evaluation_markdown(result: dict[str, Any]) -> str:
    """A short Markdown summary of :func:`evaluate_benchmark`'s (or :func:`evaluate_unlearning`'s) result."""

    lines = [f"# Evaluation of {result.get('model', 'the model')}", ""]
    data = result.get("data")
    if data:
        lines += ["Evaluated on: " + "; ".join(f"{name}: {what}" for name, what in data.items()), ""]
    lines += [f"> Warning: {warning}" for warning in result.get("warnings") or []]
    if result.get("warnings"):
        lines.append("")
    if "forget" in result:
        lines += [
            "| set | ROUGE-L recall | probability | exact match | truth ratio | exact memorisation | extraction "
            "strength |",
            "|---|---|---|---|---|---|---|",
        ]
        for name, metrics in result.items():
            if isinstance(metrics, dict) and "rouge_l_recall" in metrics:
                lines.append(
                    f"| {name} | {_fmt4(metrics['rouge_l_recall'])} | {_fmt4(metrics['probability'])} | "
                    f"{_fmt4(metrics['exact_match'])} | {_fmt4(metrics.get('truth_ratio'))} | "
                    f"{_fmt4(metrics.get('exact_memorization'))} | {_fmt4(metrics.get('extraction_strength'))} |"
                )
        lines += [
            "",
            f"- Forget quality (KS p-value vs the retain-only model): {_fmt4(result.get('forget_quality'))}",
            f"- Model utility (harmonic mean of retain metrics): {_fmt4(result.get('model_utility'))}",
            f"- Exact-reproduction bound (MASC Proposition 1): {_fmt4(result.get('exact_reproduction_bound'))} "
            f"(measured exact match {_fmt4(result['forget'].get('exact_match'))})",
            "",
            "Exact memorisation and extraction strength are open-unlearning's: teacher-forced greedy predictions of "
            "the answer tokens (EOS left out); the share that is right, and 1 - k/L for the shortest answer prefix "
            "k after which every prediction is right (at least 1/L, as open-unlearning computes it).",
            "",
        ]
    muse = result.get("muse")
    if muse:
        lines += ["## MUSE", "", "| metric | value |", "|---|---|"]
        for key in ("verbmem_forget", "knowmem_forget", "knowmem_retain"):
            if key in muse:
                lines.append(f"| {key} (ROUGE-L F1) | {_fmt4(muse[key])} |")
        lines.append("")
        if muse.get("auc"):
            lines += [membership_markdown(muse)]
            lines += [
                "Membership AUC is MUSE's: P(a never-seen text scores as more familiar than a forget text); 0.5 is "
                "chance. PrivLeak is its change against the model trained without the forget set, in %: about 0 is "
                "what retraining gives, strongly negative means the forget set is still recognisable "
                "(under-unlearning), positive that it looks less familiar than never-seen text (over-unlearning). "
                "An attack tells the forget set apart when its AUC is further than the tolerance from the same "
                "attack's AUC on the model trained without the forget set (from 0.5 where there is none). Every AUC "
                "carries its 95 % interval (DeLong), the difference its paired interval where both models read the "
                "same answers; where that interval is wider than the tolerance, the answers are too few to judge.",
            ]
        lines.append("")
    if result.get("lm_eval"):
        lines.append(lm_eval_section({"after": result["lm_eval"]}, "## Utility (lm-evaluation-harness)"))
    return "\n".join(lines)


def membership_markdown(measured: dict[str, Any]) -> str:
    """Per attack: the AUC, the never-trained model's (or chance), PrivLeak, and whether the attack still tells the
    forget set from never-seen data (:func:`~hf_unlearn.evaluation.membership.membership_verdict`), then the verdict
    in one sentence; ``measured`` holds ``auc`` and, where measured against a reference, ``privleak`` and
    ``membership`` (the verdict; judged against 0.5 here where it is absent)."""
    verdict = measured.get("membership") or membership_verdict(measured["auc"])
    lines = [
        "| attack | AUC [95 % interval] | never-trained AUC | difference [95 % interval] | PrivLeak (%) | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for attack, row in verdict["per_attack"].items():
        level = _fmt4(row["level"]) if row["level_from"] == "never_trained" else "- (judged against 0.5)"
        leak = (measured.get("privleak") or {}).get(attack)
        interval = row.get("auc_interval") or (measured.get("auc_interval") or {}).get(attack)
        auc = _fmt4(row["auc"]) + (f" [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "")
        off = row.get("off_interval")
        difference = f"{row['off']:+.3f}" + (f" [{off[0]:+.3f}, {off[1]:+.3f}]" if off else "")
        said = row.get("verdict") or ("tells" if row["distinguishes"] else "lands")
        told = f"**{said}** ({row['side'] or 'NaN'})" if row["distinguishes"] else said
        lines.append(f"| {attack} | {auc} | {level} | {difference} | {_fmt4(leak)} | {told} |")
    return "\n".join([*lines, "", membership_verdict_line(verdict), ""])


def membership_section(record: UnlearnRecord) -> str:
    """The record's membership verdict after unlearning (``record.evaluation['membership']``, or the chronicles
    demo's MUSE evaluation) under a heading (:func:`membership_markdown`); ``""`` when none was measured."""
    evaluation = record.evaluation or {}
    measured = evaluation.get("membership") or ((evaluation.get("muse") or {}).get("after"))
    if not measured or not measured.get("auc"):
        return ""
    return "\n".join(["## Membership attacks", "", membership_markdown(measured)])


def _fmt4(value: Any) -> str:
    return format_value(value, ".4g")
