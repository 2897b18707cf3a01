"""Where MASC ends on a pretrained model, token by token (issue 32): one self-stopping MASC run on a TOFU split learned
by SmolLM2-135M, then, under the stopped model, every answer token of the forget authors and of never-seen authors
with its log-probability, its restricted margin (the library's one implementation), the competitor that took its
place and its kind (a fact or name, a function word, punctuation, or the chat template's end tokens), and which
kinds fill Min-K%'s lowest 40%. The run is then measured like ``hf-unlearn compare`` does (the region, fluency).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python studies/masc_landing.py --tofu_dir ../shared/tofu --seed 0 \
        --output_dir study32/defaults-s0 [--author_offset 5] [--masc_overrides key=value ...]
        [--lora_target_modules all-linear]

``--masc_overrides stop_at_target=false max_steps=800 --track_stop_statistics`` runs without the stop and keeps,
every ``--auc_every`` steps, what a stop could read and the adapter (``trajectory/step-N``; ``studies/stop_replay.py``
at f1ebda8 reads them again).

``--save_steps 25`` keeps a checkpoint every 25 steps (the adapter, the optimizer and the stop's state): a run longer
than one sitting is killed and goes on with ``--resume`` as the uninterrupted run would have, and its adapters can be
measured afterwards: ``--measure_checkpoints`` measures every ``checkpoint-N`` of ``output_dir/run`` (and the stopped
``adapter``) as the run's end is measured (every attack, forget and retain ROUGE-L, real knowledge, fluency; the
region's verdict and misses) into ``checkpoints.json``, without training. ``--reference_sets`` reads, under the
pretrained model, the never-trained model and the stopped ``adapter``, each forward attack's AUC of the forget
answers against the calibration and against the holdout authors (``reference_sets.json``), without training.

The target and the never-trained model come from compare's cache; their measurements (the region) are cached in
``--region_cache`` per split, so that each run only measures itself. Writes ``result.json`` and ``tokens.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from typing import Any

import torch
from transformers import TrainerCallback

from hf_unlearn import UnlearnConfig, ViolationStoppingCallback, build_qa_dataset, restricted_margin, tokenize_qa
from hf_unlearn.benchmarks.pretrained import load_smollm2
from hf_unlearn.cli import CompareArguments
from hf_unlearn.evaluation import (
    fluent_like,
    membership_auc,
    min_k_count,
    qa_attack_scores,
    qa_membership_auc,
    qa_membership_aucs,
)
from hf_unlearn.jobs import build_region, build_trainer, in_region, parse_overrides, region_misses, tofu_setting
from hf_unlearn.objectives.masc import NeverSeenLevels, matched_thresholds, spread_by_id, token_levels
from hf_unlearn.scores import shift_for_causal_lm

FUNCTION_WORDS = set(
    "a an the of in on at to for from by with and or but as is are was were be been being has have had his her "
    "their its he she they it this that these those which who whom whose not no also into during over about "
    "after before than such".split()
)
KINDS = ("fact", "function", "punctuation", "end")


def token_kinds(tokenizer: Any, ids: list[int]) -> list[str]:
    """The kind of each answer token: ``end`` for the chat template's closing tokens and EOS (special tokens, and
    whitespace after the answer's last visible token), else function word, punctuation, or fact (the rest)."""
    special = set(tokenizer.all_special_ids)
    texts = [tokenizer.decode([i]) for i in ids]
    last_visible = max(
        (n for n, (i, t) in enumerate(zip(ids, texts, strict=True)) if i not in special and t.strip()), default=-1
    )
    kinds = []
    for n, (i, text) in enumerate(zip(ids, texts, strict=True)):
        word = text.strip().lower()
        if i in special or n > last_visible:
            kinds.append("end")
        elif word in FUNCTION_WORDS:
            kinds.append("function")
        elif not any(c.isalnum() for c in word):
            kinds.append("punctuation")
        else:
            kinds.append("fact")
    return kinds


