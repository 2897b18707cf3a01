"""The commands that check a saved model: `eval` (TOFU / MUSE metrics), `quant-check` (4-bit and 8-bit reloads),
`relearn-check` (the relearning attack) and `audit` (all of them), each on the user's own data or a named
benchmark, and never on the embedded benchmark for a model that did not learn it."""

from __future__ import annotations

import json
import os
from typing import Any

from datasets import Dataset
from transformers.utils import logging

from ..data.loaders import load_records
from ..outputs.report import evaluation_markdown, lm_eval_section
from ..training.record import RECORD_FILE, UnlearnRecord
from .demo import embedded_reference
from .models import load_model_and_tokenizer
from .utility import lm_eval_request

logger = logging.get_logger(__name__)


def run_quant_check_job(cli: Any) -> dict:
    """`hf-unlearn quant-check`: reload a saved model in 4-bit and 8-bit and measure whether forgotten knowledge came
    back; write quant_check.json, and add the result to the model's run record and card when it has one."""
    cli.require_model("quant-check")
    from ..robustness.quantize import check_quantization_robustness, quantization_table

    record = saved_record(cli.model_name_or_path)
    forget, retain, prompt_template = check_data(cli, record, "quant-check")
    model, tokenizer = load_model_and_tokenizer(cli.model_name_or_path, base_model=cli.base_model)
    # A LoRA adapter folder is checked merged into its base; a saved whole model is reloaded from its folder.
    adapter = os.path.isfile(os.path.join(cli.model_name_or_path, "adapter_config.json"))
    result = check_quantization_robustness(
        model if adapter else cli.model_name_or_path,
        tokenizer,
        forget,
        retain,
        modes=tuple(cli.modes),
        prompt_template=prompt_template,
    )
    write_check(cli, record, "quant_check.json", result, quantization=result)
    print(quantization_table(result))
    return result


def recorded_prompt_template(cli: Any, record: UnlearnRecord | None) -> str | None:
    """The prompt format asked for, else the one the model's run recorded."""
    if cli.prompt_template is None and record is not None:
        return record.extra.get("prompt_template")
    return cli.prompt_template


def recorded_size(record: UnlearnRecord | None) -> dict[str, int]:
    """The embedded benchmark's size settings a run learned on (its record's ``benchmark_size``, written by the demo),
    else the quick size's: what a check reads the embedded benchmark at."""
    from ..benchmarks import benchmark_size

    return benchmark_size((record.extra.get("benchmark_size") if record is not None else None) or "quick")


def check_data(cli: Any, record: UnlearnRecord | None, command: str) -> tuple[Any, Any, str | None]:
    """Forget and retain records and the prompt format for a check of a saved model, from what
    :func:`evaluation_target` chose: the user's own data, a named benchmark, or the embedded benchmark when the model's
    record says it learned it (never silently)."""
    benchmark, split, forget_path, warnings = evaluation_target(cli, record, command)
    for warning in warnings:
        logger.warning(warning)
    prompt_template = recorded_prompt_template(cli, record)
    if forget_path is not None:
        return user_records(forget_path, "forget", cli), user_records(cli.retain_data, "retain", cli), prompt_template
    if benchmark != "embedded":
        retain = load_records(benchmark, cli.retain_split) if cli.retain_split else None
        return load_records(benchmark, split), retain, prompt_template
    from ..benchmarks import load_split, retain_split_for

    size = recorded_size(record)
    forget, retain = load_split(split, **size), load_split(cli.retain_split or retain_split_for(split), **size)
    return forget, retain, prompt_template


