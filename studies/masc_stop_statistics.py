"""Which stop statistic tracks the membership attack (issue 32): one MASC run on the embedded demo's target with the
demo's settings and the stop switched off, and every 10 steps the Min-K% AUC the demo's region reads (forget10
against the holdout authors), beside what a stop could read from the calibration authors (the stop's never-seen
reference): the calibration gap the run's probe measured, the Min-K% AUC and mean of forget against calibration, and
the pooled lowest-40% margin of forget minus that of calibration, and the token-matched gap over all answer tokens and
over the forget answers' own words (``masc_landing.matched_gaps``).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/masc_stop_statistics.py --seed 0 --steps 300 --output rows.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import torch
from masc_landing import matched_gaps  # the study next to this one (scripts run from their folder)
from transformers import TrainerCallback

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.benchmarks import learn_target_model, load_split
from hf_unlearn.data.examples import tokenize_qa
from hf_unlearn.evaluation.bundle import qa_membership_auc
from hf_unlearn.evaluation.membership import membership_auc, min_k_count
from hf_unlearn.objectives.margin import restricted_margin, shift_for_causal_lm
from hf_unlearn.training.callbacks import ViolationStoppingCallback


def lowest_mean(values: torch.Tensor, k: float = 0.4) -> float:
    return torch.topk(values.double(), min_k_count(values.numel(), k), largest=False).values.mean().item()


@torch.no_grad()
def answer_tokens(model: Any, tokenizer: Any, records: list[dict]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per answer as the training saw it: its tokens' restricted margins (k = 10) and log-probabilities."""
    out = []
    for record in records:
        example = tokenize_qa(tokenizer, record["question"], record["answer"])
        logits = model(input_ids=torch.tensor([example["input_ids"]])).logits.float()
        shifted, targets = shift_for_causal_lm(logits, torch.tensor([example["labels"]]))
        margin = restricted_margin(shifted, targets, k=10)
        mask = margin.mask[0]
        log_probs = torch.log_softmax(shifted[0], -1).gather(-1, targets[0].clamp(min=0)[:, None])[:, 0]
        out.append((margin.margins[0][mask], log_probs[mask]))
    return out


class StopStatistics(TrainerCallback):
    def __init__(self, tokenizer: Any, sets: dict[str, list[dict]], every: int = 10) -> None:
        self.tokenizer, self.sets, self.every = tokenizer, sets, every
        self.rows: list[dict[str, float]] = []
        self.stopping: Any = None

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if state.global_step % self.every:
            return
        model.eval()
        tokens = {name: answer_tokens(model, self.tokenizer, records) for name, records in self.sets.items()}
        min_k = {name: [lowest_mean(lp) for _, lp in rows] for name, rows in tokens.items()}
        pooled = {name: lowest_mean(torch.cat([m for m, _ in rows])) for name, rows in tokens.items()}
        last = self.stopping.history[-1] if self.stopping.history else {}
        sets = self.sets
        row = {
            "step": state.global_step,
            "auc_forget_vs_holdout": qa_membership_auc(model, self.tokenizer, sets["forget"], sets["holdout"]),
            "auc_forget_vs_calibration": membership_auc(min_k["forget"], min_k["calibration"]),
            **{f"min_k_mean_{name}": statistics.mean(values) for name, values in min_k.items()},
            "pooled_margin_tail_excess": pooled["forget"] - pooled["calibration"],
            "calibration_gap": last.get("calibration_gap"),
            **matched_gaps(model, self.tokenizer, sets["forget"], sets["calibration"]),
        }
        self.rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
        model.train()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--output", required=True)
    parser.add_argument(
        "--reference", choices=("calibration", "holdout"), default="calibration",
        help="The run's never-seen set: the calibration authors (the demo's), or the attack's holdout authors.",
    )  # fmt: skip
    args = parser.parse_args()
    model, tokenizer, _ = learn_target_model(show_progress=False)
    names = {"forget": "forget10", "retain": "retain90", "calibration": "calibration", "holdout": "holdout"}
    records = {role: [dict(r) for r in load_split(split)] for role, split in names.items()}
    config = UnlearnConfig(
        output_dir=args.output + ".run",
        learning_rate=3e-4,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        seed=args.seed,
        max_steps=args.steps,
        stop_on_violation=False,
        logging_strategy="no",
    )  # fmt: skip (the demo's learning rate, its defaults otherwise)
    datasets = {role: build_qa_dataset(rows, tokenizer) for role, rows in records.items()}
    trainer = UnlearnTrainer(
        model, config, datasets["forget"], datasets["retain"], processing_class=tokenizer,
        calibration_dataset=datasets[args.reference],
    )  # fmt: skip
    tracker = StopStatistics(tokenizer, {k: records[k] for k in ("forget", "calibration", "holdout")})
    tracker.stopping = next(c for c in trainer.callback_handler.callbacks if isinstance(c, ViolationStoppingCallback))
    trainer.add_callback(tracker)
    trainer.train()
    with open(args.output, "w") as f:
        json.dump(tracker.rows, f, indent=1)


if __name__ == "__main__":
    main()
