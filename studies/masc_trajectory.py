"""Where along one MASC run the forget set sits closest to never-seen data (issue 32): the embedded benchmark's
target unlearned by MASC with the demo's settings but without the stop, measured every ``--every`` steps: the one-
and two-sided calibration gaps (the stop's reading, and the 1-Wasserstein distance between the forget and the
never-seen margin distributions), forget ROUGE-L, Min-K% AUC against holdout authors, retain ROUGE-L, and each token
kind's mean margin (:func:`masc_landing.token_table`). Beside it the never-trained (retain-only) model's figures.

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/masc_trajectory.py --output study32/trajectory.json \
        [--steps 80] [--every 5] [key=value UnlearnConfig overrides ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from masc_landing import token_table  # noqa: E402

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks import learn_retain_only_model, learn_target_model, load_split, retain_split_for  # noqa: E402
from hf_unlearn.evaluation.bundle import measure_qa_sets  # noqa: E402
from hf_unlearn.jobs.compare import parse_overrides  # noqa: E402
from hf_unlearn.objectives.margin import (  # noqa: E402
    calibrated_thresholds,
    calibration_gap,
    masc_hinge,
    restricted_margin,
    shift_for_causal_lm,
)
from hf_unlearn.objectives.registry import register_forget_objective  # noqa: E402


class TokenMatched:
    """A study-only MASC variant (registered through the objective registry): a forget token whose id also occurs in
    the never-seen answers is held to that id's mean never-seen margin under the start model; the others (the forget
    set's own words) are matched by rank to the never-seen answers' own words. Measured once, before unlearning."""

    def __init__(self, model, tokenizer, forget, calibration, k: int, two_sided: bool, target_only: bool = False):
        self.target_only = target_only
        forget_ids = {t for e in forget for t in e["labels"] if t != -100}
        per_id: dict[int, list[float]] = {}
        specific: list[float] = []
        model.eval()
        with torch.no_grad():
            for example in calibration:
                logits = model(input_ids=torch.tensor([example["input_ids"]])).logits
                shifted, labels = shift_for_causal_lm(logits, torch.tensor([example["labels"]]))
                result = restricted_margin(shifted, labels, k=k)
                for token, margin in zip(
                    labels[result.mask].tolist(), result.margins[result.mask].tolist(), strict=True
                ):
                    if token in forget_ids:
                        per_id.setdefault(token, []).append(margin)
                    else:
                        specific.append(margin)
        ids = sorted(per_id)
        self.ids = torch.tensor(ids)
        self.levels = torch.tensor([statistics.mean(per_id[i]) for i in ids])
        self.specific = torch.tensor(specific).sort().values
        self.two_sided = two_sided
        print(f"token-matched: {len(ids)} shared ids, {len(specific)} never-seen tokens of their own", flush=True)

    def thresholds(self, margins: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(margins)
        shared = torch.isin(tokens, self.ids)
        out[shared] = self.levels[torch.searchsorted(self.ids, tokens[shared])]
        if (~shared).any():
            out[~shared] = calibrated_thresholds(margins[~shared], self.specific)
        return out

    def loss(self, inputs):
        config = inputs.config
        logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
        result = restricted_margin(logits, labels, k=config.masc_k, beta=config.masc_beta)
        if self.target_only:  # push the target's logit down without raising its competitors (beta = 1)
            target = logits.gather(-1, labels.masked_fill(~result.mask, 0).unsqueeze(-1)).squeeze(-1).float()
            result.margins = target - (target - result.margins).detach()
        tau = torch.zeros_like(result.margins)
        tau[result.mask] = self.thresholds(result.margins[result.mask].detach(), labels[result.mask])
        return masc_hinge(result, tau=tau, eta=config.masc_eta, num_items=inputs.num_items, two_sided=self.two_sided)


def two_sided_gap(margins: torch.Tensor, calibration: torch.Tensor) -> float:
    """Mean |sorted forget margin - never-seen margin at the same quantile|: the 1-Wasserstein distance."""
    ordered = margins.float().sort().values
    return (ordered - calibrated_thresholds(ordered, calibration)).abs().mean().item()


def kinds(model, tokenizer, records) -> dict[str, float]:
    rows = token_table(model, tokenizer, records)
    return {
        kind: statistics.mean(r["margin"] for r in rows if r["kind"] == kind)
        for kind in ("fact", "function", "punctuation", "end")
        if any(r["kind"] == kind for r in rows)
    }


def measure(model, tokenizer, sets, holdout) -> dict:
    row = measure_qa_sets(model, tokenizer, sets, forget_set="forget", membership_holdout=holdout)
    return {
        "forget_rouge_l": row["forget"]["rouge_l_recall"],
        "membership_auc": row["forget"]["membership_auc"],
        "retain_rouge_l": row["retain"]["rouge_l_recall"],
    }


class Trajectory(TrainerCallback):
    def __init__(self, trainer_ref, tokenizer, sets, holdout, every):
        self.trainer_ref, self.tokenizer, self.sets, self.holdout, self.every = (
            trainer_ref,
            tokenizer,
            sets,
            holdout,
            every,
        )
        self.rows = []

    def record(self, step, model):
        trainer = self.trainer_ref[0]
        probes = trainer.probes
        forget = probes.measure_margins(probes.sets.train)["margins"]
        calibration = probes.calibration_thresholds().cpu()
        row = {
            "step": step,
            "gap_one_sided": calibration_gap(forget, calibration),
            "gap_two_sided": two_sided_gap(forget, calibration),
            **measure(model, self.tokenizer, self.sets, self.holdout),
            "forget_margin_by_kind": kinds(model, self.tokenizer, [dict(r) for r in self.sets["forget"]]),
        }
        self.rows.append(row)
        print(
            json.dumps(
                {
                    k: (round(v, 3) if isinstance(v, float) else v)
                    for k, v in row.items()
                    if k != "forget_margin_by_kind"
                }
            ),
            {k: round(v, 2) for k, v in row["forget_margin_by_kind"].items()},
            flush=True,
        )

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            self.record(state.global_step, model)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output", required=True)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--every", type=int, default=5)
    parser.add_argument("--match", choices=("rank", "token", "token_two_sided"), default="rank")
    parser.add_argument("--target_only", action="store_true", help="Competitors' logits get no gradient.")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    model, tokenizer, _ = learn_target_model()
    never, _ = learn_retain_only_model("forget10")
    forget, retain = load_split("forget10"), load_split(retain_split_for("forget10"))
    holdout = [dict(r) for r in load_split("holdout")]
    sets = {"forget": forget, "retain": retain.select(range(60))}
    config = UnlearnConfig(
        output_dir="/tmp/masc-trajectory", overwrite_output_dir=True, method="masc", report_to="none",
        save_strategy="no", disable_tqdm=True, max_steps=args.steps, stop_on_violation=False, learning_rate=3e-4,
        **parse_overrides(args.overrides),
    )  # fmt: skip
    calibration = build_qa_dataset(load_split("calibration"), tokenizer, name="calibration")
    forget_data = build_qa_dataset(forget, tokenizer)
    if args.match != "rank":
        matched = TokenMatched(
            model,
            tokenizer,
            forget_data,
            calibration,
            config.masc_k,
            args.match.endswith("two_sided"),
            args.target_only,
        )
        register_forget_objective("masc_token_matched", needs_calibration=lambda c: True)(matched.loss)
        config = UnlearnConfig(
            output_dir="/tmp/masc-trajectory", overwrite_output_dir=True, forget_loss="masc_token_matched",
            retain_loss="kl", forget_weight=0.1, retain_weight=1.0, report_to="none", save_strategy="no",
            disable_tqdm=True, max_steps=args.steps, stop_on_violation=False, learning_rate=3e-4, probe_interval=5,
            **parse_overrides(args.overrides),
        )  # fmt: skip
    ref: list = []
    callback = Trajectory(ref, tokenizer, sets, holdout, args.every)
    trainer = UnlearnTrainer(
        model=model, args=config, train_dataset=forget_data,
        retain_dataset=build_qa_dataset(retain, tokenizer, name="retain"), processing_class=tokenizer,
        calibration_dataset=calibration,
        callbacks=[callback],
    )  # fmt: skip
    ref.append(trainer)
    callback.record(0, trainer.model)
    trainer.train()
    result = {
        "overrides": args.overrides,
        "match": args.match,
        "never_trained": {
            **measure(never, tokenizer, sets, holdout),
            "forget_margin_by_kind": kinds(never, tokenizer, [dict(r) for r in forget]),
        },
        "trajectory": callback.rows,
    }
    print("never-trained", result["never_trained"])
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