def run_relearn_check_job(cli: Any) -> dict:
    """`hf-unlearn relearn-check`: fine-tune a copy of a saved unlearned model on part of its forget set and measure
    the rest (:func:`hf_unlearn.robustness.relearn.check_relearning_robustness`); write relearn_check.json, and add
    the result to the model's run record and card when it has one. The saved model is never modified."""
    cli.require_model("relearn-check")
    from ..robustness import relearn as attack

    record = saved_record(cli.model_name_or_path)
    forget, _, prompt_template = check_data(cli, record, "relearn-check")
    relearn = user_records(cli.relearn_data, "relearning", cli) if cli.relearn_data else None
    model, tokenizer = load_model_and_tokenizer(cli.model_name_or_path, base_model=cli.base_model)
    common = dict(
        relearn_records=relearn,
        relearn_fraction=cli.relearn_fraction,
        batch_size=cli.batch_size,
        measure_every=cli.measure_every,
        seed=cli.seed,
        prompt_template=prompt_template,
        **check_models(cli, record),
    )
    if cli.sweep:  # the worst case over the attacker's grid; the record keeps it as its relearning result
        sweep = attack.relearning_sweep(model, tokenizer, forget, cli.sweep_learning_rates, cli.sweep_steps, **common)
        write_check(cli, record, "relearn_check.json", sweep, relearning=attack.sweep_record(sweep))
        print(attack.sweep_table(sweep))
        return sweep
    result = attack.check_relearning_robustness(
        model, tokenizer, forget, steps=cli.steps, learning_rate=cli.learning_rate, **common
    )
    write_check(cli, record, "relearn_check.json", result, relearning=result)
    print(attack.relearning_table(result))
    return result


def check_models(cli: Any, record: UnlearnRecord | None) -> dict[str, Any]:
    """The reference (trained without the forget set) and target models of a check: as named, or on the embedded
    benchmark its retain-only and target models (learned once, cached)."""
    models: dict[str, Any] = {}
    for role, name in (("reference_model", cli.reference_model), ("target_model", cli.target_model)):
        if name:
            models[role] = load_model_and_tokenizer(name)[0]
    embedded = not cli.forget_data and (cli.benchmark or "embedded") == "embedded"
    if embedded and learned_embedded_benchmark(cli.model_name_or_path, record):
        from ..benchmarks import learn_retain_only_model, learn_target_model

        split = (record.extra.get("split") if record is not None else None) or cli.split
        size = recorded_size(record)
        models.setdefault("reference_model", learn_retain_only_model(split, **size)[0])
        models.setdefault("target_model", learn_target_model(**size)[0])
    return models


def run_audit_job(cli: Any) -> dict:
    """`hf-unlearn audit`: quantization, relearning and membership checks of a saved model (never modified); write
    audit.json and audit.md, and add the results and a Robustness section to the model's record and card."""
    cli.require_model("audit")
    from ..robustness.audit import audit_markdown, audit_record_fields, run_audit

    record = saved_record(cli.model_name_or_path)
    lm_eval = lm_eval_request(cli, cli.output_dir)
    forget, retain, prompt_template = check_data(cli, record, "audit")
    holdout = user_records(cli.holdout_data, "holdout", cli) if cli.holdout_data else None
    if holdout is None and not cli.forget_data and (cli.benchmark or "embedded") == "embedded":
        from ..benchmarks import load_split

        holdout = load_split("holdout", **recorded_size(record))
    model, tokenizer = load_model_and_tokenizer(cli.model_name_or_path, base_model=cli.base_model)
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
        relearn_sweep=cli.relearn_sweep,
        **check_models(cli, record),
    )
    fields = audit_record_fields(audit)
    markdown = f"# Robustness audit of {cli.model_name_or_path}\n\n" + audit_markdown(audit)
    if lm_eval is not None:
        # The audited model's utility, beside its robustness: what unlearning cost, on the benchmarks asked for.
        audit["lm_eval"] = lm_eval.measure(model, tokenizer)
        markdown += "\n" + lm_eval_section({"after": audit["lm_eval"]})
        fields["lm_eval"] = saved_run_lm_eval(record, audit["lm_eval"])
    write_check(cli, record, "audit.json", audit, **fields)
    with open(os.path.join(cli.output_dir, "audit.md"), "w") as f:
        f.write(markdown)
    print(markdown)
    return audit


def saved_run_lm_eval(record: UnlearnRecord | None, measured: dict[str, Any]) -> dict[str, Any]:
    """A saved run's ``lm_eval`` record with a check's measurement of the saved (unlearned) model as its "after";
    the run's own "before" stays (the card shows it only where it was measured on the same documents)."""
    return {**(record.lm_eval if record is not None else {}), "after": measured}