@torch.no_grad()
def token_table(model: Any, tokenizer: Any, records: list[dict], k: int = 10) -> list[dict]:
    """Every answer token of ``records`` as the training saw it (``tokenize_qa``: the chat template, EOS appended):
    log-probability, restricted margin against the self top-k, the top-1 other token, its kind, its example."""
    model.eval()
    rows = []
    for index, record in enumerate(records):
        example = tokenize_qa(tokenizer, record["question"], record["answer"])
        input_ids = torch.tensor([example["input_ids"]])
        labels = torch.tensor([example["labels"]])
        logits = model(input_ids=input_ids).logits.float()
        shifted, targets = shift_for_causal_lm(logits, labels)
        margin = restricted_margin(shifted, targets, k=k)
        mask = margin.mask[0]
        log_probs = torch.log_softmax(shifted[0], dim=-1)
        answer_ids = targets[0][mask].tolist()
        kinds = token_kinds(tokenizer, answer_ids)
        positions = mask.nonzero().flatten().tolist()
        for n, (pos, token, kind) in enumerate(zip(positions, answer_ids, kinds, strict=True)):
            others = log_probs[pos].clone()
            others[token] = -math.inf
            rival = int(others.argmax())
            rows.append(
                {
                    "example": index,
                    "position": n,
                    "id": token,
                    "token": tokenizer.decode([token]),
                    "kind": kind,
                    "log_prob": float(log_probs[pos, token]),
                    "margin": float(margin.margins[0, pos]),
                    "rival": tokenizer.decode([rival]),
                    "rival_log_prob": float(log_probs[pos, rival]),
                }
            )
    return rows


def summarize_tokens(rows: list[dict]) -> dict[str, Any]:
    """Per kind: count, mean log-prob and margin; and each kind's share of the Min-K% (k = 0.4) lowest tokens of the
    membership attack's completion (template end included, the extra EOS of training excluded: what Min-K% reads)."""
    by_kind: dict[str, Any] = {}
    for kind in KINDS:
        chosen = [r for r in rows if r["kind"] == kind]
        if chosen:
            by_kind[kind] = {
                "count": len(chosen),
                "mean_log_prob": statistics.mean(r["log_prob"] for r in chosen),
                "mean_margin": statistics.mean(r["margin"] for r in chosen),
            }
    lowest: dict[str, int] = dict.fromkeys(KINDS, 0)
    per_example: dict[int, list[dict]] = {}
    for r in rows:
        per_example.setdefault(r["example"], []).append(r)
    min_k_scores = []
    for tokens in per_example.values():
        read = tokens[:-1]  # tokenize_qa appends one EOS after the template's own end; Min-K% reads the completion
        count = min_k_count(len(read), 0.4)
        low = sorted(read, key=lambda r: r["log_prob"])[:count]
        min_k_scores.append(statistics.mean(r["log_prob"] for r in low))
        for r in low:
            lowest[r["kind"]] += 1
    total = sum(lowest.values()) or 1
    return {
        "by_kind": by_kind,
        "min_k_lowest_share": {kind: lowest[kind] / total for kind in KINDS},
        "min_k_mean": statistics.mean(min_k_scores),
    }


def rivals(rows: list[dict], kind: str = "end", top: int = 5) -> list[tuple[str, str, int]]:
    """The most frequent (token, competitor that outranks it) pairs of one kind where the token is no longer top-1."""
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        if r["kind"] == kind and r["rival_log_prob"] > r["log_prob"]:
            counts[(r["token"], r["rival"])] = counts.get((r["token"], r["rival"]), 0) + 1
    return [(t, v, c) for (t, v), c in sorted(counts.items(), key=lambda item: -item[1])[:top]]


