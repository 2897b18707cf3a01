"""What `hf-unlearn compare` races on (:mod:`.compare`): the embedded benchmark, or TOFU on a pretrained model.

``--benchmark tofu --tofu_dir DIR`` is the comparison where the MASC paper made its claims: a pretrained model
(SmolLM2-135M-Instruct by default, offline) fine-tuned on TOFU's real author rows.

The authors of the folder are given roles in order of their id (:class:`~hf_unlearn.benchmarks.tofu_target.
TofuAuthorSplit`): ``num_forget_authors`` forgotten (2 authors = 40 questions, the size of TOFU's ``forget01``),
``num_retain_authors`` kept, ``num_calibration_authors`` never learned (MASC's calibration set) and
``num_holdout_authors`` never learned (the membership attack's non-members). The target learns forget + retain
authors; the never-trained reference learns the retain authors alone, the same way. Besides the embedded compare's
region, a run must keep TOFU's utility on real knowledge (the real-authors and world-facts sets, when the folder has
them) at ``retain_ratio`` x the target's; the forget answers' fluency is measured against the never-trained model's
(:mod:`hf_unlearn.evaluation.fluency`).
"""

from __future__ import annotations

from typing import Any

from ..benchmarks.tofu_target import TofuAuthorSplit, describe_split, learn_tofu_target, tofu_sets
from ..data.examples import build_qa_dataset
from ..data.loaders import load_tofu_folder
from ..evaluation.options import truth_ratios
from ..training.adapters import lora_config
from ..training.config import UnlearnConfig
from .compare import CompareSetting, lm_eval_scorer, parse_overrides, race

#: The LoRA rank of TOFU unlearning runs unless --lora_r says otherwise (the library's default rank).
TOFU_UNLEARNING_LORA_R = 16
#: Baselines' fixed budget on TOFU unless --epochs says otherwise (40 forget questions, batch 4: 50 steps).
TOFU_BASELINE_EPOCHS = 5


def tofu_setting(cli: Any) -> CompareSetting:
    """Learn (or load from the cache) the TOFU target and its never-trained reference; the sets every run uses."""
    if not cli.tofu_dir:
        raise ValueError("hf-unlearn compare --benchmark tofu needs --tofu_dir FOLDER (authors.jsonl, ...).")
    authors = load_tofu_folder(cli.tofu_dir)["authors"]
    split = TofuAuthorSplit.in_order(
        authors["author"], cli.num_forget_authors, cli.num_retain_authors, cli.num_calibration_authors,
        cli.num_holdout_authors, offset=cli.author_offset,
    )  # fmt: skip
    sets = tofu_sets(cli.tofu_dir, split, cli.questions_per_author)
    base = cli.base_model or "smollm2"
    learn: dict[str, Any] = dict(base_model=base, questions_per_author=cli.questions_per_author, show_progress=True)
    if cli.learn_learning_rate is not None:
        learn["learning_rate"] = cli.learn_learning_rate
    if base == "tiny":  # the miniature: a model trained from scratch needs more epochs and a higher rate
        learn.update(lora_r=0, learning_rate=cli.learn_learning_rate or 3e-3, max_epochs=cli.learn_max_epochs)
    target_model, tokenizer, learn_info = learn_tofu_target(cli.tofu_dir, split.learned, **learn)
    reference_model, reference_tokenizer, reference_info = learn_tofu_target(cli.tofu_dir, split.retain, **learn)
    retain = sets["retain"]
    retain_eval = retain.shuffle(seed=0).select(range(min(cli.retain_eval_size, len(retain))))
    lora_r = TOFU_UNLEARNING_LORA_R if cli.lora_r is None else cli.lora_r
    real_knowledge = {
        name: sets[name].select(range(min(cli.real_knowledge_size or len(sets[name]), len(sets[name]))))
        for name in ("real_authors", "world_facts")
        if name in sets
    }
    return CompareSetting(
        target_model=target_model,
        tokenizer=tokenizer,
        reference_model=reference_model,
        reference_tokenizer=reference_tokenizer,
        forget=build_qa_dataset(sets["forget"], tokenizer),
        retain=build_qa_dataset(retain, tokenizer),
        calibration=build_qa_dataset(sets["calibration"], tokenizer) if cli.calibrate else None,
        calibration_records=sets["calibration"] if cli.calibrate else None,
        forget_records=sets["forget"],
        retain_eval=retain_eval,
        holdout_records=sets["holdout"],
        reference_ratios=None,  # the folder holds no perturbed answers of the author questions
        peft_config=lora_config(lora_r, lora_targets(cli), dropout=cli.lora_dropout),
        learn_info=learn_info,
        real_knowledge=real_knowledge,
        measure_fluency=True,
        description={
            "epochs": TOFU_BASELINE_EPOCHS,
            "split": f"TOFU ({len(sets['forget'])} forget questions of {len(split.forget)} authors)",
            "model": base,
            "lora_r": lora_r,
            "lora_target_modules": lora_targets(cli),
            "tofu_dir": cli.tofu_dir,
            "authors": describe_split(split),
            "reference_model": {
                k: reference_info.get(k) for k in ("epochs", "rouge_l_recall", "seconds", "cached", "authors")
            },
        },
    )


