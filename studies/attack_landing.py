"""Does MASC's stop land by every membership attack, or only by the one it steers by (issue 54)?

The embedded benchmark's target unlearned by MASC with the demo's settings (``hf-unlearn demo``: lr 3e-4, the
calibration authors, every other option at its default), one run per seed. For the stopped model, for the
never-trained (retain-only) model and for the target before unlearning: the AUC of every attack the library ships
(forget answers against the holdout authors' answers, given their questions, as ``hf-unlearn eval`` reads them;
``reference`` with the start model as reference), and per token what Min-K%++ standardises with: the answer token's
log-probability, the mean and spread of the model's log-probabilities at that position, the standardised value and
the token's rank. With ``--every N`` the first seed's run is also measured every N optimizer steps, and
``--no_stop`` runs the same budget without the stop (what a fixed budget gives beside it).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/attack_landing.py --seeds 0 1 2 --every 10 \
        --output attack_landing.json [key=value UnlearnConfig overrides ...]

The library is used through its public API alone (a sharper rival target is the option ``masc_rival_temperature=T``,
given as an override). The two study-only variants measured on the page (``--entropy_weight``, ``--z_weight``, which
patched the rival KL for the run) left the script after commit ad0f376, where they ran:
``git show ad0f376:studies/attack_landing.py``. Findings: docs/studies/attack_landing.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import TrainerCallback

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.benchmarks import learn_retain_only_model, learn_target_model, load_split, retain_split_for
from hf_unlearn.evaluation import (
    embedded_evaluation_sets,
    evaluate_muse,
    evaluate_qa,
    membership_verdict,
    token_statistics,
)
from hf_unlearn.jobs import parse_overrides

SPLIT = "forget10"


def attack_aucs(model, tokenizer, sets, start_model) -> dict[str, float]:
    """Every attack's AUC, forget answers against holdout answers (0.5 = chance, towards 0 = still a member)."""
    return evaluate_muse(model, tokenizer, sets, attack_reference_model=start_model)["auc"]


def token_profile(model, tokenizer, sets, k: float = 0.4) -> dict[str, dict[str, float]]:
    """Per set (forget, holdout): the mean over answer tokens of log p(y), of the mean and the spread of log p(z) at
    that position, of the standardised value (Min-K%++'s), the share of tokens that are the model's top choice, and
    the same means over the lowest ``k`` share of each answer's standardised values (what Min-K%++ averages)."""
    profile = {}
    for name in ("privleak_forget", "privleak_holdout"):
        data = sets[name]
        rows = token_statistics(model, tokenizer, list(data["text"]), prompts=list(data["prompt"]))
        every, lowest = [], []
        for row in rows:
            z = (row["log_prob"].double() - row["mean"].double()) / row["std"].double().clamp(min=1e-12)
            columns = torch.stack([row["log_prob"].double(), row["mean"].double(), row["std"].double(), z], dim=1)
            every.append(columns)
            count = max(1, int(k * len(z)))
            lowest.append(columns[torch.argsort(z)[:count]])
        every_t, lowest_t = torch.cat(every), torch.cat(lowest)
        keys = ("log_prob", "mean", "std", "z")
        entry = {key: every_t[:, i].mean().item() for i, key in enumerate(keys)}
        entry.update({f"lowest_{key}": lowest_t[:, i].mean().item() for i, key in enumerate(keys)})
        profile[name.removeprefix("privleak_")] = entry
    return profile


