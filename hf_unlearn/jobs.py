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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from datasets import Dataset
from tqdm.auto import tqdm
from transformers.utils import logging

from .callbacks import report_progress_in
from .config import UnlearnConfig
from .data import build_qa_dataset, ensure_pad_token
from .loaders import TOKENIZER_FILES, load_records, looks_like_path, missing_path_error, offline_hint
from .output_dir import prepare_output_dir, resolve_resume
from .prompts import describe_prompt_format
from .record import RECORD_FILE, UnlearnRecord
from .report import evaluation_markdown, forget_quality_line, report_table, write_report
from .trainer import UnlearnTrainer, zero3_partitioned

logger = logging.get_logger(__name__)


def load_model_and_tokenizer(
    name: str,
    trust_remote_code: bool = False,
    dtype: str = "auto",
    load_in_4bit: bool = False,
    tokenizer_name: str | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer by local path or Hub id (no remote code unless asked).

    A name that looks like a local path must exist, and a local model folder must hold a model (``config.json`` or
    a PEFT ``adapter_config.json``) and, unless ``tokenizer_name`` says where it is, a tokenizer: each is named in
    the error. ``load_in_4bit`` loads the base in NF4 through bitsandbytes, for QLoRA (pass a LoRA ``peft_config``).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _check_model_location(name, tokenizer_name)
    if tokenizer_name is not None:
        _check_model_location(tokenizer_name, None, need_model=False)
    extra: dict[str, Any] = {}
    if load_in_4bit:
        from .quantize import quantization_config

        extra["quantization_config"] = quantization_config("nf4")
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name or name, trust_remote_code=trust_remote_code)
        if os.path.isfile(os.path.join(name, "adapter_config.json")) and not load_in_4bit:
            # A LoRA output (an earlier unlearning run): merged into its base, so that it trains like any model
            # (loaded as an adapter its weights would all be frozen) and a new adapter, if asked, starts from it.
            from peft import AutoPeftModelForCausalLM

            model = AutoPeftModelForCausalLM.from_pretrained(
                name, trust_remote_code=trust_remote_code, dtype=dtype
            ).merge_and_unload()
            model.requires_grad_(True)  # PEFT froze the base weights
            logger.info(f"{name} holds a LoRA adapter: merged into its base model for this run.")
        else:
            model = AutoModelForCausalLM.from_pretrained(
                name, trust_remote_code=trust_remote_code, dtype=dtype, **extra
            )
    except OSError as error:
        raise RuntimeError(offline_hint(f"Could not load model {name!r}", error)) from error
    except ValueError as error:
        raise ValueError(
            f"{name!r} cannot be loaded as a causal language model (AutoModelForCausalLM): {error}"
        ) from error
    if load_in_4bit:
        from .quantize import keep_4bit_layers_trainable

        # Before any measurement: on CPUs with AVX-512 BF16 bitsandbytes would repack the weights for inference at the
        # first eval-mode forward (and assert on layers whose out features are not a multiple of 32).
        keep_4bit_layers_trainable(model)
    ensure_pad_token(tokenizer)
    return model, tokenizer


def earlier_requests_of(name: str) -> list[dict[str, Any]] | None:
    """The request ledger that came with the model ``name``: its folder's (also a LoRA adapter folder, whose
    loaded model names only its base), or the Hub repository's; ``None`` when it cannot be read (offline, none
    there), which leaves it to the trainer (the ledger of the folder the model's weights came from)."""
    from .ledger import LEDGER_FILE, load_ledger

    if os.path.isdir(name):
        return load_ledger(name)
    try:
        from huggingface_hub import hf_hub_download

        return load_ledger(hf_hub_download(name, LEDGER_FILE))
    except Exception as error:  # no such file, no network, not a repository: nothing to carry over
        logger.info(f"No request ledger read for {name!r} ({type(error).__name__}).")
        return None


