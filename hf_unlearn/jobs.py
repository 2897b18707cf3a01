"""The jobs behind the ``hf-unlearn`` commands: ``demo`` (the embedded benchmark, offline), ``run`` (any model and
dataset), ``eval`` (TOFU / MUSE metrics of a saved model) and ``quant-check`` (does the forgetting survive 4-bit).

Each job measures, trains or checks, puts what it measured into the run record, and writes the report and the
model card from that record. Printing to the terminal happens here, at the top; the library below speaks through
transformers' logging.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from datasets import Dataset
from tqdm.auto import tqdm

from .config import UnlearnConfig
from .data import build_qa_dataset, ensure_pad_token
from .loaders import load_records, offline_hint
from .record import RECORD_FILE, UnlearnRecord
from .report import evaluation_markdown, forget_quality_line, report_table, write_report
from .trainer import UnlearnTrainer


def load_model_and_tokenizer(
    name: str, trust_remote_code: bool = False, dtype: str = "auto", load_in_4bit: bool = False
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer by local path or Hub id (no remote code unless asked).

    ``load_in_4bit`` loads the base in NF4 through bitsandbytes, for QLoRA (pass a LoRA ``peft_config``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    extra: dict[str, Any] = {}
    if load_in_4bit:
        from .quantize import quantization_config

        extra["quantization_config"] = quantization_config("nf4")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(name, trust_remote_code=trust_remote_code, dtype=dtype, **extra)
    except OSError as error:
        raise RuntimeError(offline_hint(f"Could not load model {name!r}", error)) from error
    except ValueError as error:
        raise ValueError(
            f"{name!r} cannot be loaded as a causal language model (AutoModelForCausalLM): {error}"
        ) from error
    ensure_pad_token(tokenizer)
    return model, tokenizer


def _evaluate(
    model: Any, tokenizer: Any, eval_sets: dict[str, Any], retain_only_truth_ratios: Any, config: UnlearnConfig
) -> tuple[dict[str, dict], dict[str, Any]]:
    """Per-split metrics and the TOFU summary (forget quality, model utility, bound) from evaluate_unlearning, the
    bound with the run's own k and rho, as the record's."""
    from .metrics import evaluate_unlearning

    result = evaluate_unlearning(
        model,
        tokenizer,
        eval_sets["forget"],
        eval_sets.get("retain"),
        retain_only_truth_ratios=retain_only_truth_ratios,
        k=config.masc_k,
        rho=config.masc_rho,
        show_progress=True,
    )
    splits = {name: result[name] for name in eval_sets if name in result}
    keys = ("forget_quality", "model_utility", "exact_reproduction_bound", "forget_truth_ratios")
    summary = {key: result[key] for key in keys}
    return splits, summary


def unlearn_and_report(
    model: Any,
    tokenizer: Any,
    config: UnlearnConfig,
    forget_records: Dataset,
    retain_records: Dataset | None,
    question_column: str = "question",
    answer_column: str = "answer",
    evaluate: bool = True,
    max_length: int | None = None,
    extra: dict | None = None,
    peft_config: Any = None,
    retain_only_truth_ratios: Any = None,
    dataset_names: dict[str, str] | None = None,
    calibration_records: Dataset | None = None,
) -> UnlearnTrainer:
    """Measure, unlearn, measure again; put the measurements into the run record; write report.json /
    report.md / training_curves.png; return the trainer (its ``record`` holds everything).

    With ``retain_only_truth_ratios`` (a retain-only model's forget-set truth ratios) and records that carry
    ``paraphrased_answer``/``perturbed_answer``, the record also has TOFU's forget quality before and after.
    ``dataset_names`` (``{"forget": ..., "retain": ..., "calibration": ...}``) names the datasets in the record and
    the model card. ``calibration_records`` (never-trained examples of the same kind) give the stopping rule its
    calibrated target (``stop_target='auto'``)."""
    forget = build_qa_dataset(forget_records, tokenizer, question_column, answer_column, max_length)
    retain = (
        build_qa_dataset(retain_records, tokenizer, question_column, answer_column, max_length)
        if retain_records is not None
        else None
    )
    calibration = (
        build_qa_dataset(calibration_records, tokenizer, question_column, answer_column, max_length)
        if calibration_records is not None
        else None
    )
    eval_sets = {name: data for name, data in {"forget": forget, "retain": retain}.items() if data is not None}
    summaries: dict[str, dict] = {}
    stages = tqdm(total=3 if evaluate else 1, desc="hf-unlearn", unit="stage", position=0)
    before: dict[str, dict] = {}
    if evaluate:
        stages.set_postfix_str("measuring before")
        before, summaries["before"] = _evaluate(model, tokenizer, eval_sets, retain_only_truth_ratios, config)
        stages.update()
    stages.set_postfix_str(f"unlearning ({config.method})")
    trainer = UnlearnTrainer(
        model=model,
        args=config,
        train_dataset=forget,
        retain_dataset=retain,
        processing_class=tokenizer,
        peft_config=peft_config,
        calibration_dataset=calibration,
    )
    trainer.train()
    stages.update()
    after: dict[str, dict] = {}
    if evaluate:
        stages.set_postfix_str("measuring after")
        after, summaries["after"] = _evaluate(trainer.model, tokenizer, eval_sets, retain_only_truth_ratios, config)
        stages.update()
    stages.close()
    record = trainer.record
    record.update(before=before, after=after, evaluation=summaries, extra=dict(record.extra, **(extra or {})))
    for part, name in (dataset_names or {}).items():
        described = getattr(record, f"{part}_dataset")
        if described is not None and name:
            described["name"] = name
    if config.quantization_check and trainer.is_world_process_zero():
        from .quantize import check_quantization_robustness, quantization_table

        record.quantization = check_quantization_robustness(
            trainer.model, tokenizer, eval_sets["forget"], eval_sets.get("retain"), full_precision=after or None
        )
        print("\nQuantization check:\n" + quantization_table(record.quantization))
    if trainer.is_world_process_zero():
        paths = write_report(record, config.output_dir)
        if summaries.get("before") and summaries.get("after"):
            paths.update(_plot_evaluation(record, retain_only_truth_ratios, config.output_dir))
        if evaluate:
            print("\n" + report_table(record))
            sentence = forget_quality_line(record)
            if sentence:
                print(sentence)
        print(
            f"\n{config.method}: {record.stop_reason}; {record.wall_seconds:.1f} s. "
            f"Written: {', '.join(paths.values())}"
        )
    return trainer


def _plot_evaluation(record: UnlearnRecord, retain_only_truth_ratios: Any, output_dir: str) -> dict[str, str]:
    """radar.png (TOFU's axes before vs after) and truth_ratios.png (forget-set truth ratios of the target, the
    unlearned and the retain-only model)."""
    from .plots import plot_radar, plot_truth_ratio_histogram

    summaries = record.evaluation
    results = {
        name: {"forget": getattr(record, name)["forget"], "model_utility": summaries[name]["model_utility"]}
        for name in ("before", "after")
    }
    paths = {"radar": plot_radar(results, os.path.join(output_dir, "radar.png"))}
    ratios = {
        "target (before)": summaries["before"]["forget_truth_ratios"],
        "unlearned (after)": summaries["after"]["forget_truth_ratios"],
    }
    if retain_only_truth_ratios is not None:
        ratios["retain-only model"] = list(retain_only_truth_ratios)
    if ratios["target (before)"]:
        paths["truth_ratios"] = plot_truth_ratio_histogram(ratios, os.path.join(output_dir, "truth_ratios.png"))
    return paths


def embedded_reference(
    split: str = "forget10", cache_dir: str | None = None, architecture: str = "llama"
) -> dict[str, Any]:
    """What forget quality and PrivLeak compare with on the embedded benchmark: the evaluation (forget truth ratios,
    membership-attack AUCs) of its retain-only model, learned once and cached."""
    from .benchmarks.target_model import learn_retain_only_model
    from .evaluation import evaluate_muse
    from .loaders import embedded_evaluation_sets
    from .metrics import truth_ratios

    model, tokenizer = learn_retain_only_model(split, cache_dir, architecture)
    sets = embedded_evaluation_sets(split)
    privleak_sets = {name: sets[name] for name in ("privleak_forget", "privleak_holdout")}
    return {
        "forget_truth_ratios": truth_ratios(model, tokenizer, sets["forget"]),
        "muse": evaluate_muse(model, tokenizer, privleak_sets),
    }


def run_demo(demo_args: Any, config: UnlearnConfig) -> UnlearnTrainer:
    """The README's main job: learn the embedded benchmark, then forget its forget split."""
    from .benchmarks import learn_retain_only_model, learn_target_model, load_split, retain_split_for
    from .metrics import truth_ratios

    start = time.perf_counter()
    model, tokenizer, learn_info = learn_target_model(
        cache_dir=demo_args.cache_dir, architecture=demo_args.architecture
    )
    forget = load_split(demo_args.split)
    retain_name = retain_split_for(demo_args.split)
    retain = load_split(retain_name)
    # Authors the target never saw (and not the holdout authors the membership attack uses): the calibrated target.
    calibration = load_split("calibration") if demo_args.calibrate else None
    # TOFU's forget quality compares with a model that never saw the forget split (learned once, cached).
    reference_model, reference_tokenizer = learn_retain_only_model(
        demo_args.split, demo_args.cache_dir, demo_args.architecture
    )
    reference = truth_ratios(reference_model, reference_tokenizer, forget)
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
            "split": demo_args.split,
            "target_model": {k: v for k, v in learn_info.items() if k != "exact_match_history"},
        },
        dataset_names={
            "forget": f"hf_unlearn fictitious authors / {demo_args.split}",
            "retain": f"hf_unlearn fictitious authors / {retain_name}",
            "calibration": "hf_unlearn fictitious authors / calibration",
        },
    )
    trainer.record.extra["demo_seconds"] = time.perf_counter() - start
    trainer.save_model(config.output_dir)  # the model, the record and its card, so `hf-unlearn eval` works
    if trainer.is_world_process_zero():
        write_report(trainer.record, config.output_dir)
        print(f"Demo finished in {trainer.record.extra['demo_seconds']:.0f} s.")
    return trainer


