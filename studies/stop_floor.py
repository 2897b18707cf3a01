"""What the calibrated stop's gap reads where a run should end (issue 32): the library's calibration gap (the probe's
statistic, :func:`~hf_unlearn.objectives.margin.calibration_gap`, per ``calibration_match``) of

* the forget answers under the **never-trained** model (the model the run should end at) against the calibration
  answers under the target (what the stop compares with: ``calibration_reference='start'``);
* another never-seen set (the holdout authors) under the target against the same calibration answers: the gap that
  never-seen data itself reads, the *floor* a slack could be set at without a never-trained model;
* estimates a library could make from the calibration set alone, before unlearning: each calibration author
  against the other calibration authors (leave one author out), each pair of them against the rest, and random
  halves of the calibration answers against the other half;
* for TOFU, the forget answers against the calibration answers under the pretrained SmolLM2 the target was
  fine-tuned from (a model that saw neither set: does it read what the never-trained model reads?);
* the reverse gap (the calibration answers against the forget answers as the reference): how much more familiar
  never-seen data looks than the forget set; where it meets the forward gap, the matched margins agree on average;
* with ``--run``, the forget and holdout answers under each saved adapter of a ``masc_landing.py
  --track_stop_statistics`` run (does the floor drift while unlearning?).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/stop_floor.py --benchmark tofu --tofu_dir ../shared/tofu \\
        --author_offset 5 --num_calibration_authors 4 --num_holdout_authors 4 [--run tofuB/B-idspread-kl5-s0]
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/stop_floor.py --benchmark embedded
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
from collections.abc import Callable, Iterator
from typing import Any

import torch
from peft import PeftModel

from hf_unlearn import build_qa_dataset
from hf_unlearn.cli.arguments import CompareArguments
from hf_unlearn.jobs.compare_setups import embedded_setting, tofu_setting
from hf_unlearn.objectives.margin import (
    NeverSeenLevels,
    calibration_gap,
    measure_violations,
    spread_by_id,
    token_levels,
)
from hf_unlearn.training.config import UnlearnConfig

MATCHES = ("token", "id_spread")


def margins_of(model: Any, examples: list[dict], pad_token_id: int, config: UnlearnConfig) -> dict[str, Any]:
    """Every answer token's margin and id under ``model``, as the probe measures them."""
    return measure_violations(
        model, examples, pad_token_id, k=config.masc_k, tau=config.masc_tau, beta=config.masc_beta, batch_size=8
    )


def gap(measured: dict[str, Any], never_seen: dict[str, Any], match: str) -> float:
    """The probe's calibration gap of ``measured`` against ``never_seen`` (levels over the ids ``measured`` uses)."""
    ids, levels, own, _, spread = token_levels(
        never_seen["margins"], never_seen["tokens"], torch.unique(measured["tokens"])
    )
    offsets = None
    if match == "id_spread":
        spread, offsets = spread_by_id(never_seen["margins"], never_seen["tokens"], ids, levels)
    reference = NeverSeenLevels(ids, levels, None, spread if match == "id_spread" else None, offsets)
    return calibration_gap(measured["margins"], own, measured["tokens"], reference)


def by_example(measured: dict[str, Any]) -> list[dict[str, torch.Tensor]]:
    """The flat margins and ids of :func:`measure_violations` cut back into one piece per example (its answer
    length), so that any subset of examples is a concatenation, not another forward pass."""
    pieces = zip(
        measured["margins"].split(measured["lengths"].tolist()),
        measured["tokens"].split(measured["lengths"].tolist()),
        strict=True,
    )
    return [{"margins": m, "tokens": t} for m, t in pieces]


def subset(pieces: list[dict[str, torch.Tensor]], indices: list[int]) -> dict[str, torch.Tensor]:
    return {key: torch.cat([pieces[i][key] for i in indices]) for key in ("margins", "tokens")}