def _lora_config(rank: int, target_modules: list[str]) -> Any:
    """The CLI's LoRA adapter (alpha = 2 r, dropout 0.05), or ``None`` for full fine-tuning (rank 0)."""
    if rank <= 0:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=rank, lora_alpha=2 * rank, lora_dropout=0.05, target_modules=target_modules, task_type="CAUSAL_LM"
    )


def _check_model_location(name: str, tokenizer_name: str | None, need_model: bool = True) -> None:
    """Tell a missing local folder, a folder without a model and one without a tokenizer apart from a Hub id."""
    path = os.path.expanduser(name)
    if looks_like_path(name) and not os.path.exists(path):
        raise missing_path_error(name, "The model folder" if need_model else "The tokenizer folder")
    if not os.path.isdir(path):
        return
    files = set(os.listdir(path))
    if need_model and not files & {"config.json", "adapter_config.json"}:
        raise FileNotFoundError(
            f"{name!r} is a folder but holds no model (no config.json or adapter_config.json). Save one there with "
            "model.save_pretrained(folder), or point at the folder that holds it."
        )
    if tokenizer_name is None and not files & set(TOKENIZER_FILES):
        raise FileNotFoundError(
            f"{name!r} holds {'a model but ' if need_model else ''}no tokenizer "
            f"(none of {', '.join(TOKENIZER_FILES)}). "
            f"Save it beside the weights with tokenizer.save_pretrained({name!r}), or name where it is "
            "(--tokenizer_name_or_path)."
        )


@contextmanager
def _gathered_for_generation(model: Any) -> Iterator[None]:
    """Weights partitioned by DeepSpeed ZeRO-3 (loaded under its zero.Init, or trained) gathered whole on every
    process for the generation-based measurements, as TRL's ``unwrap_model_for_generation`` does; the model must fit
    on one device for them (``--evaluate false`` skips them). Anything else is measured as it is."""
    if not zero3_partitioned(model):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):  # (it gathers the partitioned ones)
        yield