def run_unlearning_job(run_args: Any, config: UnlearnConfig) -> UnlearnTrainer:
    """`hf-unlearn run`: load model and data by name or path, unlearn, report, save the model."""
    model, tokenizer = load_model_and_tokenizer(
        run_args.model_name_or_path, run_args.trust_remote_code, run_args.torch_dtype, run_args.load_in_4bit
    )
    peft_config = None
    if run_args.lora_r > 0:
        from peft import LoraConfig

        peft_config = LoraConfig(
            r=run_args.lora_r,
            lora_alpha=2 * run_args.lora_r,
            lora_dropout=0.05,
            target_modules=run_args.lora_target_modules,
            task_type="CAUSAL_LM",
        )
    elif run_args.load_in_4bit:
        raise ValueError("A 4-bit base cannot be fine-tuned directly: add --lora_r 16 (QLoRA).")
    forget = load_records(run_args.dataset_name, run_args.forget_subset, run_args.forget_split)
    calibration = None
    if run_args.calibration_dataset_name or run_args.calibration_subset:
        calibration = load_records(
            run_args.calibration_dataset_name or run_args.dataset_name,
            run_args.calibration_subset,
            run_args.calibration_split or run_args.forget_split,
        )
    retain = None
    if config.objectives[1] != "none" or run_args.retain_subset or run_args.retain_dataset_name:
        retain = load_records(
            run_args.retain_dataset_name or run_args.dataset_name,
            run_args.retain_subset,
            run_args.retain_split or run_args.forget_split,
        )
    trainer = unlearn_and_report(
        model,
        tokenizer,
        config,
        forget,
        retain,
        question_column=run_args.question_column,
        answer_column=run_args.answer_column,
        evaluate=run_args.evaluate,
        max_length=run_args.max_length,
        peft_config=peft_config,
        calibration_records=calibration,
        extra={"model": run_args.model_name_or_path},
        dataset_names={
            "forget": " / ".join(filter(None, [run_args.dataset_name, run_args.forget_subset])),
            "retain": " / ".join(
                filter(None, [run_args.retain_dataset_name or run_args.dataset_name, run_args.retain_subset])
            )
            if retain is not None
            else None,
            "calibration": " / ".join(
                filter(None, [run_args.calibration_dataset_name or run_args.dataset_name, run_args.calibration_subset])
            )
            if calibration is not None
            else None,
        },
    )
    trainer.save_model(config.output_dir)
    return trainer