def estimates(pieces: list[dict[str, torch.Tensor]], authors: list[Any], match: str) -> dict[str, float]:
    """What the calibration set alone says never-seen data reads: leave one author out, leave two out, and twenty
    random halves (both directions), each the mean over its splits."""
    names = sorted(set(authors))
    everyone = range(len(pieces))

    def held_out(group: set) -> float:
        inside = [i for i in everyone if authors[i] in group]
        return gap(subset(pieces, inside), subset(pieces, [i for i in everyone if i not in set(inside)]), match)

    one = [held_out({a}) for a in names]
    two = [held_out(set(pair)) for pair in itertools.combinations(names, 2)]
    rng = random.Random(0)
    halves = []
    for _ in range(10):
        order = list(everyone)
        rng.shuffle(order)
        first, second = order[: len(order) // 2], order[len(order) // 2 :]
        halves += [gap(subset(pieces, first), subset(pieces, second), match)]
        halves += [gap(subset(pieces, second), subset(pieces, first), match)]
    return {
        "leave one author out (mean)": sum(one) / len(one),
        "leave one author out (each)": one,
        "leave two authors out (mean)": sum(two) / len(two),
        "random halves (mean)": sum(halves) / len(halves),
    }


def comparison_halves(
    forget: dict[str, torch.Tensor],
    start: list[dict[str, torch.Tensor]],
    now: list[dict[str, torch.Tensor]],
    authors: list[Any],
    match: str,
) -> dict[str, float]:
    """The calibration set cut in two: one half is the reference (its margins under the target, as the stop holds
    them), the other is measured under the current model beside the forget set, as never-seen data under the same
    model. The forget set's gap minus the comparison half's (0 or below: the forget set reads like never-seen data
    under this model), for the first cut by author names (each way), the mean over every even cut of the authors
    (each way), and the mean over six random cuts of the examples (what a library without author labels can do)."""
    names = sorted(set(authors))

    def excess(reference: list[int], comparison: list[int]) -> float:
        held = subset(start, reference)
        return gap(forget, held, match) - gap(subset(now, comparison), held, match)

    def cut(group: set) -> tuple[list[int], list[int]]:
        inside = [i for i, a in enumerate(authors) if a in group]
        return inside, [i for i, a in enumerate(authors) if a not in group]

    first, second = cut(set(names[: len(names) // 2]))
    by_author = [
        excess(*pair)
        for group in itertools.combinations(names, len(names) // 2)
        if names[0] in group  # each cut once, then both ways
        for pair in (cut(set(group)), cut(set(group))[::-1])
    ]
    rng = random.Random(0)
    by_example = []
    for _ in range(3):
        order = list(range(len(authors)))
        rng.shuffle(order)
        one, two = sorted(order[: len(order) // 2]), sorted(order[len(order) // 2 :])
        by_example += [excess(one, two), excess(two, one)]
    return {
        f"halves {match}: first cut (a)": excess(first, second),
        f"halves {match}: first cut (b)": excess(second, first),
        f"halves {match}: every author cut (mean)": sum(by_author) / len(by_author),
        f"halves {match}: random example cuts (mean)": sum(by_example) / len(by_example),
    }


SETS = ("forget", "calibration", "holdout")


def study_arguments(
    description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None
) -> argparse.Namespace:
    """The options this script, ``signed_gap.py`` and ``auc_floor.py`` share: the benchmark and split, a saved run,
    the output; ``extra`` adds a script's own."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--benchmark", choices=("tofu", "embedded"), default="tofu")
    parser.add_argument("--tofu_dir", default=None)
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--num_calibration_authors", type=int, default=4)
    parser.add_argument("--num_holdout_authors", type=int, default=4)
    parser.add_argument("--run", default=None, help="A masc_landing.py --track_stop_statistics output folder.")
    parser.add_argument("--every", type=int, default=100, help="Read every this many steps of --run.")
    parser.add_argument("--output", default=None)
    if extra is not None:
        extra(parser)
    return parser.parse_args()


def study_setting(args: argparse.Namespace) -> tuple[Any, Callable[..., dict[str, dict[str, Any]]], list[Any]]:
    """The benchmark's setting (as ``compare`` builds it), a reader of every answer token's margin per set
    (:data:`SETS`) under a model, and each calibration example's author."""
    if args.benchmark == "tofu":
        cli = CompareArguments(
            benchmark="tofu", tofu_dir=args.tofu_dir, author_offset=args.author_offset, seeds=[0],
            num_calibration_authors=args.num_calibration_authors, num_holdout_authors=args.num_holdout_authors,
        )  # fmt: skip
        setting = tofu_setting(cli)
    else:
        setting = embedded_setting(CompareArguments(benchmark="embedded", seeds=[0]))
    tokenizer = setting.tokenizer
    config = UnlearnConfig(output_dir="/tmp/stop_floor", method="masc", report_to="none")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    examples = {
        "forget": [dict(e) for e in setting.forget],
        "calibration": [dict(e) for e in setting.calibration],
        "holdout": [dict(e) for e in build_qa_dataset(setting.holdout_records, tokenizer)],
    }

    def read(model: Any, sets: tuple[str, ...] = SETS) -> dict[str, dict[str, Any]]:
        model.eval()
        return {s: margins_of(model, examples[s], pad, config) for s in sets}

    return setting, read, [r.get("author", i) for i, r in enumerate(setting.calibration_records)]


def saved_step_numbers(folder: str, prefix: str, every: int) -> list[int]:
    """The steps of ``folder``'s ``{prefix}-N`` subfolders that are multiples of ``every``, in order."""
    names = os.listdir(folder)
    steps = sorted(int(m.group(1)) for n in names if (m := re.fullmatch(rf"{re.escape(prefix)}-(\d+)", n)))
    return [step for step in steps if step % every == 0]


def saved_adapters(run: str, every: int, base: Any) -> Iterator[tuple[int, Any]]:
    """Each adapter a ``masc_landing.py --track_stop_statistics`` run saved at a multiple of ``every`` steps, on
    ``base`` (unloaded again before the next one is read)."""
    folder = os.path.join(run, "trajectory")
    for step in saved_step_numbers(folder, "step", every):
        model = PeftModel.from_pretrained(base, os.path.join(folder, f"step-{step}")).eval()
        yield step, model
        base = model.unload()


def main() -> None:
    args = study_arguments(__doc__.split("\n\n")[0])
    setting, read, authors = study_setting(args)
    rows: list[dict[str, Any]] = []
    target = read(setting.target_model)
    never = read(setting.reference_model)
    cal = target["calibration"]
    base = None
    if args.benchmark == "tofu":
        from hf_unlearn.benchmarks.pretrained import load_smollm2

        base = read(load_smollm2()[0])
    pieces = by_example(cal)
    assert len(pieces) == len(authors), "an example without answer tokens"
    for match in MATCHES:
        row = {
            "match": match,
            "target: forget vs calibration (the probe at step 0)": gap(target["forget"], cal, match),
            "target: holdout vs calibration (the never-seen floor)": gap(target["holdout"], cal, match),
            **{f"target: {k}": v for k, v in estimates(pieces, authors, match).items()},
            "never-trained forget vs target calibration (the stop should read)": gap(never["forget"], cal, match),
            "never-trained holdout vs target calibration": gap(never["holdout"], cal, match),
            "never-trained forget vs never-trained calibration": gap(never["forget"], never["calibration"], match),
            **(
                {
                    "pretrained forget vs pretrained calibration": gap(base["forget"], base["calibration"], match),
                    "pretrained holdout vs pretrained calibration": gap(base["holdout"], base["calibration"], match),
                    "pretrained forget vs target calibration": gap(base["forget"], cal, match),
                }
                if base
                else {}
            ),
            "reverse: target calibration vs target forget": gap(cal, target["forget"], match),
            "reverse: target calibration vs never-trained forget": gap(cal, never["forget"], match),
            "reverse: target calibration vs target holdout": gap(cal, target["holdout"], match),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    trajectory: list[dict[str, Any]] = []
    if args.run:
        for step, model in saved_adapters(args.run, args.every, setting.target_model):
            measured = read(model, ("forget", "holdout", "calibration"))
            now = by_example(measured["calibration"])
            entry: dict[str, Any] = {"step": step}
            for match in MATCHES:
                entry[f"forget {match}"] = gap(measured["forget"], cal, match)
                entry[f"holdout {match}"] = gap(measured["holdout"], cal, match)
                entry[f"reverse {match}"] = gap(cal, measured["forget"], match)
                entry.update(comparison_halves(measured["forget"], pieces, now, authors, match))
            trajectory.append(entry)
            print(json.dumps(entry), flush=True)
    if args.output:
        with open(args.output, "w") as f:
            json.dump({"args": vars(args), "gaps": rows, "trajectory": trajectory}, f, indent=1)


if __name__ == "__main__":
    main()