def write_check(cli: Any, record: UnlearnRecord | None, filename: str, result: dict, **record_fields: Any) -> None:
    """A check's result as ``filename`` (JSON) in ``cli.output_dir``, and into the checked run's record and model
    card when the model folder holds a record."""
    os.makedirs(cli.output_dir, exist_ok=True)
    with open(os.path.join(cli.output_dir, filename), "w") as f:
        json.dump(result, f, indent=2)
    if record is not None:
        from ..outputs.model_card import write_model_card

        record.update(**record_fields).save(cli.model_name_or_path)
        write_model_card(record, cli.model_name_or_path)


def saved_record(model: str) -> UnlearnRecord | None:
    return UnlearnRecord.load(model) if os.path.isfile(os.path.join(model, RECORD_FILE)) else None


def learned_embedded_benchmark(model: str, record: UnlearnRecord | None) -> bool:
    """Whether ``model`` is the embedded benchmark's target (its learn stage's info.json) or was unlearned from it
    (its run record names the benchmark)."""
    if record is not None and record.extra.get("benchmark") == "fictitious_authors":
        return True
    info = os.path.join(model, "info.json")
    if os.path.isfile(info):
        with open(info) as f:
            return "questions_per_author" in (json.load(f).get("settings") or {})
    return False


def user_records(path: str | None, name: str, cli: Any) -> Dataset | None:
    from ..data.examples import check_qa_records, rename_qa_columns

    if path is None:
        return None
    records = load_records(path)
    check_qa_records(records, cli.question_column, cli.answer_column, name, source=path)
    return rename_qa_columns(records, cli.question_column, cli.answer_column)


def evaluation_target(
    cli: Any, record: UnlearnRecord | None, command: str = "eval"
) -> tuple[str | None, str, str | None, list[str]]:
    """What ``hf-unlearn eval`` (or another check, ``command``) runs on: ``(benchmark or None, split, forget data path
    or None, warnings)``.

    The user's own data when given (a file passed as ``--benchmark`` counts as ``--forget_data``); else the named
    benchmark; else the benchmark the model's run record names. The embedded benchmark is never chosen for a model
    that did not learn it, and evaluating one on it explicitly carries a warning."""
    from ..data.loaders import BENCHMARKS

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
    if cli.retain_data or getattr(cli, "holdout_data", None):
        raise ValueError("--retain_data and --holdout_data go with --forget_data (your own forget set); pass it too.")
    learned = learned_embedded_benchmark(cli.model_name_or_path, record)
    if benchmark is None:
        if not learned:
            raise ValueError(
                f"hf-unlearn {command}: say what to {'evaluate' if command == 'eval' else 'check'} "
                f"{cli.model_name_or_path!r} on: --forget_data FILE (your own "
                "question/answer data; add --retain_data FILE and --holdout_data FILE for utility and the membership "
                "attack), or --benchmark tofu / muse_news / muse_books. The embedded benchmark (fictitious "
                "authors) is only meaningful for a model that learned it, like the demo's."
            )
        benchmark = "embedded"
        split = (record.extra.get("split") if record is not None else None) or split
    elif benchmark == "embedded" and not learned:
        warnings.append(
            f"{cli.model_name_or_path!r} has no record of learning the embedded fictitious-authors benchmark: its "
            "numbers are for authors it has probably never seen, so a low forget score says nothing about "
            "unlearning."
        )
    return benchmark, split, None, warnings


def _eval_reference(cli: Any, benchmark: str | None, split: str, size: dict) -> tuple[dict | None, Any]:
    """What `hf-unlearn eval` compares with the model trained without the forget set: its saved evaluation
    (--reference_eval, or the embedded benchmark's own retain-only model's), or that model to evaluate alongside
    (--reference_model, as ``(model, tokenizer)``)."""
    if cli.reference_eval:
        with open(cli.reference_eval) as f:
            return json.load(f), None
    if cli.reference_model:
        return None, load_model_and_tokenizer(cli.reference_model, cli.trust_remote_code)
    if benchmark == "embedded":
        return embedded_reference(split, **size), None
    return None, None


