"""The jobs behind the CLI: the offline demo on the embedded benchmark, and a run on any model and dataset."""

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
from .report import build_report, forget_quality_line, report_table, write_report
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
    bound with the run's own k and rho, as the report's."""
    from .evaluation import evaluate_unlearning

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
) -> dict:
    """Measure, unlearn, measure again, and write report.json / report.md / training_curves.png.

    With ``retain_only_truth_ratios`` (a retain-only model's forget-set truth ratios) and records that carry
    ``paraphrased_answer``/``perturbed_answer``, the report also has TOFU's forget quality before and after."""
    forget = build_qa_dataset(forget_records, tokenizer, question_column, answer_column, max_length)
    retain = (
        build_qa_dataset(retain_records, tokenizer, question_column, answer_column, max_length)
        if retain_records is not None
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
    )
    trainer.train()
    stages.update()
    after: dict[str, dict] = {}
    if evaluate:
        stages.set_postfix_str("measuring after")
        after, summaries["after"] = _evaluate(trainer.model, tokenizer, eval_sets, retain_only_truth_ratios, config)
        stages.update()
    stages.close()
    trainer.evaluation.update(before=before, after=after, **(extra or {}).get("datasets", {}))
    report = build_report(trainer, before, after, extra=extra)
    if summaries:
        report["tofu"] = summaries
    if config.quantization_check and trainer.is_world_process_zero():
        from .quantize import check_quantization_robustness, quantization_table

        report["quantization"] = check_quantization_robustness(
            trainer.model, tokenizer, eval_sets["forget"], eval_sets["retain"], full_precision=after or None
        )
        trainer.evaluation["quantization"] = report["quantization"]
        print("\nQuantization check:\n" + quantization_table(report["quantization"]))
    if trainer.is_world_process_zero():
        paths = write_report(report, config.output_dir)
        if summaries.get("before") and summaries.get("after"):
            paths.update(_plot_evaluation(report, retain_only_truth_ratios, config.output_dir))
        if evaluate:
            print("\n" + report_table(report))
            sentence = forget_quality_line(report)
            if sentence:
                print(sentence)
        stop = f"stopped itself at step {report['stop_step']}" if report["stopped_early"] else "did not stop early"
        print(
            f"\n{config.method}: {stop} (max {report['max_steps']}), {report['wall_seconds']:.1f} s, "
            f"violation rate {report['violation_rate']}. Written: {', '.join(paths.values())}"
        )
    report["trainer"] = trainer
    return report


def _plot_evaluation(report: dict, retain_only_truth_ratios: Any, output_dir: str) -> dict[str, str]:
    """radar.png (TOFU's axes before vs after) and truth_ratios.png (forget-set truth ratios of the target, the
    unlearned and the retain-only model)."""
    from .plots import plot_radar, plot_truth_ratio_histogram

    results = {
        name: {"forget": report[name]["forget"], "model_utility": report["tofu"][name]["model_utility"]}
        for name in ("before", "after")
    }
    paths = {"radar": plot_radar(results, os.path.join(output_dir, "radar.png"))}
    ratios = {
        "target (before)": report["tofu"]["before"]["forget_truth_ratios"],
        "unlearned (after)": report["tofu"]["after"]["forget_truth_ratios"],
    }
    if retain_only_truth_ratios is not None:
        ratios["retain-only model"] = list(retain_only_truth_ratios)
    if ratios["target (before)"]:
        paths["truth_ratios"] = plot_truth_ratio_histogram(ratios, os.path.join(output_dir, "truth_ratios.png"))
    return paths


def run_demo(demo_args: Any, config: UnlearnConfig) -> dict:
    """The README's main job: learn the embedded benchmark, then forget its forget split."""
    from .benchmarks.fictitious_authors import learn_target_model, load_split, retain_split_for
    from .evaluation import retain_only_truth_ratios

    start = time.perf_counter()
    model, tokenizer, learn_info = learn_target_model(
        cache_dir=demo_args.cache_dir, architecture=demo_args.architecture
    )
    forget = load_split(demo_args.split)
    retain_name = retain_split_for(demo_args.split)
    retain = load_split(retain_name)
    # TOFU's forget quality compares with a model that never saw the forget split (learned once, cached).
    reference = retain_only_truth_ratios(demo_args.split, demo_args.cache_dir, demo_args.architecture)
    report = unlearn_and_report(
        model,
        tokenizer,
        config,
        forget,
        retain,
        retain_only_truth_ratios=reference,
        extra={
            "benchmark": "fictitious_authors",
            "split": demo_args.split,
            "target_model": learn_info,
            "datasets": {
                "forget_dataset": f"hf_unlearn fictitious authors {demo_args.split}",
                "retain_dataset": f"hf_unlearn fictitious authors {retain_name}",
            },
        },
    )
    report["trainer"].save_model(config.output_dir)  # so `hf-unlearn eval --model OUTPUT_DIR` works
    report["demo_seconds"] = time.perf_counter() - start
    if report["trainer"].is_world_process_zero():
        path = os.path.join(config.output_dir, "report.json")
        saved = json.load(open(path))
        saved["demo_seconds"] = report["demo_seconds"]
        json.dump(saved, open(path, "w"), indent=2)
        print(f"Demo finished in {report['demo_seconds']:.0f} s.")
    return report


def run_unlearning_job(run_args: Any, config: UnlearnConfig) -> dict:
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
    retain = None
    if config.objectives[1] != "none" or run_args.retain_subset or run_args.retain_dataset_name:
        retain = load_records(
            run_args.retain_dataset_name or run_args.dataset_name,
            run_args.retain_subset,
            run_args.retain_split or run_args.forget_split,
        )
    report = unlearn_and_report(
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
        extra={
            "model": run_args.model_name_or_path,
            "dataset": run_args.dataset_name,
            "datasets": {
                "forget_dataset": " / ".join(filter(None, [run_args.dataset_name, run_args.forget_subset])),
                "retain_dataset": " / ".join(
                    filter(None, [run_args.retain_dataset_name or run_args.dataset_name, run_args.retain_subset])
                ),
            },
        },
    )
    report["trainer"].save_model(config.output_dir)
    return report