class MembershipTrajectory(TrainerCallback):
    """Every ``every`` optimizer steps, the membership AUC the region reads (Min-K%, the forget answers against the
    holdout authors'), with the stopping rule's last probe beside it: which stop statistic tracks the attack. With
    ``calibration`` (the stop's never-seen records) also what a stop could read from them: the Min-K% AUC and means
    of forget against calibration, and the token-matched gap over all answer tokens and over the forget answers' own
    words alone (the tokens the never-seen answers do not use); with ``save_dir``, the adapter at each row."""

    def __init__(
        self, tokenizer: Any, forget: list[dict], holdout: list[dict], every: int,
        calibration: list[dict] | None = None, save_dir: str | None = None,
    ) -> None:  # fmt: skip
        self.tokenizer, self.forget, self.holdout, self.every = tokenizer, forget, holdout, every
        self.calibration, self.save_dir = calibration, save_dir
        self.rows: list[dict[str, float]] = []
        self.stopping: Any = None

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        if self.every <= 0 or state.global_step % self.every:
            return
        was_training = model.training
        model.eval()
        row: dict[str, float] = {"step": state.global_step}
        if self.calibration is None:
            row["membership_auc"] = qa_membership_auc(model, self.tokenizer, self.forget, self.holdout)
        else:
            sets = {"forget": self.forget, "holdout": self.holdout, "calibration": self.calibration}
            scores = {name: qa_attack_scores(model, self.tokenizer, records) for name, records in sets.items()}
            row["membership_auc"] = membership_auc(scores["forget"], scores["holdout"])
            row["auc_forget_vs_calibration"] = membership_auc(scores["forget"], scores["calibration"])
            row.update({f"min_k_mean_{name}": statistics.mean(values) for name, values in scores.items()})
            row.update(matched_gaps(model, self.tokenizer, self.forget, self.calibration))
        model.train(was_training)
        last = self.stopping.history[-1] if self.stopping is not None and self.stopping.history else {}
        keys = ("calibration_gap", "calibration_tail_excess", "calibration_tail")
        row.update({k: last[k] for k in keys if k in last})
        self.rows.append(row)
        if self.save_dir:
            model.save_pretrained(os.path.join(self.save_dir, f"step-{state.global_step}"))
        print("trajectory", json.dumps(self.rows[-1]), flush=True)


def matched_gaps(model: Any, tokenizer: Any, forget: list[dict], calibration: list[dict]) -> dict[str, float]:
    """The library's token-matched calibration gap (:func:`calibration_gap`: shared tokens at their own never-seen
    level and spread, the rest rank-matched among never-seen answers' own words) from full answers, over every answer
    token and over the forget answers' own words alone (what Min-K% mostly reads), and those words' mean
    log-probability beside the never-seen answers' own words'."""
    rows = {name: token_table(model, tokenizer, records) for name, records in (("f", forget), ("c", calibration))}
    margins = {n: torch.tensor([r["margin"] for r in rs]) for n, rs in rows.items()}
    tokens = {n: torch.tensor([r["id"] for r in rs]) for n, rs in rows.items()}
    ids, values, own_margins = token_levels(margins["c"], tokens["c"], torch.unique(tokens["f"]))
    levels = NeverSeenLevels(ids, values, *spread_by_id(margins["c"], tokens["c"], ids, values))
    thresholds = matched_thresholds(margins["f"], own_margins, tokens["f"], levels)
    excess = torch.relu(margins["f"] - thresholds)
    own = ~torch.isin(tokens["f"], ids)
    never_seen_own = ~torch.isin(tokens["c"], torch.unique(tokens["f"]))
    log_probs = {n: torch.tensor([r["log_prob"] for r in rs]) for n, rs in rows.items()}
    return {
        "gap_all": excess.mean().item(),  # calibration_gap's reading, from the thresholds already matched
        "gap_own": excess[own].mean().item() if bool(own.any()) else 0.0,
        "own_share": own.float().mean().item(),
        "own_log_prob_forget": log_probs["f"][own].mean().item() if bool(own.any()) else 0.0,
        "own_log_prob_calibration": log_probs["c"][never_seen_own].mean().item(),
    }


def region_of(setting: Any, cli: CompareArguments, cache: str) -> dict:
    """The target's and the never-trained model's measurements (cached per split), and the region like compare's."""
    if os.path.exists(cache):
        with open(cache) as f:
            return json.load(f)
    before = setting.measure(setting.target_model)
    never = setting.measure(setting.reference_model, setting.reference_tokenizer)
    region = build_region(before, never, cli)
    region["never_trained_misses"] = region_misses(never, region)
    with open(cache, "w") as f:
        json.dump(region, f, indent=1)
    return region


