"""`hf-unlearn demo`: learn an embedded benchmark (offline, cached), then forget its forget split, with the report and
the card (the fictitious authors, TOFU-shaped; or the fictitious chronicles, MUSE-shaped)."""

from __future__ import annotations

import os
import time
from typing import Any

from transformers.utils import logging

from ..objectives.masc.options import reads_calibration
from ..outputs.report import membership_section, write_report
from ..training.config import UnlearnConfig
from ..training.output_dir import prepare_output_dir
from ..training.trainer import UnlearnTrainer
from .models import build_trainer
from .unlearn import unlearn_and_report, whole_model_here

logger = logging.get_logger(__name__)


def embedded_reference(
    split: str = "forget10", cache_dir: str | None = None, architecture: str = "llama", **size: Any
) -> dict[str, Any]:
    """What forget quality and PrivLeak compare with on the embedded benchmark: the evaluation (forget truth ratios,
    membership-attack AUCs) of its retain-only model, learned once and cached. ``size``: the benchmark's size
    settings (default the quick one)."""
    from ..benchmarks.target_model import learn_retain_only_model
    from ..evaluation.options import truth_ratios
    from ..evaluation.suites import embedded_evaluation_sets, evaluate_muse

    model, tokenizer = learn_retain_only_model(split, cache_dir, architecture, **size)
    sets = embedded_evaluation_sets(split, **size)
    privleak_sets = {name: sets[name] for name in ("privleak_forget", "privleak_holdout")}
    return {
        "forget_truth_ratios": truth_ratios(model, tokenizer, sets["forget"]),
        "muse": evaluate_muse(model, tokenizer, privleak_sets),
    }


def membership_after(
    model: Any, never_trained: Any, start_model: Any, tokenizer: Any, split: str, **size: Any
) -> dict[str, Any]:
    """Every membership attack on the forget answers against the holdout authors' (given their questions), for the
    unlearned ``model`` and the ``never_trained`` model, the reference attack with the ``start_model`` (the target
    before unlearning) as its reference, and which attacks still tell the forget set apart
    (:func:`~hf_unlearn.evaluation.membership.membership_verdict`): the record's ``evaluation['membership']``."""
    from ..evaluation.suites import embedded_evaluation_sets, evaluate_muse

    sets = embedded_evaluation_sets(split, **size)
    sets = {name: sets[name] for name in ("privleak_forget", "privleak_holdout")}
    never = evaluate_muse(never_trained, tokenizer, sets, attack_reference_model=start_model)
    after = evaluate_muse(
        model, tokenizer, sets, retrained_auc=never["auc"], attack_reference_model=start_model,
        retrained_scores=never["scores"],
    )  # fmt: skip
    return {
        "auc": after["auc"],
        "auc_interval": after["auc_interval"],
        "never_trained_auc": never["auc"],
        "never_trained_auc_interval": never["auc_interval"],
        "privleak": after["privleak"],
        "membership": after["membership"],
    }


def answers_beside(model: Any, never_trained: Any, tokenizer: Any, records: Any, count: int = 3) -> list[dict]:
    """Greedy answers of the unlearned and of the never-trained model to the first ``count`` forget questions."""
    from ..evaluation.metrics import default_max_new_tokens, generate_answers

    rows = [records[i] for i in range(min(count, len(records)))]
    questions = [r["question"] for r in rows]
    budget = default_max_new_tokens(tokenizer, [r["answer"] for r in rows])
    after = generate_answers(model, tokenizer, questions, budget, count)
    before = generate_answers(never_trained, tokenizer, questions, budget, count)
    return [
        {"question": r["question"], "answer": r["answer"], "after": a, "never_trained": b}
        for r, a, b in zip(rows, after, before, strict=True)
    ]


def run_demo(demo_args: Any, config: UnlearnConfig) -> UnlearnTrainer:
    """The README's main job: learn the embedded benchmark, then forget its forget split."""
    from ..benchmarks import benchmark_size, learn_retain_only_model, learn_target_model, load_split, retain_split_for
    from ..evaluation.options import truth_ratios

    if demo_args.benchmark == "chronicles":
        return run_chronicles_demo(demo_args, config)
    if demo_args.benchmark != "fictitious_authors":
        raise ValueError(f"--benchmark must be fictitious_authors or chronicles, got {demo_args.benchmark!r}.")
    size = benchmark_size(demo_args.size)  # before any work: an unknown size is refused first
    prepare_output_dir(config.output_dir, config.overwrite_output_dir)
    start = time.perf_counter()
    learned = dict(cache_dir=demo_args.cache_dir, architecture=demo_args.architecture, **size)
    model, tokenizer, learn_info = learn_target_model(**learned)
    forget = load_split(demo_args.split, **size)
    retain_name = retain_split_for(demo_args.split)
    retain = load_split(retain_name, **size)
    # Authors the target never saw (and not the holdout authors the membership attack uses): the calibrated target.
    calibration = load_split("calibration", **size) if reads_calibration(config) else None
    # TOFU's forget quality compares with a model that never saw the forget split (learned once, cached).
    reference_model, reference_tokenizer = learn_retain_only_model(
        demo_args.split, demo_args.cache_dir, demo_args.architecture, **size
    )
    reference = truth_ratios(reference_model, reference_tokenizer, forget)
    sized = "" if demo_args.size == "quick" else f" ({demo_args.size})"
    trainer = unlearn_and_report(
        model,
        tokenizer,
        config,
        forget,
        retain,
        retain_only_truth_ratios=reference,
        calibration_records=calibration,
        extra={
            "benchmark": "fictitious_authors",
            "benchmark_size": demo_args.size,
            "split": demo_args.split,
            "target_model": {k: v for k, v in learn_info.items() if k != "exact_match_history"},
        },
        dataset_names={
            part: f"hf_unlearn fictitious authors{sized} / {name}"
            for part, name in (("forget", demo_args.split), ("retain", retain_name), ("calibration", "calibration"))
        },
    )
    # The target before unlearning (the trained one was changed in place), from the cache: the audit's relearning
    # reference and the reference attack's.
    start_model = learn_target_model(**learned)[0]
    if demo_args.audit and whole_model_here(trainer, "audit", "audit"):
        from ..robustness.audit import audit_markdown, audit_record_fields, run_audit

        audit = run_audit(
            trainer.model,
            tokenizer,
            forget,
            retain,
            load_split("holdout", **size),
            reference_model=reference_model,
            target_model=start_model,
        )
        trainer.record.update(**audit_record_fields(audit))
        print("\nRobustness audit:\n" + audit_markdown(audit))
    trainer.record.update(
        evaluation={
            **trainer.record.evaluation,
            "membership": membership_after(
                trainer.model, reference_model, start_model, tokenizer, demo_args.split, **size
            ),
        }
    )
    trainer.record.extra["forget_answers"] = answers_beside(trainer.model, reference_model, tokenizer, forget)
    trainer.record.extra["demo_seconds"] = time.perf_counter() - start
    trainer.save_model(config.output_dir)  # the model, the record and its card, so `hf-unlearn eval` works
    if trainer.is_world_process_zero():
        write_report(trainer.record, config.output_dir)
        print("\n" + membership_section(trainer.record))
        print(f"Demo finished in {trainer.record.extra['demo_seconds']:.0f} s.")
    return trainer


