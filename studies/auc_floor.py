"""Where a Min-K% stop against the calibration answers should read, and where it reads (issue 32, section 12).

Sections 10-11 found that the probe's margin gap, one-sided or signed, does not read what the region reads: the
region is a Min-K% membership AUC (Shi et al. 2024, k 0.4) of the forget answers against never-seen authors. The
probe can read that statistic itself, against its calibration answers (``calibration_auc_slack``). This script reads
it where the run should end: under the never-trained model (it learned the retain authors only), the forget answers
against the calibration answers, both under that model (a stop that re-measures its reference) and against the
calibration answers under the target (a stop that holds its reference from the start, as the probe does). Beside it:
the region's own centre (forget against the holdout authors under the never-trained model), each calibration author
alone, and, with ``--run``, both readings along a saved run next to the region's AUC.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/auc_floor.py --benchmark tofu --tofu_dir ../shared/tofu \\
        --author_offset 5 [--run tofuB/B-idspread-kl5-s0 --every 100] --output aucB.json
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/auc_floor.py --benchmark embedded --output aucE.json \\
        [--models demo-s0 demo-s1 ...]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
from collections.abc import Iterator
from typing import Any

from stop_floor import (
    MATCHES,
    by_example,
    gap,
    saved_adapters,
    saved_step_numbers,
    study_arguments,
    study_setting,
    subset,
)
from transformers import AutoModelForCausalLM

from hf_unlearn.evaluation.bundle import qa_attack_scores
from hf_unlearn.evaluation.membership import membership_auc

ROLES = ("forget", "calibration", "holdout")


def scores_of(model: Any, tokenizer: Any, records: dict[str, list[dict]]) -> dict[str, list[float]]:
    """Each role's Min-K% score per answer (higher: more familiar) under ``model``."""
    model.eval()
    return {role: qa_attack_scores(model, tokenizer, records[role]) for role in ROLES}


def readings(now: dict[str, list[float]], held: dict[str, list[float]]) -> dict[str, float]:
    """The region's AUC and the two calibration AUCs a stop could read: against the calibration answers under the same
    model, and against the ones ``held`` from the start."""
    return {
        "region: forget vs holdout": membership_auc(now["forget"], now["holdout"]),
        "stop, current reference: forget vs calibration": membership_auc(now["forget"], now["calibration"]),
        "stop, start reference: forget vs target's calibration": membership_auc(now["forget"], held["calibration"]),
        "holdout vs calibration (same model)": membership_auc(now["holdout"], now["calibration"]),
        **{f"min_k mean {role}": statistics.mean(now[role]) for role in ROLES},
    }


def by_author(scores: list[float], authors: list[Any]) -> dict[Any, list[float]]:
    groups: dict[Any, list[float]] = {}
    for score, author in zip(scores, authors, strict=True):
        groups.setdefault(author, []).append(score)
    return groups


def assignments(never_seen_authors: list[Any]) -> list[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """Every way to give half of the never-seen authors the stop's reference role and the other half the region's
    holdout role, each once (the roles the study split assigned in order are one of them)."""
    half = len(never_seen_authors) // 2
    return [
        (tuple(c), tuple(a for a in never_seen_authors if a not in c))
        for c in itertools.combinations(never_seen_authors, half)
    ]


def tally(counts: dict[tuple[str, float], list[int]], rule: tuple[str, float], inside: bool, stopped: bool) -> None:
    """Count one assignment's end under ``rule``: in the region, stopped by the rule (not the budget), both."""
    row = counts.setdefault(rule, [0, 0, 0])
    row[0], row[1], row[2] = row[0] + inside, row[1] + stopped, row[2] + (inside and stopped)


def landing(
    scores: dict[str, dict[str, list[float]]],
    authors: list[Any],
    thresholds: list[float],
    margins: dict[str, dict[str, list[dict]]] | None = None,
    slacks: tuple[float, ...] = (0.5, 0.8, 1.0, 1.2, 1.5),
) -> dict[str, Any]:
    """For every assignment of the never-seen authors (:func:`assignments`) and each threshold: where a stop that
    waits until the Min-K% AUC of the forget answers against its reference authors reaches the threshold would end
    along the saved run (``scores``: ``'never'``, ``'target'`` and ``'step-N'``, each role's per-answer scores;
    ``authors``: the never-seen answers' authors, calibration then holdout), and whether the region's AUC against the
    other half is there within 0.1 of the never-trained model's. Both references: under the model at each step
    ('current') and held from the target ('start'). With ``margins`` (each role's per-answer margin pieces, as
    ``stop_floor.by_example`` cuts them), also the library's stop: the first step whose calibration gap against the
    reference authors under the target is at most each slack, for both matchings."""
    pooled = {name: s["calibration"] + s["holdout"] for name, s in scores.items()}
    steps = sorted(int(n.split("-")[1]) for n in scores if n.startswith("step-"))
    out: dict[str, Any] = {"assignments": 0, "never-trained stop AUC": [], "rules": {}}
    counts: dict[tuple[str, float], list[int]] = {}
    if margins is not None:  # what does not depend on the assignment: the never-seen pieces, each step's forget set
        never_seen = margins["target"]["calibration"] + margins["target"]["holdout"]
        assert len(never_seen) == len(authors), "an example without answer tokens"
        forget = [subset(f, list(range(len(f)))) for f in (margins[f"step-{s}"]["forget"] for s in steps)]
    for reference, holdout in assignments(sorted(set(authors), key=str)):
        rows = {"r": [i for i, a in enumerate(authors) if a in reference]}
        rows["h"] = [i for i, a in enumerate(authors) if a in holdout]

        def auc(name: str, role: str, against: str | None = None, rows: dict = rows) -> float:
            return membership_auc(scores[name]["forget"], [pooled[against or name][i] for i in rows[role]])

        centre = auc("never", "h")
        out["assignments"] += 1
        out["never-trained stop AUC"].append(auc("never", "r"))
        for ref in ("current", "start"):
            stop_aucs = [auc(f"step-{s}", "r", None if ref == "current" else "target") for s in steps]
            for t in thresholds:
                first = next((i for i, a in enumerate(stop_aucs) if a >= t), len(steps) - 1)  # else: the budget
                region = auc(f"step-{steps[first]}", "h")
                tally(counts, (ref, t), abs(region - centre) <= 0.1, stop_aucs[first] >= t)
        if margins is not None:
            held = subset(never_seen, rows["r"])
            for match in MATCHES:
                gaps = [gap(f, held, match) for f in forget]
                for slack in slacks:
                    first = next((i for i, g in enumerate(gaps) if g <= slack), len(steps) - 1)
                    inside = abs(auc(f"step-{steps[first]}", "h") - centre) <= 0.1
                    tally(counts, (f"gap {match}", slack), inside, gaps[first] <= slack)
    for (ref, t), (inside, stopped, landed) in counts.items():
        name = f"{ref} <= {t}" if ref.startswith("gap") else f"AUC {ref} >= {t}"
        out["rules"][name] = {"in region at the end": inside, "stopped itself": stopped, "landed (both)": landed}
    values = out["never-trained stop AUC"]
    out["never-trained stop AUC"] = {"min": min(values), "mean": statistics.mean(values), "max": max(values)}
    return out


def extra_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="*", default=[], help="Saved models to read as well (the demo's stops).")
    parser.add_argument("--gap", action="store_true", help="Also the library's calibration gap stop, per assignment.")
    parser.add_argument(
        "--checkpoints", default=None, help="A run's folder of full-model checkpoint-N folders, read as --run is."
    )


