"""The jobs behind the CLI: the offline demo on the embedded benchmark, and a run on any model and dataset."""

from __future__ import annotations

import json
import os
import time
from typing import Any

from datasets import Dataset, DatasetDict, load_dataset, load_from_disk
from tqdm.auto import tqdm

from .config import UnlearnConfig
from .data import build_qa_dataset, ensure_pad_token
from .report import build_report, report_table, write_report
from .trainer import UnlearnTrainer

DATA_FILE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


def load_records(name: str, subset: str | None = None, split: str = "train") -> Dataset:
    """Load one split from a Hub id, a ``save_to_disk`` folder or a JSON/CSV/Parquet file."""
    extension = os.path.splitext(name)[1].lower()
    if os.path.isfile(name) and extension in DATA_FILE_FORMATS:
        return load_dataset(DATA_FILE_FORMATS[extension], data_files=name, split="train")
    if os.path.isdir(name) and (
        os.path.exists(os.path.join(name, "dataset_info.json"))
        or os.path.exists(os.path.join(name, "dataset_dict.json"))
    ):
        loaded = load_from_disk(name if subset is None else os.path.join(name, subset))
        return loaded[split] if isinstance(loaded, DatasetDict) else loaded
    try:
        return load_dataset(name, subset, split=split)
    except Exception as error:  # datasets raises several types for "not reachable"
        raise RuntimeError(
            _offline_hint(f"Could not load dataset {name!r} (subset {subset!r}, split {split!r})", error)
        ) from error


def _offline_hint(message: str, error: Exception) -> str:
    offline = os.environ.get("HF_HUB_OFFLINE") == "1"
    hint = (
        " HF_HUB_OFFLINE=1 is set, so only local files and the cache are used: download it once with network, "
        "or pass a local path."
        if offline
        else " Check the name, your network connection and, for gated repos, `hf auth login`."
    )
    return f"{message}: {type(error).__name__}: {str(error).rstrip('.')}.{hint}"


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
        raise RuntimeError(_offline_hint(f"Could not load model {name!r}", error)) from error
    except ValueError as error:
        raise ValueError(
            f"{name!r} cannot be loaded as a causal language model (AutoModelForCausalLM): {error}"
        ) from error
    ensure_pad_token(tokenizer)
    return model, tokenizer


def _evaluate(model: Any, tokenizer: Any, records: Dataset, name: str) -> dict:
    from .metrics import evaluate_qa

    return evaluate_qa(model, tokenizer, records, show_progress=True)


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
) -> dict:
    """Measure, unlearn, measure again, and write report.json / report.md / training_curves.png."""
    forget = build_qa_dataset(forget_records, tokenizer, question_column, answer_column, max_length)
    retain = (
        build_qa_dataset(retain_records, tokenizer, question_column, answer_column, max_length)
        if retain_records is not None
        else None
    )
    eval_sets = {"forget": forget, "retain": retain}
    stages = tqdm(total=3 if evaluate else 1, desc="hf-unlearn", unit="stage", position=0)
    before: dict[str, dict] = {}
    if evaluate:
        stages.set_postfix_str("measuring before")
        before = {
            name: _evaluate(model, tokenizer, data, f"before/{name}") for name, data in eval_sets.items() if data
        }
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
        after = {
            name: _evaluate(trainer.model, tokenizer, data, f"after/{name}")
            for name, data in eval_sets.items()
            if data
        }
        stages.update()
    stages.close()
    trainer.evaluation.update(before=before, after=after, **(extra or {}).get("datasets", {}))
    report = build_report(trainer, before, after, extra=extra)
    if config.quantization_check and trainer.is_world_process_zero():
        from .quantize import check_quantization_robustness, quantization_table

        report["quantization"] = check_quantization_robustness(
            trainer.model, tokenizer, eval_sets["forget"], eval_sets["retain"], full_precision=after or None
        )
        trainer.evaluation["quantization"] = report["quantization"]
        print("\nQuantization check:\n" + quantization_table(report["quantization"]))
    if trainer.is_world_process_zero():
        paths = write_report(report, config.output_dir)
        if evaluate:
            print("\n" + report_table(report))
        stop = f"stopped itself at step {report['stop_step']}" if report["stopped_early"] else "did not stop early"
        print(
            f"\n{config.method}: {stop} (max {report['max_steps']}), {report['wall_seconds']:.1f} s, "
            f"violation rate {report['violation_rate']}. Written: {', '.join(paths.values())}"
        )
    report["trainer"] = trainer
    return report


def run_demo(demo_args: Any, config: UnlearnConfig) -> dict:
    """The README's main job: learn the embedded benchmark, then forget its forget split."""
    from .benchmarks.fictitious_authors import learn_target_model, load_split, retain_split_for

    start = time.perf_counter()
    model, tokenizer, learn_info = learn_target_model(
        cache_dir=demo_args.cache_dir, architecture=demo_args.architecture
    )
    forget = load_split(demo_args.split)
    retain_name = retain_split_for(demo_args.split)
    retain = load_split(retain_name)
    report = unlearn_and_report(
        model,
        tokenizer,
        config,
        forget,
        retain,
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