def lora_targets(cli: Any) -> Any:
    """``--lora_target_modules`` as PEFT takes it: ``"all-linear"`` alone is PEFT's keyword, else a list of names."""
    targets = list(cli.lora_target_modules)
    return "all-linear" if targets == ["all-linear"] else targets


def run_compare(cli: Any) -> dict:
    """`hf-unlearn compare`: run the comparison on the options ``cli`` (a
    :class:`~hf_unlearn.cli.arguments.CompareArguments`); write compare.json, compare.md and compare.png into
    ``cli.output_dir``."""
    lm_eval = lm_eval_scorer(cli)  # before any work: a missing extra or an unknown task stops here
    # and so does a MASC override that UnlearnConfig refuses (an unknown key, a value out of range)
    UnlearnConfig(output_dir=cli.output_dir, method="masc", report_to="none", **parse_overrides(cli.masc_overrides))
    if cli.benchmark == "tofu":
        setting = tofu_setting(cli)
    elif cli.benchmark == "embedded":
        setting = embedded_setting(cli)
    else:
        raise ValueError(f"hf-unlearn compare: --benchmark is 'embedded' or 'tofu', got {cli.benchmark!r}.")
    return race(cli, setting, lm_eval)


def embedded_setting(cli: Any) -> CompareSetting:
    """The embedded benchmark: the fictitious authors learned by a tiny model (or ``cli.base_model``)."""
    from ..benchmarks import learn_target_model, load_split, retain_split_for

    # LoRA learns a base model's target; the tiny model learns whole (lora_r then adapts only the unlearning runs),
    # at the tiny model's rate, so it is the same target (and cache entry) as without --lora_r.
    lora_r = cli.lora_r or 0
    learn_lora_r = lora_r if cli.base_model else 0
    learn_lr = cli.learn_learning_rate or (1e-3 if learn_lora_r else 3e-3)
    learn = dict(
        show_progress=False,
        base_model=cli.base_model,
        lora_r=learn_lora_r,
        num_authors=cli.num_authors,
        learning_rate=learn_lr,
        max_epochs=cli.learn_max_epochs,
        target_exact_match=cli.learn_exact_match,
    )
    target_model, tokenizer, learn_info = learn_target_model(**learn)
    # The never-trained reference: learned the same way, without the forget split's authors.
    reference_model, reference_tokenizer, _ = learn_target_model(**learn, learn_split=retain_split_for(cli.split))
    forget_records = load_split(cli.split, num_authors=cli.num_authors)
    retain_split = load_split(retain_split_for(cli.split), num_authors=cli.num_authors)
    retain_eval = retain_split.shuffle(seed=0).select(range(min(cli.retain_eval_size, len(retain_split))))
    calibration_records = load_split("calibration", num_authors=cli.num_authors) if cli.calibrate else None
    calibration = build_qa_dataset(calibration_records, tokenizer) if calibration_records is not None else None
    return CompareSetting(
        target_model=target_model,
        tokenizer=tokenizer,
        reference_model=reference_model,
        reference_tokenizer=reference_tokenizer,
        forget=build_qa_dataset(forget_records, tokenizer),
        retain=build_qa_dataset(retain_split, tokenizer),
        calibration=calibration,
        calibration_records=calibration_records,
        forget_records=forget_records,
        retain_eval=retain_eval,
        holdout_records=load_split("holdout", num_authors=cli.num_authors),
        reference_ratios=truth_ratios(reference_model, reference_tokenizer, forget_records),
        # No dropout: training-mode forwards stay deterministic (the running probe, seeds that mean the same run).
        peft_config=lora_config(lora_r, lora_targets(cli), dropout=cli.lora_dropout),
        learn_info=learn_info,
        description={
            "epochs": 10,
            "split": cli.split,
            "model": cli.base_model or "embedded tiny Llama",
            "lora_r": lora_r,
            "lora_target_modules": lora_targets(cli),
            "num_authors": cli.num_authors,
        },
    )


__all__ = ["TOFU_BASELINE_EPOCHS", "TOFU_UNLEARNING_LORA_R", "embedded_setting", "run_compare", "tofu_setting"]