def saved_steps(args: argparse.Namespace, base: Any) -> Iterator[tuple[int, Any]]:
    """The run's saved steps: ``--run``'s adapters, or ``--checkpoints``' full models, every ``--every`` steps."""
    if args.run:
        yield from saved_adapters(args.run, args.every, base)
    elif args.checkpoints:
        for step in saved_step_numbers(args.checkpoints, "checkpoint", args.every):
            folder = os.path.join(args.checkpoints, f"checkpoint-{step}")
            yield step, AutoModelForCausalLM.from_pretrained(folder).eval()


def main() -> None:
    args = study_arguments(
        __doc__.split("\n\n")[0],
        extra_arguments,
    )
    setting, read, _ = study_setting(args)
    margins: dict[str, dict[str, list[dict]]] = {}

    def read_margins(name: str, model: Any) -> None:
        if args.gap:
            margins[name] = {role: by_example(measured) for role, measured in read(model).items()}

    records = {
        "forget": [dict(r) for r in setting.forget_records],
        "calibration": [dict(r) for r in setting.calibration_records],
        "holdout": [dict(r) for r in setting.holdout_records],
    }
    authors = [r.get("author", f"c{i}") for i, r in enumerate(records["calibration"])]
    authors += [r.get("author", f"h{i}") for i, r in enumerate(records["holdout"])]
    scores = {
        "target": scores_of(setting.target_model, setting.tokenizer, records),
        "never": scores_of(setting.reference_model, setting.reference_tokenizer or setting.tokenizer, records),
    }
    read_margins("target", setting.target_model)
    target, never = scores["target"], scores["never"]
    out: dict[str, Any] = {"target": readings(target, target), "never-trained": readings(never, target)}
    calibration_authors = authors[: len(records["calibration"])]
    groups = {
        name: by_author(s["calibration"], calibration_authors) for name, s in (("target", target), ("never", never))
    }
    out["never-trained forget vs each calibration author (never-trained)"] = {
        str(a): membership_auc(never["forget"], s) for a, s in groups["never"].items()
    }
    out["target: each calibration author vs the others (target)"] = {
        str(a): membership_auc(s, [x for b, ss in groups["target"].items() if b != a for x in ss])
        for a, s in groups["target"].items()
    }
    print(json.dumps(out, indent=1), flush=True)
    out["trajectory"] = []
    if args.run or args.checkpoints:
        for step, model in saved_steps(args, setting.target_model):
            scores[f"step-{step}"] = scores_of(model, setting.tokenizer, records)
            read_margins(f"step-{step}", model)
            out["trajectory"].append({"step": step, **readings(scores[f"step-{step}"], target)})
            print(json.dumps(out["trajectory"][-1]), flush=True)
        out["landing"] = landing(scores, authors, [0.3, 0.35, 0.4, 0.45, 0.5], margins or None)
        print(json.dumps(out["landing"], indent=1), flush=True)
    for folder in args.models:
        model = AutoModelForCausalLM.from_pretrained(folder)
        scores[folder] = scores_of(model, setting.tokenizer, records)
        out[folder] = readings(scores[folder], target)
        print(folder, json.dumps(out[folder]), flush=True)
    out["scores"], out["never_seen_authors"] = scores, [str(a) for a in authors]
    if args.output:
        with open(args.output, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