def _evaluate(
    model: Any,
    tokenizer: Any,
    eval_sets: dict[str, Any],
    retain_only_truth_ratios: Any,
    config: UnlearnConfig,
    prompt_template: str | None = None,
) -> tuple[dict[str, dict], dict[str, Any]]:
    """Per-split metrics and the TOFU summary (forget quality, model utility, bound) from evaluate_unlearning, the
    bound with the run's own k and rho, as the record's."""
    from .metrics import evaluate_unlearning

    with _gathered_for_generation(model):
        result = evaluate_unlearning(
            model,
            tokenizer,
            eval_sets["forget"],
            eval_sets.get("retain"),
            retain_only_truth_ratios=retain_only_truth_ratios,
            k=config.masc_k,
            rho=config.masc_rho,
            prompt_template=prompt_template,
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
    prompt_template: str | None = None,
    earlier_requests: list[dict[str, Any]] | None = None,
) -> UnlearnTrainer:
    """Measure, unlearn, measure again; put the measurements into the run record; write report.json /
    report.md / training_curves.png; return the trainer (its ``record`` holds everything).

    With ``retain_only_truth_ratios`` (a retain-only model's forget-set truth ratios) and records that carry
    ``paraphrased_answer``/``perturbed_answer``, the record also has TOFU's forget quality before and after.
    ``dataset_names`` (``{"forget": ..., "retain": ..., "calibration": ...}``) names the datasets in the record and
    the model card. ``calibration_records`` (never-trained examples of the same kind) give the stopping rule its
    calibrated target (``stop_target='auto'``). ``prompt_template`` is the format the model learned its facts in
    (:mod:`hf_unlearn.prompts`). ``config.resume_from_checkpoint`` (a checkpoint folder, or ``"true"`` for the last
    one in ``output_dir``) resumes an interrupted run. ``earlier_requests``: the request ledger the model came with
    (default: what the trainer finds, :func:`earlier_requests_of` for a model loaded by name)."""
    resume = resolve_resume(config.resume_from_checkpoint, config.output_dir)
    prepare_output_dir(config.output_dir, config.overwrite_output_dir, resuming=resume is not None)

    def tokenized(records: Any, name: str) -> Any:
        if records is None:
            return None
        return build_qa_dataset(
            records, tokenizer, question_column, answer_column, max_length, prompt_template, name=_named(name)
        )

    def _named(name: str) -> str:
        described = (dataset_names or {}).get(name)
        return f"{name} ({described})" if described else name

    forget = tokenized(forget_records, "forget")
    retain = tokenized(retain_records, "retain")
    calibration = tokenized(calibration_records, "calibration")
    eval_sets = {name: data for name, data in {"forget": forget, "retain": retain}.items() if data is not None}
    summaries: dict[str, dict] = {}
    stages = tqdm(total=3 if evaluate else 1, desc="hf-unlearn", unit="stage", position=0)
    before: dict[str, dict] = {}
    if evaluate:
        stages.set_postfix_str("measuring before")
        before, summaries["before"] = _evaluate(
            model, tokenizer, eval_sets, retain_only_truth_ratios, config, prompt_template
        )
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
    report_progress_in(trainer, stages, f"unlearning ({config.method})")
    if earlier_requests is not None:
        trainer.earlier_requests = list(earlier_requests)
    trainer.train(resume_from_checkpoint=resume)
    stages.update()
    after: dict[str, dict] = {}
    if evaluate:
        stages.set_postfix_str("measuring after")
        after, summaries["after"] = _evaluate(
            trainer.model, tokenizer, eval_sets, retain_only_truth_ratios, config, prompt_template
        )
        stages.update()
    stages.close()
    record = trainer.record
    prompt = {"prompt_template": prompt_template, "prompt_format": describe_prompt_format(tokenizer, prompt_template)}
    record.update(
        before=before, after=after, evaluation=summaries, extra=dict(record.extra, **prompt, **(extra or {}))
    )
    for part, name in (dataset_names or {}).items():
        described = getattr(record, f"{part}_dataset")
        if described is not None and name:
            described["name"] = name
    if config.quantization_check and _whole_model_here(trainer, "quantization_check", "quant-check"):
        from .quantize import check_quantization_robustness, quantization_table

        record.quantization = check_quantization_robustness(
            trainer.model,
            tokenizer,
            eval_sets["forget"],
            eval_sets.get("retain"),
            full_precision=after or None,
            prompt_template=prompt_template,
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
    from .evaluation import embedded_evaluation_sets, evaluate_muse
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

    if demo_args.benchmark == "chronicles":
        return run_chronicles_demo(demo_args, config)
    if demo_args.benchmark != "fictitious_authors":
        raise ValueError(f"--benchmark must be fictitious_authors or chronicles, got {demo_args.benchmark!r}.")
    prepare_output_dir(config.output_dir, config.overwrite_output_dir)
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
    if demo_args.audit and _whole_model_here(trainer, "audit", "audit"):
        from .audit import audit_markdown, audit_record_fields, run_audit

        audit = run_audit(
            trainer.model,
            tokenizer,
            forget,
            retain,
            load_split("holdout"),
            reference_model=reference_model,
            target_model=learn_target_model(cache_dir=demo_args.cache_dir, architecture=demo_args.architecture)[0],
        )
        trainer.record.update(**audit_record_fields(audit))
        print("\nRobustness audit:\n" + audit_markdown(audit))
    trainer.record.extra["demo_seconds"] = time.perf_counter() - start
    trainer.save_model(config.output_dir)  # the model, the record and its card, so `hf-unlearn eval` works
    if trainer.is_world_process_zero():
        write_report(trainer.record, config.output_dir)
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
    from .benchmarks import learn_chronicles_target_model, load_chronicles_split
    from .data import build_text_dataset
    from .evaluation import chronicles_evaluation_sets, evaluate_muse

    prepare_output_dir(config.output_dir, config.overwrite_output_dir)
    start = time.perf_counter()
    learn = dict(cache_dir=demo_args.cache_dir, architecture=demo_args.architecture, show_progress=False)
    model, tokenizer, learn_info = learn_chronicles_target_model(**learn)
    reference_model, _, _ = learn_chronicles_target_model(**learn, learn_split="retain")
    sets = chronicles_evaluation_sets()
    reference = evaluate_muse(reference_model, tokenizer, sets)
    before = evaluate_muse(model, tokenizer, sets, retrained_auc=reference["auc"])
    forget = build_text_dataset(load_chronicles_split("forget"), tokenizer)
    retain = build_text_dataset(load_chronicles_split("retain"), tokenizer, name="retain")
    calibration = (
        build_text_dataset(load_chronicles_split("calibration"), tokenizer, name="calibration")
        if demo_args.calibrate
        else None
    )
    trainer = UnlearnTrainer(
        model=model,
        args=config,
        train_dataset=forget,
        retain_dataset=retain,
        processing_class=tokenizer,
        calibration_dataset=calibration,
    )
    trainer.train()
    after = evaluate_muse(trainer.model, tokenizer, sets, retrained_auc=reference["auc"])
    record = trainer.record
    for part, name in (("forget", "forget"), ("retain", "retain"), ("calibration", "calibration")):
        described = getattr(record, f"{part}_dataset")
        if described is not None:
            described["name"] = f"hf_unlearn fictitious chronicles / {name}"
    record.update(
        evaluation={"muse": {"before": before, "after": after, "retain_only": reference}},
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


def run_unlearning_job(run_args: Any, config: UnlearnConfig) -> UnlearnTrainer:
    """`hf-unlearn run`: load model and data by name or path, unlearn, report, save the model.

    The output folder and the checkpoint to resume from are checked first, then the data (every record), then the
    model: a mistake in any of them is reported before anything is loaded for long or trained."""
    resume = resolve_resume(config.resume_from_checkpoint, config.output_dir)
    prepare_output_dir(config.output_dir, config.overwrite_output_dir, resuming=resume is not None)
    _check_model_location(run_args.model_name_or_path, run_args.tokenizer_name_or_path)
    model, tokenizer = load_model_and_tokenizer(
        run_args.model_name_or_path,
        run_args.trust_remote_code,
        run_args.torch_dtype,
        run_args.load_in_4bit,
        tokenizer_name=run_args.tokenizer_name_or_path,
    )
    peft_config = _lora_config(run_args.lora_r, run_args.lora_target_modules)
    if peft_config is None and run_args.load_in_4bit:
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
        prompt_template=run_args.prompt_template,
        earlier_requests=earlier_requests_of(run_args.model_name_or_path),
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
    if run_args.audit and _whole_model_here(trainer, "audit", "audit"):
        _audit_after_run(trainer, run_args, config.output_dir)
    trainer.save_model(config.output_dir)
    return trainer


def _whole_model_here(trainer: UnlearnTrainer, option: str, command: str) -> bool:
    """Whether this process should run a check that needs the whole model on one process (the quantization check,
    the audit): the main process, unless FSDP or ZeRO-3 shard the weights, where a forward on one process alone
    would wait for the others forever; then the check is left to the saved model, and the user is told how."""
    if trainer.weights_are_sharded:
        if trainer.is_world_process_zero():
            logger.warning(
                f"{option} is skipped: the weights are sharded across processes (FSDP / DeepSpeed ZeRO-3). Run "
                f"`hf-unlearn {command} --model_name_or_path {trainer.args.output_dir} ...` on the saved model."
            )
        return False
    return trainer.is_world_process_zero()


def _audit_after_run(trainer: UnlearnTrainer, run_args: Any, output_dir: str) -> dict:
    """`hf-unlearn run --audit true`: the robustness audit of the unlearned model (a copy; the model is not changed),
    into the record (hence the card) and audit.json / audit.md."""
    from .audit import audit_markdown, audit_record_fields, run_audit
    from .data import rename_qa_columns

    holdout = None
    if run_args.audit_holdout_data:
        holdout = rename_qa_columns(
            load_records(run_args.audit_holdout_data), run_args.question_column, run_args.answer_column
        )
    reference = None
    if run_args.audit_reference_model:
        reference, _ = load_model_and_tokenizer(run_args.audit_reference_model, run_args.trust_remote_code)
    audit = run_audit(
        trainer.model,
        trainer.processing_class,
        trainer.forget_records,
        trainer.retain_records,
        holdout,
        reference_model=reference,
        prompt_template=run_args.prompt_template,
    )
    trainer.record.update(**audit_record_fields(audit))
    write_report(trainer.record, output_dir)
    markdown = "# Robustness audit\n\n" + audit_markdown(audit)
    with open(os.path.join(output_dir, "audit.json"), "w") as f:
        json.dump(audit, f, indent=2, default=str)
    with open(os.path.join(output_dir, "audit.md"), "w") as f:
        f.write(markdown)
    print("\n" + markdown)
    return audit


def run_sequence_job(sequence_args: Any, config: UnlearnConfig) -> Any:
    """`hf-unlearn sequence`: forget requests one after another (:func:`hf_unlearn.sequence.unlearn_sequentially`).

    Without ``--model`` it runs on the embedded benchmark: its target model, one request per author of the forget
    split, the matching retain split and the calibration authors. Everything given is read and checked before the
    first request trains."""
    from .sequence import sequence_markdown, unlearn_sequentially

    prepare_output_dir(config.output_dir, config.overwrite_output_dir)
    start = time.perf_counter()
    peft_config = _lora_config(sequence_args.lora_r, sequence_args.lora_target_modules)
    if sequence_args.model is None:
        from .benchmarks import learn_target_model, load_split, retain_split_for

        if sequence_args.requests:
            raise ValueError("--requests are forget sets of your own model: give --model too.")
        forget = load_split(sequence_args.split)
        authors = list(dict.fromkeys(forget["author"]))
        if not 1 <= sequence_args.num_requests <= len(authors):
            raise ValueError(
                f"--num_requests must be between 1 and {len(authors)}: {sequence_args.split} has {len(authors)} "
                "authors, one request each."
            )
        requests = [
            (f"author {name}", forget.filter(lambda r, name=name: r["author"] == name))
            for name in authors[: sequence_args.num_requests]
        ]
        retain = load_split(retain_split_for(sequence_args.split))
        calibration = load_split("calibration")
        model, tokenizer, _ = learn_target_model(
            cache_dir=sequence_args.cache_dir, architecture=sequence_args.architecture
        )
    else:
        if not sequence_args.requests:
            raise ValueError("Give the forget requests in order: --requests first.json second.json ...")
        requests = [
            (os.path.splitext(os.path.basename(os.path.normpath(path)))[0], load_records(path))
            for path in sequence_args.requests
        ]
        retain = load_records(sequence_args.retain_data) if sequence_args.retain_data else None
        calibration = load_records(sequence_args.calibration_data) if sequence_args.calibration_data else None
        model, tokenizer = load_model_and_tokenizer(sequence_args.model)
    earlier = earlier_requests_of(sequence_args.model) if sequence_args.model is not None else None
    result = unlearn_sequentially(
        model,
        tokenizer,
        requests,
        retain,
        config,
        peft_config=peft_config,
        calibration_records=calibration,
        prompt_template=sequence_args.prompt_template,
        question_column=sequence_args.question_column,
        answer_column=sequence_args.answer_column,
        max_eval_examples=sequence_args.max_eval_examples,
        earlier_requests=earlier,
    )
    print("\n" + sequence_markdown(result))
    print(
        f"\nSequence of {len(requests)} requests in {time.perf_counter() - start:.0f} s. Written: "
        f"{', '.join(result.paths.values())}"
    )
    return result


def run_quant_check_job(cli: Any) -> dict:
    """`hf-unlearn quant-check`: reload a saved model in 4-bit and 8-bit and measure whether forgotten knowledge came
    back; write quant_check.json, and add the result to the model's run record and card when it has one."""
    from .quantize import check_quantization_robustness, quantization_table

    record = _saved_record(cli.model)
    forget, retain, prompt_template = _check_data(cli, record, "quant-check")
    _, tokenizer = load_model_and_tokenizer(cli.model)
    result = check_quantization_robustness(
        cli.model, tokenizer, forget, retain, modes=tuple(cli.modes), prompt_template=prompt_template
    )
    _write_check(cli, record, "quant_check.json", result, quantization=result)
    print(quantization_table(result))
    return result


def _check_data(cli: Any, record: UnlearnRecord | None, command: str) -> tuple[Any, Any, str | None]:
    """Forget and retain records and the prompt format for a robustness check of a saved model: the user's own data,
    a named benchmark, or the embedded benchmark when the model's record says it learned it (never silently)."""
    prompt_template = cli.prompt_template
    if prompt_template is None and record is not None:
        prompt_template = record.extra.get("prompt_template")
    if cli.forget_data:
        if cli.benchmark:
            raise ValueError("Pass your own data (--forget_data) or a --benchmark, not both.")
        forget, retain = _user_records(cli.forget_data, "forget", cli), _user_records(cli.retain_data, "retain", cli)
        return forget, retain, prompt_template
    learned = _learned_embedded_benchmark(cli.model, record)
    if cli.benchmark is None and not learned:
        raise ValueError(
            f"hf-unlearn {command}: say which forgotten data to check {cli.model!r} on: --forget_data FILE (and "
            "--retain_data FILE), or --benchmark NAME. The embedded benchmark is only meaningful for a model that "
            "learned it."
        )
    benchmark = cli.benchmark or "embedded"
    if benchmark != "embedded":
        retain = load_records(benchmark, cli.retain_split) if cli.retain_split else None
        return load_records(benchmark, cli.split), retain, prompt_template
    from .benchmarks import load_split, retain_split_for

    if not learned:
        logger.warning(
            f"{cli.model!r} has no record of learning the embedded benchmark: its numbers are for authors it has "
            "probably never seen."
        )
    split = (record.extra.get("split") if record is not None and cli.benchmark is None else None) or cli.split
    return load_split(split), load_split(cli.retain_split or retain_split_for(split)), prompt_template


def run_relearn_check_job(cli: Any) -> dict:
    """`hf-unlearn relearn-check`: fine-tune a copy of a saved unlearned model on part of its forget set and measure
    the rest (:func:`hf_unlearn.relearn.check_relearning_robustness`); write relearn_check.json, and add the result
    to the model's run record and card when it has one. The saved model is never modified."""
    from .relearn import check_relearning_robustness, relearning_table

    record = _saved_record(cli.model)
    forget, _, prompt_template = _check_data(cli, record, "relearn-check")
    relearn = _user_records(cli.relearn_data, "relearning", cli) if cli.relearn_data else None
    model, tokenizer = load_model_and_tokenizer(cli.model)
    references = _check_models(cli, record)
    result = check_relearning_robustness(
        model,
        tokenizer,
        forget,
        relearn_records=relearn,
        steps=cli.steps,
        learning_rate=cli.learning_rate,
        relearn_fraction=cli.relearn_fraction,
        batch_size=cli.batch_size,
        measure_every=cli.measure_every,
        seed=cli.seed,
        prompt_template=prompt_template,
        **references,
    )
    _write_check(cli, record, "relearn_check.json", result, relearning=result)
    print(relearning_table(result))
    return result


def _check_models(cli: Any, record: UnlearnRecord | None) -> dict[str, Any]:
    """The reference (trained without the forget set) and target models of a check: as named, or on the embedded
    benchmark its retain-only and target models (learned once, cached)."""
    models: dict[str, Any] = {}
    for role, name in (("reference_model", cli.reference_model), ("target_model", cli.target_model)):
        if name:
            models[role] = load_model_and_tokenizer(name)[0]
    embedded = not cli.forget_data and (cli.benchmark or "embedded") == "embedded"
    if embedded and _learned_embedded_benchmark(cli.model, record):
        from .benchmarks import learn_retain_only_model, learn_target_model

        split = (record.extra.get("split") if record is not None else None) or cli.split
        models.setdefault("reference_model", learn_retain_only_model(split)[0])
        models.setdefault("target_model", learn_target_model()[0])
    return models


def run_audit_job(cli: Any) -> dict:
    """`hf-unlearn audit`: quantization, relearning and membership checks of a saved model (never modified); write
    audit.json and audit.md, and add the results and a Robustness section to the model's record and card."""
    from .audit import audit_markdown, audit_record_fields, run_audit

    record = _saved_record(cli.model)
    forget, retain, prompt_template = _check_data(cli, record, "audit")
    holdout = _user_records(cli.holdout_data, "holdout", cli) if cli.holdout_data else None
    if holdout is None and not cli.forget_data and (cli.benchmark or "embedded") == "embedded":
        from .benchmarks import load_split

        holdout = load_split("holdout")
    model, tokenizer = load_model_and_tokenizer(cli.model)
    audit = run_audit(
        model,
        tokenizer,
        forget,
        retain,
        holdout,
        modes=cli.modes,
        relearn_steps=cli.relearn_steps,
        relearn_learning_rate=cli.relearn_learning_rate,
        prompt_template=prompt_template,
        **_check_models(cli, record),
    )
    markdown = f"# Robustness audit of {cli.model}\n\n" + audit_markdown(audit)
    _write_check(cli, record, "audit.json", audit, **audit_record_fields(audit))
    with open(os.path.join(cli.output_dir, "audit.md"), "w") as f:
        f.write(markdown)
    print(markdown)
    return audit


def _write_check(cli: Any, record: UnlearnRecord | None, filename: str, result: dict, **record_fields: Any) -> None:
    """A check's result as ``filename`` (JSON) in ``cli.output_dir``, and into the checked run's record and model
    card when the model folder holds a record."""
    os.makedirs(cli.output_dir, exist_ok=True)
    with open(os.path.join(cli.output_dir, filename), "w") as f:
        json.dump(result, f, indent=2)
    if record is not None:
        from .model_card import write_model_card

        record.update(**record_fields).save(cli.model)
        write_model_card(record, cli.model)


def _saved_record(model: str) -> UnlearnRecord | None:
    return UnlearnRecord.load(model) if os.path.isfile(os.path.join(model, RECORD_FILE)) else None


def _learned_embedded_benchmark(model: str, record: UnlearnRecord | None) -> bool:
    """Whether ``model`` is the embedded benchmark's target (its learn stage's info.json) or was unlearned from it
    (its run record names the benchmark)."""
    if record is not None and record.extra.get("benchmark") == "fictitious_authors":
        return True
    info = os.path.join(model, "info.json")
    if os.path.isfile(info):
        with open(info) as f:
            return "questions_per_author" in (json.load(f).get("settings") or {})
    return False


def _user_records(path: str | None, name: str, cli: Any) -> Dataset | None:
    from .data import check_qa_records, rename_qa_columns

    if path is None:
        return None
    records = load_records(path)
    check_qa_records(records, cli.question_column, cli.answer_column, name, source=path)
    return rename_qa_columns(records, cli.question_column, cli.answer_column)


def evaluation_target(cli: Any, record: UnlearnRecord | None) -> tuple[str | None, str, str | None, list[str]]:
    """What ``hf-unlearn eval`` evaluates on: ``(benchmark or None, split, forget data path or None, warnings)``.

    The user's own data when given (a file passed as ``--benchmark`` counts as ``--forget_data``); else the named
    benchmark; else the benchmark the model's run record names. The embedded benchmark is never chosen for a model
    that did not learn it, and evaluating one on it explicitly carries a warning."""
    from .loaders import BENCHMARKS

    benchmark, split, forget_data, warnings = cli.benchmark, cli.split, cli.forget_data, []
    if benchmark and benchmark not in BENCHMARKS and os.path.exists(os.path.expanduser(benchmark)):
        if forget_data:
            raise ValueError(f"--benchmark {benchmark!r} is a file and --forget_data is given too; pass one of them.")
        forget_data, benchmark = benchmark, None
        warnings.append(f"--benchmark {forget_data!r} is a file: evaluated as your forget set (--forget_data).")
    if forget_data:
        if benchmark:
            raise ValueError("Pass your own data (--forget_data) or a --benchmark, not both.")
        return None, split, forget_data, warnings
    if cli.retain_data or cli.holdout_data:
        raise ValueError("--retain_data and --holdout_data go with --forget_data (your own forget set); pass it too.")
    learned = _learned_embedded_benchmark(cli.model, record)
    if benchmark is None:
        if not learned:
            raise ValueError(
                f"hf-unlearn eval: say what to evaluate {cli.model!r} on: --forget_data FILE (your own "
                "question/answer data; add --retain_data FILE and --holdout_data FILE for utility and the membership "
                "attack), or --benchmark tofu / muse_news / muse_books. The embedded benchmark (fictitious "
                "authors) is only meaningful for a model that learned it, like the demo's."
            )
        benchmark = "embedded"
        split = (record.extra.get("split") if record is not None else None) or split
    elif benchmark == "embedded" and not learned:
        warnings.append(
            f"{cli.model!r} has no record of learning the embedded fictitious-authors benchmark: the numbers below "
            "are for authors it has probably never seen, so a low forget score says nothing about unlearning."
        )
    return benchmark, split, None, warnings


def run_eval_job(cli: Any) -> dict:
    """`hf-unlearn eval`: TOFU- and MUSE-style evaluation of a model on the user's own data or a benchmark; eval.json,
    eval.md, a radar chart and truth-ratio histograms. The model trained without the forget set comes from
    --reference_eval, --reference_model or, on the embedded benchmark, its own retain-only model."""
    from .evaluation import evaluate_benchmark, qa_evaluation_sets
    from .plots import plot_radar, plot_truth_ratio_histogram

    if cli.reference_eval and cli.reference_model:
        raise ValueError("Pass --reference_eval or --reference_model, not both.")
    record = _saved_record(cli.model)
    benchmark, split, forget_path, warnings = evaluation_target(cli, record)
    user_data = {
        name: _user_records(path, name, cli)
        for name, path in (("forget", forget_path), ("retain", cli.retain_data), ("holdout", cli.holdout_data))
    }
    prompt_template = cli.prompt_template
    if prompt_template is None and record is not None:
        prompt_template = record.extra.get("prompt_template")
    model, tokenizer = load_model_and_tokenizer(cli.model, cli.trust_remote_code)
    reference = None
    reference_model = None
    if cli.reference_eval:
        with open(cli.reference_eval) as f:
            reference = json.load(f)
    elif cli.reference_model:
        reference_model = load_model_and_tokenizer(cli.reference_model, cli.trust_remote_code)
    elif benchmark == "embedded":
        reference = embedded_reference(split)
    sets = None
    if forget_path is not None:
        sets = qa_evaluation_sets(tokenizer, *user_data.values(), prompt_template=prompt_template)
        data = {
            name: f"{path} ({len(user_data[name])} examples)"
            for name, path in (("forget", forget_path), ("retain", cli.retain_data), ("holdout", cli.holdout_data))
            if path
        }
    else:
        data = {"benchmark": f"{benchmark} / {split}" if benchmark in ("embedded", "tofu") else benchmark}
    for warning in warnings:
        logger.warning(warning)
    result = evaluate_benchmark(
        model,
        tokenizer,
        benchmark or "your data",
        split,
        cli.dataset_path,
        reference,
        cli.max_examples,
        show_progress=True,
        reference_model=reference_model,
        sets=sets,
        prompt_template=prompt_template,
    )
    result["data"] = data
    result["warnings"] = warnings
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