#: MUSE's metrics as the chronicles demo reports them: (key of evaluate_muse's result, label).
CHRONICLES_METRICS = (
    ("verbmem_forget", "VerbMem forget"),
    ("knowmem_forget", "KnowMem forget"),
    ("knowmem_retain", "KnowMem retain"),
)


def muse_table(columns: dict[str, dict[str, Any]], attack: str = "min_k") -> str:
    """MUSE's metrics of several evaluations (``{"target": evaluate_muse(...), ...}``) side by side."""
    lines = ["| metric | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for key, label in CHRONICLES_METRICS:
        values = [c.get(key) for c in columns.values()]
        lines.append(f"| {label} | " + " | ".join("-" if v is None else f"{v:.3f}" for v in values) + " |")
    for key, label in (("auc", f"{attack} AUC (forget vs holdout)"), ("privleak", f"PrivLeak ({attack}, %)")):
        values = [(c.get(key) or {}).get(attack) for c in columns.values()]
        spec = "+.1f" if key == "privleak" else ".3f"
        lines.append(f"| {label} | " + " | ".join("-" if v is None else format(v, spec) for v in values) + " |")
    return "\n".join(lines)


def run_chronicles_demo(demo_args: Any, config: UnlearnConfig) -> UnlearnTrainer:
    """`hf-unlearn demo --benchmark chronicles`: learn the fictitious chronicles (passages whose facts recur), then
    forget the forget towns' passages, and measure MUSE's metrics before, after and on the retain-only model."""
    from ..benchmarks import learn_chronicles_target_model, load_chronicles_split
    from ..data.examples import build_text_dataset
    from ..evaluation.suites import chronicles_evaluation_sets, evaluate_muse

    prepare_output_dir(config.output_dir, config.overwrite_output_dir)
    start = time.perf_counter()
    learn = dict(cache_dir=demo_args.cache_dir, architecture=demo_args.architecture, show_progress=False)
    model, tokenizer, learn_info = learn_chronicles_target_model(**learn)
    reference_model, _, _ = learn_chronicles_target_model(**learn, learn_split="retain")
    sets = chronicles_evaluation_sets()
    reference = evaluate_muse(reference_model, tokenizer, sets)
    paired = dict(retrained_auc=reference["auc"], retrained_scores=reference["scores"])
    before = evaluate_muse(model, tokenizer, sets, **paired)
    forget = build_text_dataset(load_chronicles_split("forget"), tokenizer)
    retain = build_text_dataset(load_chronicles_split("retain"), tokenizer, name="retain")
    calibration = (
        build_text_dataset(load_chronicles_split("calibration"), tokenizer, name="calibration")
        if reads_calibration(config)
        else None
    )
    trainer = build_trainer(model, tokenizer, config, forget, retain, calibration)
    trainer.train()
    after = evaluate_muse(trainer.model, tokenizer, sets, **paired)
    record = trainer.record
    for part, name in (("forget", "forget"), ("retain", "retain"), ("calibration", "calibration")):
        described = getattr(record, f"{part}_dataset")
        if described is not None:
            described["name"] = f"hf_unlearn fictitious chronicles / {name}"
    record.update(
        # the per-answer scores stay out of the record (its intervals and verdicts carry what they read)
        evaluation={
            "muse": {
                name: {k: v for k, v in measured.items() if k != "scores"}
                for name, measured in (("before", before), ("after", after), ("retain_only", reference))
            }
        },
        extra=dict(
            record.extra,
            benchmark="chronicles",
            target_model={k: v for k, v in learn_info.items() if k != "verbmem_history"},
            demo_seconds=time.perf_counter() - start,
        ),
    )
    trainer.save_model(config.output_dir)  # the model, its tokenizer, the record and the card
    if trainer.is_world_process_zero():
        write_report(record, config.output_dir)
        table = muse_table({"target": before, "unlearned": after, "retain-only": reference})
        with open(os.path.join(config.output_dir, "muse.md"), "w") as f:
            f.write(table + "\n")
        print("\n" + table)
        print(
            f"\n{config.method}: {record.stop_reason}; {record.wall_seconds:.1f} s. "
            f"Demo finished in {record.extra['demo_seconds']:.0f} s."
        )
    return trainer
