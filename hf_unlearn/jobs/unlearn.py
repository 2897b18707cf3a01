"""`hf-unlearn run` and the job every unlearning command shares: measure, unlearn, measure again, write the report
(:func:`unlearn_and_report`); `hf-unlearn sequence` on top of :func:`~hf_unlearn.jobs.sequence.unlearn_sequentially`.
Printing to the terminal happens here, at the top; the library below speaks through transformers' logging."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from datasets import Dataset
from tqdm.auto import tqdm
from transformers.utils import logging

from ..data.examples import build_qa_dataset
from ..data.loaders import load_records
from ..data.prompts import describe_prompt_format
from ..objectives.masc.options import check_calibration_use
from ..outputs.report import forget_quality_line, lm_eval_section, report_table, write_report
from ..training.adapters import lora_config
from ..training.config import UnlearnConfig
from ..training.output_dir import prepare_output_dir, resolve_resume
from ..training.record import UnlearnRecord
from ..training.reference import zero3_partitioned
from ..training.trainer import UnlearnTrainer
from .models import build_trainer, earlier_requests_of, load_model_and_tokenizer
from .utility import LmEvalRequest, lm_eval_request

logger = logging.get_logger(__name__)


@contextmanager
def gathered_for_generation(model: Any) -> Iterator[None]:
    """Weights partitioned by DeepSpeed ZeRO-3 (loaded under its zero.Init, or trained) gathered whole on every
    process for the generation-based measurements, as TRL's ``unwrap_model_for_generation`` does; the model must fit
    on one device for them (``--evaluate false`` skips them). Anything else is measured as it is."""
    if not zero3_partitioned(model):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):  # (it gathers the partitioned ones)
        yield


def evaluate_before_after(
    model: Any,
    tokenizer: Any,
    eval_sets: dict[str, Any],
    retain_only_truth_ratios: Any,
    config: UnlearnConfig,
    prompt_template: str | None = None,
) -> tuple[dict[str, dict], dict[str, Any]]:
    """Per-split metrics and the TOFU summary (forget quality, model utility, bound) from evaluate_unlearning, the
    bound with the run's own k and rho, as the record's."""
    from ..evaluation.suites import evaluate_unlearning

    with gathered_for_generation(model):
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
    lm_eval: LmEvalRequest | None = None,
) -> UnlearnTrainer:
    """Measure, unlearn, measure again; put the measurements into the run record; write report.json /
    report.md / training_curves.png; return the trainer (its ``record`` holds everything).

    With ``retain_only_truth_ratios`` (a retain-only model's forget-set truth ratios) and records that carry
    ``paraphrased_answer``/``perturbed_answer``, the record also has TOFU's forget quality before and after.
    ``dataset_names`` (``{"forget": ..., "retain": ..., "calibration": ...}``) names the datasets in the record and
    the model card. ``calibration_records`` (never-trained examples of the same kind) are what the calibrated mode
    reads (``masc_threshold='calibration'``, ``stop_target='membership'`` or ``'calibration'``, asked for in
    ``config``). ``prompt_template`` is the format the model learned its facts in
    (:mod:`hf_unlearn.data.prompts`). ``config.resume_from_checkpoint`` (a checkpoint folder, or ``"true"`` for the
    last one in ``output_dir``) resumes an interrupted run. ``earlier_requests``: the request ledger the model came
    with (default: what the trainer finds, :func:`earlier_requests_of` for a model loaded by name). ``lm_eval``: tasks
    of lm-evaluation-harness (:func:`~hf_unlearn.jobs.utility.lm_eval_request`) to score the model on before and
    after, into the record's ``lm_eval`` (measured even with ``evaluate=False``)."""
    resume = resolve_resume(config.resume_from_checkpoint, config.output_dir)
    prepare_output_dir(config.output_dir, config.overwrite_output_dir, resuming=resume is not None)
    tokenized = partial(
        _tokenized,
        tokenizer=tokenizer,
        columns=(question_column, answer_column),
        max_length=max_length,
        prompt_template=prompt_template,
        dataset_names=dataset_names,
    )
    forget = tokenized(forget_records, "forget")
    retain = tokenized(retain_records, "retain")
    calibration = tokenized(calibration_records, "calibration")
    check_calibration_use(config, calibration is not None)  # before measuring: a measurement can take minutes
    eval_sets = {name: data for name, data in {"forget": forget, "retain": retain}.items() if data is not None}
    summaries: dict[str, dict] = {}
    utility: dict[str, dict] = {}
    measurement = _Measurement(
        tokenizer, eval_sets, retain_only_truth_ratios, config, prompt_template, evaluate, lm_eval
    )
    measure = evaluate or lm_eval is not None
    stages = tqdm(total=3 if measure else 1, desc="hf-unlearn", unit="stage", position=0)
    before: dict[str, dict] = {}
    if measure:
        stages.set_postfix_str("measuring before")
        before = measurement.take(model, "before", summaries, utility)
        stages.update()
    stages.set_postfix_str(f"unlearning ({config.method})")
    trainer = build_trainer(
        model,
        tokenizer,
        config,
        forget,
        retain,
        calibration,
        peft_config,
        progress=(stages, f"unlearning ({config.method})"),
        earlier_requests=earlier_requests,
    )
    trainer.train(resume_from_checkpoint=resume)
    stages.update()
    after: dict[str, dict] = {}
    if measure:
        stages.set_postfix_str("measuring after")
        # lm-eval's HFLM runs the model as one process's; sharded weights are left to `hf-unlearn eval` of the output.
        sharded = partial(weights_sharded, trainer, "--lm_eval_tasks", "eval")
        after = measurement.take(trainer.model, "after", summaries, utility, skip_lm_eval=sharded)
        stages.update()
    stages.close()
    prompt = {"prompt_template": prompt_template, "prompt_format": describe_prompt_format(tokenizer, prompt_template)}
    extra = dict(trainer.record.extra, **prompt, **(extra or {}))
    trainer.record.update(before=before, after=after, evaluation=summaries, lm_eval=utility, extra=extra)
    for part, name in (dataset_names or {}).items():
        described = getattr(trainer.record, f"{part}_dataset")
        if described is not None and name:
            described["name"] = name
    if config.quantization_check and whole_model_here(trainer, "quantization_check", "quant-check"):
        _check_quantization(trainer, tokenizer, eval_sets, after, prompt_template)
    if trainer.is_world_process_zero():
        _write_and_print_report(trainer, config, summaries, utility, evaluate, retain_only_truth_ratios)
    return trainer


def _tokenized(
    records: Any,
    name: str,
    *,
    tokenizer: Any,
    columns: tuple[str, str],
    max_length: int | None,
    prompt_template: str | None,
    dataset_names: dict[str, str] | None,
) -> Any:
    """``records`` tokenized as the set ``name`` (named by ``dataset_names`` in errors), or ``None``."""
    if records is None:
        return None
    described = (dataset_names or {}).get(name)
    named = f"{name} ({described})" if described else name
    return build_qa_dataset(records, tokenizer, *columns, max_length, prompt_template, name=named)


class _Measurement:
    """What :func:`unlearn_and_report` measures before and after unlearning: the unlearning metrics (``evaluate``)
    and the lm-evaluation-harness tasks (``lm_eval``)."""

    def __init__(
        self,
        tokenizer: Any,
        eval_sets: dict[str, Any],
        retain_only_truth_ratios: Any,
        config: UnlearnConfig,
        prompt_template: str | None,
        evaluate: bool,
        lm_eval: LmEvalRequest | None,
    ) -> None:
        self.tokenizer = tokenizer
        self.eval_sets = eval_sets
        self.retain_only_truth_ratios = retain_only_truth_ratios
        self.config = config
        self.prompt_template = prompt_template
        self.evaluate = evaluate
        self.lm_eval = lm_eval

    def take(
        self,
        model: Any,
        stage: str,
        summaries: dict[str, dict],
        utility: dict[str, dict],
        skip_lm_eval: Callable[[], bool] | None = None,
    ) -> dict[str, dict]:
        """The per-split metrics of ``model`` (empty without ``evaluate``); its summary and lm-eval scores go into
        ``summaries[stage]`` and ``utility[stage]`` (no lm-eval scores when ``skip_lm_eval()`` says so)."""
        splits: dict[str, dict] = {}
        if self.evaluate:
            splits, summaries[stage] = evaluate_before_after(
                model, self.tokenizer, self.eval_sets, self.retain_only_truth_ratios, self.config, self.prompt_template
            )
        if self.lm_eval is not None and not (skip_lm_eval is not None and skip_lm_eval()):
            with gathered_for_generation(model):
                utility[stage] = self.lm_eval.measure(model, self.tokenizer)
        return splits


def _check_quantization(
    trainer: UnlearnTrainer, tokenizer: Any, eval_sets: dict[str, Any], after: dict, prompt_template: str | None
) -> None:
    """The record's quantization check of the unlearned model, printed."""
    from ..robustness.quantize import check_quantization_robustness, quantization_table

    trainer.record.quantization = check_quantization_robustness(
        trainer.model,
        tokenizer,
        eval_sets["forget"],
        eval_sets.get("retain"),
        full_precision=after or None,
        prompt_template=prompt_template,
    )
    print("\nQuantization check:\n" + quantization_table(trainer.record.quantization))


def _write_and_print_report(
    trainer: UnlearnTrainer,
    config: UnlearnConfig,
    summaries: dict[str, dict],
    utility: dict[str, dict],
    evaluate: bool,
    retain_only_truth_ratios: Any,
) -> None:
    """report.json / report.md / the plots, and the report's tables and last line on the terminal."""
    record = trainer.record
    paths = write_report(record, config.output_dir)
    if summaries.get("before") and summaries.get("after"):
        paths.update(plot_evaluation(record, retain_only_truth_ratios, config.output_dir))
    if evaluate:
        print("\n" + report_table(record))
        sentence = forget_quality_line(record)
        if sentence:
            print(sentence)
    if utility:
        print("\n" + lm_eval_section(utility))
    print(
        f"\n{config.method}: {record.stop_reason}; {record.wall_seconds:.1f} s. Written: {', '.join(paths.values())}"
    )


def plot_evaluation(record: UnlearnRecord, retain_only_truth_ratios: Any, output_dir: str) -> dict[str, str]:
    """radar.png (TOFU's axes before vs after) and truth_ratios.png (forget-set truth ratios of the target, the
    unlearned and the retain-only model)."""
    from ..outputs.plots import plot_radar, plot_truth_ratio_histogram

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


def run_unlearning_job(run_args: Any, config: UnlearnConfig) -> UnlearnTrainer:
    """`hf-unlearn run`: load model and data by name or path, unlearn, report, save the model.

    The output folder and the checkpoint to resume from are checked first, then the data (every record), then the
    model: a mistake in any of them is reported before anything is loaded for long or trained."""
    run_args.require_model("run")
    if not run_args.forget_data:
        raise ValueError(
            "hf-unlearn run: give the data to forget, --forget_data FILE_OR_HUB_ID (a JSON/JSONL/CSV/Parquet file, a "
            "save_to_disk folder, or a Hub dataset such as locuslab/TOFU with --forget_subset forget10)."
        )
    resume = resolve_resume(config.resume_from_checkpoint, config.output_dir)
    prepare_output_dir(config.output_dir, config.overwrite_output_dir, resuming=resume is not None)
    lm_eval = lm_eval_request(run_args, config.output_dir)  # a missing extra or unknown task: said before any work
    model, tokenizer = load_model_and_tokenizer(
        run_args.model_name_or_path,
        run_args.trust_remote_code,
        run_args.torch_dtype,
        run_args.load_in_4bit,
        tokenizer_name=run_args.tokenizer_name_or_path,
        tokenizer_option="--tokenizer_name_or_path",
    )
    peft_config = lora_config(run_args.lora_r, run_args.lora_target_modules)
    if peft_config is None and run_args.load_in_4bit:
        raise ValueError("A 4-bit base cannot be fine-tuned directly: add --lora_r 16 (QLoRA).")
    forget = load_records(run_args.forget_data, run_args.forget_subset, run_args.forget_split)
    calibration = None
    if run_args.calibration_data or run_args.calibration_subset:
        calibration = load_records(
            run_args.calibration_data or run_args.forget_data,
            run_args.calibration_subset,
            run_args.calibration_split or run_args.forget_split,
        )
    retain = None
    if config.objectives[1] != "none" or run_args.retain_subset or run_args.retain_data:
        retain = load_records(
            run_args.retain_data or run_args.forget_data,
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
        lm_eval=lm_eval,
        extra={"model": run_args.model_name_or_path},
        dataset_names={
            "forget": " / ".join(filter(None, [run_args.forget_data, run_args.forget_subset])),
            "retain": " / ".join(filter(None, [run_args.retain_data or run_args.forget_data, run_args.retain_subset]))
            if retain is not None
            else None,
            "calibration": " / ".join(
                filter(None, [run_args.calibration_data or run_args.forget_data, run_args.calibration_subset])
            )
            if calibration is not None
            else None,
        },
    )
    if run_args.audit and whole_model_here(trainer, "audit", "audit"):
        audit_after_run(trainer, run_args, config.output_dir)
    trainer.save_model(config.output_dir)
    return trainer


def whole_model_here(trainer: UnlearnTrainer, option: str, command: str) -> bool:
    """Whether this process should run a check that needs the whole model on one process (the quantization check,
    the audit): the main process, unless FSDP or ZeRO-3 shard the weights, where a forward on one process alone
    would wait for the others forever; then the check is left to the saved model, and the user is told how."""
    return not weights_sharded(trainer, option, command) and trainer.is_world_process_zero()


def weights_sharded(trainer: UnlearnTrainer, option: str, command: str) -> bool:
    """Whether FSDP or ZeRO-3 shard the trained weights across processes; if so the main process says that ``option``
    is skipped and how to run it on the saved model (``hf-unlearn command``)."""
    if trainer.weights_are_sharded:
        if trainer.is_world_process_zero():
            logger.warning(
                f"{option} is skipped: the weights are sharded across processes (FSDP / DeepSpeed ZeRO-3). Run "
                f"`hf-unlearn {command} --model_name_or_path {trainer.args.output_dir} ...` on the saved model."
            )
        return True
    return False


def audit_after_run(trainer: UnlearnTrainer, run_args: Any, output_dir: str) -> dict:
    """`hf-unlearn run --audit true`: the robustness audit of the unlearned model (a copy; the model is not changed),
    into the record (hence the card) and audit.json / audit.md."""
    from ..data.examples import rename_qa_columns
    from ..robustness.audit import audit_markdown, audit_record_fields, run_audit

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
