"""Evaluation plots: a radar chart of TOFU's axes and truth-ratio histograms (matplotlib, written as PNG)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

#: The radar's axes (TOFU, Maini et al. 2024, Fig. 5 style); each is in [0, 1] and "more is better forgetting or
#: utility": 1 - forget ROUGE-L, 1 - forget probability, forget truth ratio (min(TR, 1/TR)), model utility.
RADAR_AXES = ("1 - forget ROUGE-L", "1 - forget Prob", "forget truth ratio", "model utility")


def radar_values(result: Mapping[str, Any]) -> list[float]:
    """The four radar values of one :func:`hf_unlearn.evaluation.suites.evaluate_unlearning` result (missing = 0)."""
    forget = result.get("forget") or {}

    def value(x: Any) -> float:
        return 0.0 if x is None or (isinstance(x, float) and math.isnan(x)) else float(x)

    return [
        1 - value(forget.get("rouge_l_recall")),
        1 - value(forget.get("probability")),
        value(forget.get("truth_ratio")),
        value(result.get("model_utility")),
    ]


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_radar(results: Mapping[str, Mapping[str, Any]], path: str, title: str = "Unlearning, TOFU axes") -> str:
    """One polygon per named result (e.g. ``{"target": ..., "unlearned": ...}`` or one per method)."""
    plt = _pyplot()
    angles = [2 * math.pi * i / len(RADAR_AXES) for i in range(len(RADAR_AXES))]
    fig, ax = plt.subplots(figsize=(5.5, 5.5), subplot_kw={"polar": True})
    for name, result in results.items():
        values = radar_values(result)
        ax.plot(angles + angles[:1], values + values[:1], marker="o", label=name)
        ax.fill(angles + angles[:1], values + values[:1], alpha=0.1)
    ax.set_xticks(angles)
    ax.set_xticklabels(RADAR_AXES)
    ax.tick_params(axis="x", pad=14)
    ax.set_rlabel_position(200)  # keep the radial scale off the axis labels
    ax.set_ylim(0, 1)
    ax.set_title(title, pad=20)
    ax.legend(loc="lower right", bbox_to_anchor=(1.25, -0.1))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_truth_ratio_histogram(
    ratios: Mapping[str, Sequence[float]], path: str, title: str = "Forget-set truth ratios"
) -> str:
    """Overlaid histograms of per-question truth ratios (e.g. unlearned vs the retain-only model): forget
    quality is the KS test between such distributions."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    finite = [r for values in ratios.values() for r in values if math.isfinite(r) and r > 0]
    low, high = (min(finite), max(finite)) if finite else (0.1, 10.0)
    bins = [low * (high / low) ** (i / 20) for i in range(21)] if high > low else 20
    for name, values in ratios.items():
        ax.hist([r for r in values if math.isfinite(r) and r > 0], bins=bins, alpha=0.45, label=name)
    if high > low:
        ax.set_xscale("log")
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xlabel("truth ratio P(perturbed) / P(paraphrased)")
    ax.set_ylabel("questions")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sustainability(history: Sequence[Mapping[str, Any]], path: str) -> str:
    """MUSE's sustainability view (Shi et al., arXiv 2407.06460, §3.2) of a request sequence: after each request,
    the retain ROUGE-L (utility) and every request's forget ROUGE-L; a request's line is solid from its own run on.
    ``history`` is :attr:`hf_unlearn.jobs.sequence.SequenceResult.history`."""
    plt = _pyplot()
    steps = [point["after_request"] for point in history]
    names = list(history[0]["forget"])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    if "retain" in history[0]:
        ax.plot(steps, [p["retain"]["rouge_l_recall"] for p in history], "k-o", linewidth=2, label="retain (utility)")
    for k, name in enumerate(names, start=1):
        values = [p["forget"][name]["rouge_l_recall"] for p in history]
        (line,) = ax.plot(steps[: k + 1], values[: k + 1], ":", marker=".")
        ax.plot(steps[k:], values[k:], "-o", color=line.get_color(), label=f"forget: {name}")
    ax.set_xticks(steps, ["start"] + [f"after {k}" for k in steps[1:]])
    ax.set_ylim(-0.02, 1.02)
    ax.set_ylabel("ROUGE-L recall")
    ax.set_title("Sequential unlearning: utility and earlier requests")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