def target_copy(setting: Any) -> Any:
    """A fresh copy of the split's target model, the start of a run or of a checkpoint's adapter."""
    model = type(setting.target_model)(setting.target_model.config)
    model.load_state_dict(setting.target_model.state_dict())
    return model


def verdict(row: dict, region: dict) -> dict:
    """The region's reading of one measured model, as compare reads a run: fluent answers, inside the region, and
    what it misses by."""
    fluent = fluent_like(
        row["forget"]["fluency"], region["never_trained"]["forget"]["fluency"],
        fluent_nll=region["before"]["forget"]["fluency"].get("reference_nll"),
    )  # fmt: skip
    return {"fluent": fluent, "in_region": in_region(row, region), "misses": region_misses(row, region)}


def measure_checkpoints(setting: Any, region: dict, output_dir: str) -> list[dict]:
    """Every saved adapter of the run in ``output_dir`` (``run/checkpoint-N`` by step, then ``adapter``, the stopped
    model) measured as ``hf-unlearn compare`` measures a run, with the region's verdict: what a fixed budget ending
    at that step would have given."""
    from peft import PeftModel

    run = os.path.join(output_dir, "run")
    found = [
        (int(name.split("-")[1]), os.path.join(run, name))
        for name in os.listdir(run)
        if name.startswith("checkpoint-")
    ]
    if os.path.isdir(os.path.join(output_dir, "adapter")):
        found.append((-1, os.path.join(output_dir, "adapter")))
    rows = []
    for step, path in sorted(found, key=lambda item: (item[0] < 0, item[0])):
        model = PeftModel.from_pretrained(target_copy(setting), path).eval()
        row = setting.measure(model)
        rows.append({
            "step": step if step >= 0 else "stop", "path": path, **verdict(row, region),
            "membership_aucs": row["forget"]["membership_aucs"],
            "forget_rouge_l_recall": row["forget"]["rouge_l_recall"],
            "retain_rouge_l_recall": row["retain"]["rouge_l_recall"], "real_knowledge": row["real_knowledge"],
        })  # fmt: skip
        print(json.dumps({k: rows[-1][k] for k in ("step", "in_region", "fluent", "misses")}), flush=True)
        with open(os.path.join(output_dir, "checkpoints.json"), "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def reference_sets(setting: Any, output_dir: str) -> dict[str, dict[str, dict[str, float]]]:
    """Each forward attack's AUC of the forget answers against the calibration authors (the stop's never-seen
    reference) and against the holdout authors (the region's), under the pretrained model the target learned from,
    the never-trained model and the run's stopped adapter where there is one: whether a miss comes from the stop's
    reading or from the two sets of never-seen authors reading differently, and whether the pretrained model, which a
    user has, reads that difference as the never-trained model does."""
    from peft import PeftModel

    attacks = ("min_k", "min_k_plus_plus", "loss", "zlib")
    base, base_tokenizer = load_smollm2()  # the pretrained model the target learned from: it saw no TOFU author
    models = {
        "base": (base.eval(), base_tokenizer),
        "never_trained": (setting.reference_model, setting.reference_tokenizer),
    }
    adapter = os.path.join(output_dir, "adapter")
    if os.path.isdir(adapter):
        models["stopped"] = (PeftModel.from_pretrained(target_copy(setting), adapter).eval(), setting.tokenizer)
    result: dict[str, dict[str, dict[str, float]]] = {}
    for name, (model, tokenizer) in models.items():
        result[name] = {
            against: qa_membership_aucs(model, tokenizer, setting.forget_records, records, attacks=attacks)
            for against, records in (
                ("calibration", setting.calibration_records), ("holdout", setting.holdout_records)
            )
        }  # fmt: skip
        print(json.dumps({name: result[name]}), flush=True)
    with open(os.path.join(output_dir, "reference_sets.json"), "w") as f:
        json.dump(result, f, indent=1)
    return result


def plot(tables: dict[str, list[dict]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(KINDS), figsize=(4 * len(KINDS), 6.5))
    for column, kind in enumerate(KINDS):
        for row, value in enumerate(("log_prob", "margin")):
            ax = axes[row, column]
            for name, rows in tables.items():
                values = [r[value] for r in rows if r["kind"] == kind]
                if values:
                    ax.hist(values, bins=30, alpha=0.5, label=f"{name} ({len(values)})", density=True)
            ax.set_title(f"{kind}: {value}")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tofu_dir", required=True)
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--num_retain_authors", type=int, default=4)
    parser.add_argument("--num_calibration_authors", type=int, default=4)
    parser.add_argument("--num_holdout_authors", type=int, default=4)
    parser.add_argument("--real_knowledge_size", type=int, default=50)
    parser.add_argument("--lora_target_modules", nargs="+", default=None)
    parser.add_argument("--lora_dropout", type=float, default=0.0)
    parser.add_argument("--masc_overrides", nargs="*", default=[])
    parser.add_argument("--region_cache", default=None)
    parser.add_argument(
        "--calibration_from", choices=("calibration", "holdout"), default="calibration",
        help="The stop's never-seen reference: the calibration authors (the method), or the membership attack's own "
        "holdout authors (a diagnostic: is a miss the stop statistic's or its reference set's?).",
    )  # fmt: skip
    parser.add_argument("--auc_every", type=int, default=50, help="Membership AUC every this many steps (0: off).")
    parser.add_argument(
        "--track_stop_statistics", action="store_true",
        help="With --auc_every: also what a stop could read from its never-seen authors; the adapter at each row.",
    )  # fmt: skip
    parser.add_argument("--no_train", action="store_true", help="Only the region and the target's token table.")
    parser.add_argument(
        "--save_steps", type=int, default=0,
        help="Save a checkpoint (adapter, optimizer, the stop's state) every this many steps, so that a run longer "
        "than one sitting goes on with --resume, and the adapters can be measured afterwards (0: none).",
    )  # fmt: skip
    parser.add_argument("--resume", action="store_true", help="Go on from the last checkpoint in output_dir/run.")
    parser.add_argument(
        "--measure_checkpoints", action="store_true",
        help="Measure every saved checkpoint of output_dir/run and the stopped adapter (no training).",
    )  # fmt: skip
    parser.add_argument(
        "--reference_sets", action="store_true",
        help="Each attack's AUC of the forget answers against the calibration and the holdout authors, under the "
        "never-trained model and the stopped adapter of output_dir (no training): reference_sets.json.",
    )  # fmt: skip
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    cli = CompareArguments(
        benchmark="tofu", tofu_dir=args.tofu_dir, author_offset=args.author_offset, seeds=[args.seed],
        num_retain_authors=args.num_retain_authors, num_calibration_authors=args.num_calibration_authors,
        num_holdout_authors=args.num_holdout_authors, real_knowledge_size=args.real_knowledge_size,
        lora_dropout=args.lora_dropout,
        **({"lora_target_modules": args.lora_target_modules} if args.lora_target_modules else {}),
    )  # fmt: skip
    setting = tofu_setting(cli)
    # the default roles keep the earlier sessions' cache names
    roles = (
        ""
        if (args.num_calibration_authors, args.num_holdout_authors) == (2, 2)
        else (f"-cal{args.num_calibration_authors}-holdout{args.num_holdout_authors}")
    )
    cache = args.region_cache or os.path.join(
        os.path.dirname(os.path.abspath(args.output_dir)),
        f"region-offset{args.author_offset}-retain{args.num_retain_authors}-rk{args.real_knowledge_size}{roles}.json",
    )
    region = region_of(setting, cli, cache)
    if args.measure_checkpoints:
        measure_checkpoints(setting, region, args.output_dir)
        return
    if args.reference_sets:
        reference_sets(setting, args.output_dir)
        return
    tokenizer = setting.tokenizer
    forget = [dict(r) for r in setting.forget_records]
    never_seen = [dict(r) for r in setting.holdout_records]
    result: dict[str, Any] = {"args": vars(args), "description": setting.description}
    tables = {}
    if args.no_train:
        model = setting.target_model
    else:
        overrides = parse_overrides(args.masc_overrides)
        config = UnlearnConfig(
            output_dir=os.path.join(args.output_dir, "run"), overwrite_output_dir=not args.resume, method="masc",
            learning_rate=args.learning_rate, seed=args.seed, report_to="none",
            save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
            disable_tqdm=True, logging_strategy="no", per_device_train_batch_size=cli.per_device_train_batch_size,
            **overrides,
        )  # fmt: skip
        model = target_copy(setting)
        calibration = setting.calibration
        if args.calibration_from == "holdout":
            calibration = build_qa_dataset(setting.holdout_records, tokenizer)
        trainer = build_trainer(
            model, tokenizer, config, setting.forget, setting.retain, calibration, setting.peft_config
        )
        by_role = {"holdout": setting.holdout_records, "calibration": setting.calibration_records}
        reference_records = by_role[args.calibration_from]
        trajectory = MembershipTrajectory(
            tokenizer, forget, never_seen, args.auc_every,
            calibration=[dict(r) for r in reference_records] if args.track_stop_statistics else None,
            save_dir=os.path.join(args.output_dir, "trajectory") if args.track_stop_statistics else None,
        )  # fmt: skip
        trajectory.stopping = next(
            (c for c in trainer.callback_handler.callbacks if isinstance(c, ViolationStoppingCallback)), None
        )
        trainer.add_callback(trajectory)
        start = time.perf_counter()
        trainer.train(resume_from_checkpoint=True if args.resume else None)
        record = trainer.record
        model = trainer.model
        model.save_pretrained(os.path.join(args.output_dir, "adapter"))  # the stopped model, for later reading
        result["run"] = {
            "seconds": time.perf_counter() - start,
            "steps": record.global_step,
            "stop_kind": record.stop_kind,
            "stop_reason": record.stop_reason,
            "probe_seconds": record.probe_seconds,
            "probe_history": record.probe_history,
            "overrides": overrides,
            "membership_trajectory": trajectory.rows,
        }
        row = setting.measure(model)
        result["row"] = row
        result.update(verdict(row, region))
        result["landed"] = result["run"]["stop_kind"] == "target" and result["in_region"] and result["fluent"]
    tables["forget (this model)"] = token_table(model, tokenizer, forget)
    tables["never-seen (this model)"] = token_table(model, tokenizer, never_seen)
    result["tokens"] = {name: summarize_tokens(rows) for name, rows in tables.items()}
    result["rivals_end"] = {name: rivals(rows, "end") for name, rows in tables.items()}
    result["rivals_fact"] = {name: rivals(rows, "fact") for name, rows in tables.items()}
    result["never_trained_examples"] = region["never_trained"]["forget"]["fluency"]["examples"]
    result["region"] = {k: v for k, v in region.items() if k not in ("before", "never_trained")}
    result["questions"] = [r["question"] for r in forget[:3]]
    with open(os.path.join(args.output_dir, "result.json"), "w") as f:
        json.dump(result, f, indent=1)
    with open(os.path.join(args.output_dir, "tokens.json"), "w") as f:
        json.dump(tables, f)
    plot(tables, os.path.join(args.output_dir, "tokens.png"))
    print(json.dumps({k: result.get(k) for k in ("in_region", "landed", "fluent", "tokens", "rivals_end")}, indent=1))
    if "row" in result:
        row = result["row"]
        print(
            "steps", result["run"]["steps"], "forget ROUGE-L", row["forget"]["rouge_l_recall"], "AUC",
            row["forget"]["membership_auc"], "retain", row["retain"]["rouge_l_recall"], "RK",
            row["real_knowledge"]["utility"], "repetitive", row["forget"]["fluency"]["repetitive_share"],
        )  # fmt: skip


if __name__ == "__main__":
    main()
