"""What the demo's verdict can judge at each size of the fictitious authors (issue 66, part 3).

For each seed: run ``hf-unlearn demo --size SIZE --seed S`` (skipped where ``OUT/SIZE-seed-S`` already holds a run),
then read its record: every attack's AUC difference to the never-trained model with the paired 95 % interval the
verdict reads, the verdict, the stop and the seconds. Prints one JSON line per run and a Markdown table.

    python studies/judge_size.py OUT --size judge --seeds 0 1 2 [--cache_dir C] [--reread] [--fluency] [--region]
        [--demo_flags ...]

``--region`` judges each run by every measure compare's region reads (:func:`~hf_unlearn.jobs.region_misses`:
forget ROUGE-L, every attack with its paired interval, retain ROUGE-L against 0.95 x the lower of the target's and the
never-trained model's, and the forget answers' fluency), the target, the never-trained model and the run each
measured the same way on the forget set, a fixed sample of the retain split as large as the forget set, and the
holdout authors; ``in_region`` is the issue's "landed".

``--fluency`` also reads the forget answers' fluency the way compare's region does (repetitive, empty, damaged and
run-on shares and the NLL under the never-trained model, :func:`~hf_unlearn.evaluation.fluency.fluency_misses`, with
the target's answers as the fluent level) and the never-trained model's own forget ROUGE-L, the level the region's
forget ROUGE-L reads against. ``--demo_flags`` are passed to the demo as they are (e.g. ``--masc_threshold rho
--stop_target alpha``: the paper's mode instead of the demo's calibrated one).

``--reread`` reads the membership verdict of the saved runs again with this checkout's code (the saved weights, the
never-trained and start models from the cache) instead of taking the one in their records.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys


def run_demo(out: str, size: str, seed: int, cache_dir: str | None, flags: list[str]) -> None:
    if os.path.exists(os.path.join(out, "unlearn_record.json")):
        return
    command = [sys.executable, "-m", "hf_unlearn.cli.main", "demo", "--size", size, "--seed", str(seed)]
    command += ["--output_dir", out] + (["--cache_dir", cache_dir] if cache_dir else []) + flags
    subprocess.run(command, check=True, env=dict(os.environ, HF_HUB_OFFLINE="1"), stdout=subprocess.DEVNULL)


def reread(out: str, size: str, cache_dir: str | None) -> dict:
    """The demo's membership read (:func:`~hf_unlearn.jobs.membership_after`) of the saved weights, now."""
    from transformers import AutoModelForCausalLM

    from hf_unlearn.benchmarks import benchmark_size, learn_retain_only_model, learn_target_model
    from hf_unlearn.jobs import membership_after

    settings = benchmark_size(size)
    never_trained, tokenizer = learn_retain_only_model("forget10", cache_dir, **settings)
    start = learn_target_model(cache_dir=cache_dir, show_progress=False, **settings)[0]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    return membership_after(model, never_trained, start, tokenizer, "forget10", **settings)


def fluency(out: str, size: str, cache_dir: str | None) -> dict:
    """The saved run's forget answers against the never-trained model's: fluency misses (empty where none) and both
    forget ROUGE-L recalls."""
    from transformers import AutoModelForCausalLM

    from hf_unlearn.benchmarks import benchmark_size, learn_retain_only_model, learn_target_model, load_split
    from hf_unlearn.evaluation import evaluate_qa
    from hf_unlearn.evaluation.fluency import answer_fluency, fluency_levels, fluency_misses

    settings = benchmark_size(size)
    never_trained, tokenizer = learn_retain_only_model("forget10", cache_dir, **settings)
    target = learn_target_model(cache_dir=cache_dir, show_progress=False, **settings)[0]
    forget = load_split("forget10", **settings)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    never_read = answer_fluency(never_trained, tokenizer, forget, reference_model=never_trained)
    fluent = answer_fluency(target, tokenizer, forget, reference_model=never_trained)
    read = answer_fluency(model, tokenizer, forget, reference_model=never_trained)
    misses = fluency_misses(
        read, never_read, fluent_nll=fluent["reference_nll"], levels=fluency_levels(fluent, never_read)
    )
    return {
        "fluency_misses": misses,
        "never_trained_forget_rouge_l": evaluate_qa(never_trained, tokenizer, forget)["rouge_l_recall"],
    }


def region_row(model, setting: dict) -> dict:
    """One model measured as compare measures a run (every attack, the fluency of its forget answers)."""
    from hf_unlearn.jobs import measure_for_region

    return measure_for_region(
        model, setting["tokenizer"], setting["forget"], setting["retain"], setting["holdout"],
        target_model=setting["target"], fluency_reference=setting["never_trained"],
    )  # fmt: skip