def run_quant_check_job(cli: Any) -> dict:
    """`hf-unlearn quant-check`: reload a saved model in 4-bit and 8-bit and measure whether forgotten knowledge came
    back; write quant_check.json, and add the result to the model's run record and card when it has one."""
    from .quantize import check_quantization_robustness, quantization_table

    _, tokenizer = load_model_and_tokenizer(cli.model)
    if cli.benchmark == "embedded":
        from .benchmarks import load_split, retain_split_for

        forget = load_split(cli.split)
        retain = load_split(cli.retain_split or retain_split_for(cli.split))
    else:
        forget = load_records(cli.benchmark, cli.split)
        retain = load_records(cli.benchmark, cli.retain_split) if cli.retain_split else None
    result = check_quantization_robustness(cli.model, tokenizer, forget, retain, modes=tuple(cli.modes))
    os.makedirs(cli.output_dir, exist_ok=True)
    with open(os.path.join(cli.output_dir, "quant_check.json"), "w") as f:
        json.dump(result, f, indent=2)
    if os.path.isfile(os.path.join(cli.model, RECORD_FILE)):
        from .model_card import write_model_card

        record = UnlearnRecord.load(cli.model).update(quantization=result)
        record.save(cli.model)
        write_model_card(record, cli.model)
    print(quantization_table(result))
    return result