class AttackTrajectory(TrainerCallback):
    """Every attack's AUC every ``every`` optimizer steps (and at step 0)."""

    def __init__(self, tokenizer, sets, start_model, every: int) -> None:
        self.tokenizer, self.sets, self.start_model, self.every = tokenizer, sets, start_model, every
        self.rows: list[dict] = []

    def measure(self, model, step: int) -> None:
        self.rows.append({"step": step, "auc": attack_aucs(model, self.tokenizer, self.sets, self.start_model)})
        print(f"  step {step}: " + ", ".join(f"{a} {v:.3f}" for a, v in self.rows[-1]["auc"].items()), flush=True)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.measure(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0:
            self.measure(model, state.global_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--every", type=int, default=0, help="measure the first seed's run every N steps (0: off)")
    parser.add_argument("--no_stop", action="store_true", help="run the whole budget, no stop (a fixed budget)")
    parser.add_argument("--learning_rate", type=float, default=3e-4)
    parser.add_argument("--num_train_epochs", type=float, default=80)
    parser.add_argument("--output", default="attack_landing.json")
    parser.add_argument("overrides", nargs="*", help="UnlearnConfig key=value pairs")
    cli = parser.parse_args()
    overrides = parse_overrides(cli.overrides)

    target, tokenizer, _ = learn_target_model(show_progress=False)
    never, _ = learn_retain_only_model(SPLIT)
    sets = embedded_evaluation_sets(SPLIT)
    sets = {name: sets[name] for name in ("privleak_forget", "privleak_holdout", "forget")}
    forget_records, retain_records = load_split(SPLIT), load_split(retain_split_for(SPLIT))
    forget = build_qa_dataset(forget_records, tokenizer)
    retain = build_qa_dataset(retain_records, tokenizer, name="retain")
    calibration = build_qa_dataset(load_split("calibration"), tokenizer, name="calibration")
    start_state = {k: v.clone() for k, v in target.state_dict().items()}

    never_auc = attack_aucs(never, tokenizer, sets, target)
    result = {
        "never_trained": {"auc": never_auc, "tokens": token_profile(never, tokenizer, sets)},
        "target": {
            "auc": attack_aucs(target, tokenizer, sets, target),
            "tokens": token_profile(target, tokenizer, sets),
        },
        "settings": {
            "learning_rate": cli.learning_rate,
            "no_stop": cli.no_stop,
            **overrides,
        },  # fmt: skip
        "runs": [],
    }
    print("never-trained:", json.dumps(never_auc), flush=True)
    for index, seed in enumerate(cli.seeds):
        model = type(target)(target.config)
        model.load_state_dict(start_state)
        callbacks = []
        if cli.every and index == 0:
            callbacks.append(AttackTrajectory(tokenizer, sets, target, cli.every))
        options = dict(
            output_dir=f"/tmp/attack_landing/{seed}", overwrite_output_dir=True, report_to="none",
            save_strategy="no", learning_rate=cli.learning_rate, num_train_epochs=cli.num_train_epochs, seed=seed,
            disable_tqdm=True, masc_threshold="calibration", stop_target="membership", **overrides,
        )  # fmt: skip
        if cli.no_stop:
            options.update(stop_at_target=False)
        trainer = UnlearnTrainer(
            model=model, args=UnlearnConfig(**options), train_dataset=forget, retain_dataset=retain,
            processing_class=tokenizer, calibration_dataset=calibration, callbacks=callbacks,
        )  # fmt: skip
        began = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - began
        unlearned = trainer.model
        auc = attack_aucs(unlearned, tokenizer, sets, target)
        verdict = membership_verdict(auc, never_auc)
        qa = {
            name: evaluate_qa(unlearned, tokenizer, data)
            for name, data in (("forget", forget_records), ("retain", retain_records))
        }
        run = {
            "seed": seed,
            "steps": trainer.state.global_step,
            "stop_reason": trainer.record.stop_reason,
            "stop_kind": trainer.record.stop_kind,
            "seconds": seconds,
            "auc": auc,
            "verdict": verdict,
            "tokens": token_profile(unlearned, tokenizer, sets),
            "forget_rouge_l_recall": qa["forget"]["rouge_l_recall"],
            "retain_rouge_l_recall": qa["retain"]["rouge_l_recall"],
        }
        if callbacks:
            run["trajectory"] = callbacks[0].rows
        result["runs"].append(run)
        print(
            f"seed {seed}: {run['steps']} steps ({run['stop_kind']}), "
            + ", ".join(f"{a} {v:.3f}" for a, v in auc.items())
            + f"; {verdict['distinguishing']} of {verdict['attacks']} attacks tell it apart",
            flush=True,
        )
        with open(cli.output, "w") as f:
            json.dump(result, f, indent=2)
    for attack in never_auc:
        values = [run["auc"][attack] for run in result["runs"]]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(
            f"{attack}: never-trained {never_auc[attack]:.3f}, unlearned {statistics.mean(values):.3f} +- {spread:.3f}"
        )


if __name__ == "__main__":
    main()