def region_setting(size: str, cache_dir: str | None) -> dict:
    """The models and sets of ``--region``, and compare's region built from the target's and the never-trained
    model's measurements (tolerances and retain ratio: compare's defaults)."""
    from types import SimpleNamespace

    from hf_unlearn.benchmarks import benchmark_size, learn_retain_only_model, learn_target_model, load_split
    from hf_unlearn.jobs import build_region

    settings = benchmark_size(size)
    never_trained, tokenizer = learn_retain_only_model("forget10", cache_dir, **settings)
    target = learn_target_model(cache_dir=cache_dir, show_progress=False, **settings)[0]
    forget = load_split("forget10", **settings)
    retain = load_split("retain90", **settings).shuffle(seed=0).select(range(len(forget)))
    setting = {
        "tokenizer": tokenizer, "target": target, "never_trained": never_trained, "forget": forget,
        "retain": retain, "holdout": load_split("holdout", **settings),
    }  # fmt: skip
    tolerances = SimpleNamespace(forget_rouge_tolerance=0.1, membership_tolerance=0.1, retain_ratio=0.95)
    setting["region"] = build_region(region_row(target, setting), region_row(never_trained, setting), tolerances)
    return setting


def region(out: str, setting: dict) -> dict:
    """The saved run against compare's region: what it misses (empty: landed by every measure)."""
    from transformers import AutoModelForCausalLM

    from hf_unlearn.jobs import region_misses

    row = region_row(AutoModelForCausalLM.from_pretrained(out).eval(), setting)
    misses = region_misses(row, setting["region"])
    never = setting["region"]["never_trained"]
    return {
        "in_region": not misses,
        "region_misses": misses,
        "region_forget_rouge_l": row["forget"]["rouge_l_recall"],
        "region_retain_rouge_l": row["retain"]["rouge_l_recall"],
        "never_trained_rouge_l": [never["forget"]["rouge_l_recall"], never["retain"]["rouge_l_recall"]],
        "target_retain_rouge_l": setting["region"]["before"]["retain"]["rouge_l_recall"],
    }


def measure(out: str, membership: dict | None = None) -> dict:
    with open(os.path.join(out, "unlearn_record.json")) as f:
        record = json.load(f)
    membership = membership or record["evaluation"]["membership"]
    verdict = membership["membership"]
    attacks = {
        attack: {
            "off": row["off"],
            "half_width": (row["off_interval"][1] - row["off_interval"][0]) / 2,
            "verdict": row["verdict"],
        }
        for attack, row in verdict["per_attack"].items()
    }
    return {
        "stop_kind": record.get("stop_kind"),
        "stop_step": record.get("stop_step"),
        "landed": verdict["landed"],
        "forget_rouge_l": record["after"]["forget"]["rouge_l_recall"],
        "retain_rouge_l": record["after"]["retain"]["rouge_l_recall"],
        "attacks": attacks,
        "seconds": record["extra"]["demo_seconds"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output_dir")
    parser.add_argument("--size", default="judge")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--reread", action="store_true")
    parser.add_argument("--fluency", action="store_true")
    parser.add_argument("--region", action="store_true")
    parser.add_argument("--demo_flags", nargs=argparse.REMAINDER, default=[])
    cli = parser.parse_args()
    rows = []
    setting = None
    for seed in cli.seeds:
        out = os.path.join(cli.output_dir, f"{cli.size}-seed-{seed}")
        run_demo(out, cli.size, seed, cli.cache_dir, cli.demo_flags)
        again = reread(out, cli.size, cli.cache_dir) if cli.reread else None
        row = {"size": cli.size, "seed": seed, **measure(out, again)}
        if cli.fluency:
            row.update(fluency(out, cli.size, cli.cache_dir))
        if cli.region:
            setting = setting or region_setting(cli.size, cli.cache_dir)
            row.update(region(out, setting))
        print(json.dumps(row), flush=True)
        rows.append(row)
    attacks = list(rows[0]["attacks"])
    header = [f"{a}: off ± paired 95 % (verdict)" for a in attacks]
    print("\n| seed | stop | " + " | ".join(header) + " | membership landed | forget / retain ROUGE-L | s |")
    print("|---" * (len(attacks) + 5) + "|")
    for r in rows:
        cells = [f"{r['attacks'][a]['off']:+.3f} ± {r['attacks'][a]['half_width']:.3f} ({r['attacks'][a]['verdict']})"
                 for a in attacks]  # fmt: skip
        stop = f"{r['stop_kind']} at {r['stop_step']}"
        rouge = f"{r['forget_rouge_l']:.3f} / {r['retain_rouge_l']:.3f}"
        print(f"| {r['seed']} | {stop} | " + " | ".join(cells) + f" | {r['landed']} | {rouge} | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