def _eval_plots(cli: Any, result: dict, reference: dict | None) -> dict:
    """The radar chart of ``result`` beside the evaluations of --compare_with, and the truth-ratio histogram beside
    the reference's; their paths."""
    from ..outputs.plots import plot_radar, plot_truth_ratio_histogram

    others = {}
    for item in cli.compare_with:
        name, _, path = item.rpartition("=")
        with open(path) as f:
            others[name or os.path.basename(os.path.dirname(os.path.abspath(path)))] = json.load(f)
    plots = {
        "radar": plot_radar(
            {os.path.basename(cli.model_name_or_path.rstrip("/")) or cli.model_name_or_path: result, **others},
            os.path.join(cli.output_dir, "radar.png"),
        )
    }
    ratios = {"evaluated model": result["forget_truth_ratios"]}
    if reference and reference.get("forget_truth_ratios"):
        ratios["model trained without the forget set"] = reference["forget_truth_ratios"]
    if result["forget_truth_ratios"]:
        plots["truth_ratios"] = plot_truth_ratio_histogram(ratios, os.path.join(cli.output_dir, "truth_ratios.png"))
    return plots


def run_eval_job(cli: Any) -> dict:
    """`hf-unlearn eval`: TOFU- and MUSE-style evaluation of a model on the user's own data or a benchmark; eval.json,
    eval.md, a radar chart and truth-ratio histograms. The model trained without the forget set comes from
    --reference_eval, --reference_model or, on the embedded benchmark, its own retain-only model."""
    cli.require_model("eval")
    from ..evaluation.suites import evaluate_benchmark, qa_evaluation_sets

    if cli.reference_eval and cli.reference_model:
        raise ValueError("Pass --reference_eval or --reference_model, not both.")
    record = saved_record(cli.model_name_or_path)
    lm_eval = lm_eval_request(cli, cli.output_dir)  # a missing extra or unknown task: said before any work
    benchmark, split, forget_path, warnings = evaluation_target(cli, record)
    size = recorded_size(record)  # the embedded benchmark's, read where benchmark == "embedded"
    user_data = {
        name: user_records(path, name, cli)
        for name, path in (("forget", forget_path), ("retain", cli.retain_data), ("holdout", cli.holdout_data))
    }
    prompt_template = recorded_prompt_template(cli, record)
    model, tokenizer = load_model_and_tokenizer(
        cli.model_name_or_path, cli.trust_remote_code, base_model=cli.base_model
    )
    reference, reference_model = _eval_reference(cli, benchmark, split, size)
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
    if benchmark == "embedded" and sets is None:
        from ..evaluation.suites import embedded_evaluation_sets

        sets = embedded_evaluation_sets(split, **size)
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
    if lm_eval is not None:
        result["lm_eval"] = lm_eval.measure(model, tokenizer)
    result["data"] = data
    result["warnings"] = warnings
    result["model"] = cli.model_name_or_path
    os.makedirs(cli.output_dir, exist_ok=True)
    if reference_model is not None:
        reference = dict(result.pop("reference"), model=cli.reference_model)
        with open(os.path.join(cli.output_dir, "reference_eval.json"), "w") as f:
            json.dump(reference, f, indent=2)
    result["plots"] = _eval_plots(cli, result, reference) if "forget" in result else {}
    with open(os.path.join(cli.output_dir, "eval.json"), "w") as f:
        json.dump(result, f, indent=2)
    markdown = evaluation_markdown(result)
    with open(os.path.join(cli.output_dir, "eval.md"), "w") as f:
        f.write(markdown)
    if record is not None and lm_eval is not None:
        from ..outputs.model_card import write_model_card

        record.update(lm_eval=saved_run_lm_eval(record, result["lm_eval"])).save(cli.model_name_or_path)
        write_model_card(record, cli.model_name_or_path)
    print(markdown)
    return result