def run_eval_job(cli: Any) -> dict:
    """`hf-unlearn eval`: TOFU- and MUSE-style evaluation; eval.json, eval.md, a radar chart and truth-ratio
    histograms. The model trained without the forget set comes from --reference_eval, --reference_model or, on
    the embedded benchmark, its own retain-only model."""
    from .evaluation import evaluate_benchmark
    from .plots import plot_radar, plot_truth_ratio_histogram

    model, tokenizer = load_model_and_tokenizer(cli.model, cli.trust_remote_code)
    reference = None
    reference_model = None
    if cli.reference_eval and cli.reference_model:
        raise ValueError("Pass --reference_eval or --reference_model, not both.")
    if cli.reference_eval:
        with open(cli.reference_eval) as f:
            reference = json.load(f)
    elif cli.reference_model:
        reference_model = load_model_and_tokenizer(cli.reference_model, cli.trust_remote_code)
    elif cli.benchmark == "embedded":
        reference = embedded_reference(cli.split)
    result = evaluate_benchmark(
        model,
        tokenizer,
        cli.benchmark,
        cli.split,
        cli.dataset_path,
        reference,
        cli.max_examples,
        show_progress=True,
        reference_model=reference_model,
    )
    result["model"] = cli.model
    os.makedirs(cli.output_dir, exist_ok=True)
    if reference_model is not None:
        reference = dict(result.pop("reference"), model=cli.reference_model)
        with open(os.path.join(cli.output_dir, "reference_eval.json"), "w") as f:
            json.dump(reference, f, indent=2)
    plots = {}
    if "forget" in result:
        others = {}
        for item in cli.compare_with:
            name, _, path = item.rpartition("=")
            with open(path) as f:
                others[name or os.path.basename(os.path.dirname(os.path.abspath(path)))] = json.load(f)
        plots["radar"] = plot_radar(
            {os.path.basename(cli.model.rstrip("/")) or cli.model: result, **others},
            os.path.join(cli.output_dir, "radar.png"),
        )
        ratios = {"evaluated model": result["forget_truth_ratios"]}
        if reference and reference.get("forget_truth_ratios"):
            ratios["model trained without the forget set"] = reference["forget_truth_ratios"]
        if result["forget_truth_ratios"]:
            plots["truth_ratios"] = plot_truth_ratio_histogram(
                ratios, os.path.join(cli.output_dir, "truth_ratios.png")
            )
    result["plots"] = plots
    with open(os.path.join(cli.output_dir, "eval.json"), "w") as f:
        json.dump(result, f, indent=2)
    markdown = evaluation_markdown(result)
    with open(os.path.join(cli.output_dir, "eval.md"), "w") as f:
        f.write(markdown)
    print(markdown)
    return result
