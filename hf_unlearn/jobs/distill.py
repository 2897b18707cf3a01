"""`hf-unlearn distill`: UNDO after unlearning (:func:`hf_unlearn.robustness.distill.distill_into_perturbed`). The
saved unlearned model is the teacher and is left as it is; a noised copy of it, distilled to it on the retain data,
is saved in a new folder with the run record (its ``distillation`` field) and the model card."""

from __future__ import annotations

import json
import os
from typing import Any

from transformers.utils import logging

from ..training.record import UnlearnRecord
from .checks import check_data, learned_embedded_benchmark, recorded_prompt_template, saved_record, user_records
from .models import load_model_and_tokenizer

logger = logging.get_logger(__name__)

#: The metrics of :func:`~hf_unlearn.evaluation.metrics.evaluate_qa` the distillation's before / after keeps.
MEASURED = ("rouge_l_recall", "probability", "exact_match")


def distillation_data(cli: Any, record: UnlearnRecord | None) -> tuple[Any, Any, str | None]:
    """(forget records or None, retain records, prompt format): ``--retain_data`` (with ``--forget_data`` when given,
    measured only), else the benchmark's splits as the checks choose them (:func:`~.checks.check_data`)."""
    from ..robustness.distill import check_retain_data

    if cli.retain_data:
        forget = user_records(cli.forget_data, "forget", cli) if cli.forget_data else None
        return forget, user_records(cli.retain_data, "retain", cli), recorded_prompt_template(cli, record)
    if not cli.forget_data and not cli.benchmark and not learned_embedded_benchmark(cli.model_name_or_path, record):
        check_retain_data(None)  # the message names --retain_data
    forget, retain, prompt_template = check_data(cli, record, "distill")
    check_retain_data(retain)
    return forget, retain, prompt_template


def measure(model: Any, tokenizer: Any, sets: dict[str, Any], prompt_template: str | None) -> dict[str, dict]:
    """:data:`MEASURED` of each set that is there."""
    from ..evaluation.metrics import evaluate_qa

    measured = {}
    for name, records in sets.items():
        if records is not None:
            metrics = evaluate_qa(model, tokenizer, records, prompt_template=prompt_template)
            measured[name] = {key: metrics[key] for key in MEASURED}
    return measured


def run_distill_job(cli: Any) -> dict[str, Any]:
    """Check the settings and the data, distil, measure (``--evaluate``), save the student with its record and card,
    write distill.json; returns the distillation's result."""
    from ..robustness.distill import UNDO_PAPER, check_distillation_settings, distill_into_perturbed

    source = cli.require_model("distill")
    check_distillation_settings(cli.alpha, cli.beta, cli.steps, cli.learning_rate, cli.batch_size)
    if not cli.output_dir:
        raise ValueError("hf-unlearn distill: say where the distilled model goes, --output_dir NEW_FOLDER.")
    if os.path.isdir(source) and os.path.realpath(cli.output_dir) == os.path.realpath(source):
        raise ValueError(
            "hf-unlearn distill: --output_dir is the unlearned model's own folder; the unlearned model is the teacher "
            "and stays as it is, so give a new folder."
        )
    record = saved_record(source)
    forget, retain, prompt_template = distillation_data(cli, record)
    model, tokenizer = load_model_and_tokenizer(source, cli.trust_remote_code, base_model=cli.base_model)
    sets = {"forget": forget, "retain": retain}
    teacher_metrics = measure(model, tokenizer, sets, prompt_template) if cli.evaluate else {}
    student, result = distill_into_perturbed(
        model, tokenizer, retain, alpha=cli.alpha, beta=cli.beta, steps=cli.steps, learning_rate=cli.learning_rate,
        batch_size=cli.batch_size, seed=cli.seed, prompt_template=prompt_template,
    )  # fmt: skip
    if cli.evaluate:
        result["teacher"] = teacher_metrics
        result["student"] = measure(student, tokenizer, sets, prompt_template)
    result["teacher_model"] = source
    os.makedirs(cli.output_dir, exist_ok=True)
    student.save_pretrained(cli.output_dir)
    tokenizer.save_pretrained(cli.output_dir)
    with open(os.path.join(cli.output_dir, "distill.json"), "w") as f:
        json.dump(result, f, indent=2)
    if record is not None:
        save_distilled_record(record, result, UNDO_PAPER, cli.output_dir)
    print(distillation_summary(result))
    return result


def save_distilled_record(record: UnlearnRecord, result: dict[str, Any], paper: dict, output_dir: str) -> None:
    """The unlearned model's record, now describing the student: ``distillation`` set, the measurements made on the
    teacher that no longer hold dropped (quantization, relearning, audit), ``after`` the student's metrics where they
    were measured, a full model (a LoRA adapter was merged); then the ledger and the card beside it."""
    from ..outputs.model_card import write_model_card
    from ..training.ledger import full_ledger, save_ledger

    after = {split: dict(values) for split, values in result.get("student", {}).items()}
    record.update(
        distillation=result,
        quantization=None,
        relearning=None,
        audit=None,
        adapter=None,
        after=after or record.after,
        papers=[*record.papers, paper] if paper not in record.papers else record.papers,
    )
    record.save(output_dir)
    save_ledger(full_ledger(record), output_dir)
    write_model_card(record, output_dir)


def distillation_summary(result: dict[str, Any]) -> str:
    """Markdown: the settings, the KL to the teacher, and forget / retain ROUGE-L before and after when measured."""
    lines = [
        f"UNDO: alpha {result['alpha']:g}, beta {result['beta']:g}, {result['steps']} steps on "
        f"{result['retain_examples']} retain examples in {result['seconds']:.0f} s; KL to the unlearned model "
        f"{result['kl_perturbed']:.4g} after the noising, {result['kl_distilled']:.4g} after the distillation."
    ]
    if "student" in result:
        lines += ["", "| set | ROUGE-L recall, unlearned | distilled |", "|---|---|---|"]
        for name, values in result["student"].items():
            lines.append(
                f"| {name} | {result['teacher'][name]['rouge_l_recall']:.3f} | {values['rouge_l_recall']:.3f} |"
            )
    return "\n".join(lines)
