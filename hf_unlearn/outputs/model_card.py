"""The model card of an unlearned model, written from the run record into ``templates/model_card.md`` (TRL's
template pattern: a Jinja template rendered by ``huggingface_hub.ModelCard.from_template``).

It says what was forgotten, how (method, objectives, each objective's own hyperparameters, gradient surgery), why
training stopped, what it cost and what was measured; a line is left out when the record does not know it,
rather than filled with a placeholder. For a PEFT adapter the trainer lets PEFT add its own metadata on top
(``library_name: peft``, ``base_model``, the adapter tags).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from ..training.record import UnlearnRecord
from .card_metadata import eval_results, is_hub_id, unlearning_block
from .report import MEMORIZATION_METRICS, METRICS, format_value, lm_eval_section, membership_section

TEMPLATE_PATH = Path(__file__).parent / "templates" / "model_card.md"


def _fmt(value: Any) -> str:
    return format_value(value, ".4g")


def _dataset_phrase(dataset: dict | None, fallback: str) -> str | None:
    if not dataset:
        return None
    count = dataset.get("num_examples")
    name = dataset.get("name")
    if name:
        return f"`{name}` ({count} examples)" if count is not None else f"`{name}`"
    return f"{fallback} of {count} examples"


def _introduction(record: UnlearnRecord) -> str:
    base = record.base_model
    if is_hub_id(base):
        base_text = f"[{base}](https://huggingface.co/{base})"
    elif base:
        base_text = f"`{os.path.basename(os.path.normpath(base))}` (a local model)"
    else:
        base_text = "a causal language model"
    forget = _dataset_phrase(record.forget_dataset, "a forget set")
    retain = _dataset_phrase(record.retain_dataset, "a retain set")
    text = f"This model is {base_text} after **machine unlearning** with [hf_unlearn](https://pypi.org/project/hf_unlearn/)"
    if forget:
        text += f": it was trained to forget {forget}" + (f" while keeping {retain}" if retain else "")
    text += "."
    if record.adapter:
        text += f" The weights here are a {record.adapter.upper()} adapter; the base model itself is unchanged."
    if not record.success:
        text += (
            f"\n\n**This run failed** ({record.stop_reason}): do not use it as an unlearned model without checking it."
        )
    unverified = record.extra.get("pushed_unverified")
    if unverified:
        text += (
            "\n\n**Published although its own record does not say it forgot** (pushed with "
            "`push_unverified`): " + "; ".join(unverified) + "."
        )
    return text


def _base_rows(record: UnlearnRecord) -> list[tuple[str, str]]:
    """Which base model the weights (an adapter: the base it loads on) need: a Hub id, or a local folder, with the
    SHA-256 of each of its weights files when the run recorded them."""
    base, weights = record.base_model, record.base_model_weights or {}
    if not base:
        return []
    text = f"[{base}](https://huggingface.co/{base})" if is_hub_id(base) else f"the local folder `{base}`"
    if weights:
        text += "; trained on a copy whose" if is_hub_id(base) else ";"
        text += " weights files have SHA-256 " + ", ".join(f"`{name}`: `{digest}`" for name, digest in weights.items())
    return [("Base model" + (" (the adapter loads on it)" if record.adapter else ""), text)]


def _record_rows(record: UnlearnRecord) -> str:
    papers = {paper["title"]: paper["url"] for paper in record.papers}
    rows = [("Method", f"`{record.method}`")]
    rows += _base_rows(record)
    objectives = f"forget `{record.forget_objective}`, retain `{record.retain_objective}`"
    rows.append(("Objectives", objectives))
    if record.gradient_surgery == "sum":
        rows.append(("Gradient surgery", "none (weighted sum of the losses)"))
    else:
        surgery_paper = next((f" ([paper]({url}))" for title, url in papers.items() if "Asymmetric" in title), "")
        rows.append(("Gradient surgery", f"`{record.gradient_surgery}`{surgery_paper}"))
    if record.hyperparameters.get("sam_rho"):
        sam_paper = next((f" ([paper]({url}))" for title, url in papers.items() if "Sharpness-Aware" in title), "")
        rows.append(("Sharpness-aware forgetting", f"on, ρ = {_fmt(record.hyperparameters['sam_rho'])}{sam_paper}"))
    if record.distillation:
        rows.append(("Distilled after unlearning (UNDO)", _distillation_text(record.distillation)))
    if record.extra.get("prompt_format"):
        # The format the facts were unlearned in: evaluating in another format measures something else.
        rows.append(("Prompt format", "`" + record.extra["prompt_format"].replace("|", "\\|") + "`"))
    dual = record.objective_state.get("pdu_dual")
    if dual and dual.get("epsilon") is not None:
        rows.append(
            (
                "PDU dual variable",
                f"λ = {_fmt(dual['dual'])} after {dual['updates']} updates, ε = {_fmt(dual['epsilon'])}",
            )
        )
    if record.beyond_paper:
        rows.append(("Beyond the papers", "; ".join(record.beyond_paper)))
    rows.append(("Steps", f"{record.global_step} of at most {record.max_steps}"))
    if record.stop_reason:
        rows.append(("Why training stopped", record.stop_reason))
    if record.violation_rate is not None:
        probe = record.hyperparameters.get("stop_probe", "train")
        rows.append(("Last violation rate", f"{_fmt(record.violation_rate)} (`{probe}` probe)"))
    bound = record.exact_reproduction_bound
    if bound:
        rows.append(
            (
                "Exact-reproduction bound (MASC Proposition 1)",
                f"{_fmt(bound.get('mean'))} on average over the forget answers (max {_fmt(bound.get('max'))})",
            )
        )
    if record.wall_seconds is not None:
        rows.append(("Training time", f"{_fmt(record.wall_seconds)} s"))
    return "\n".join(f"| {name} | {value} |" for name, value in rows)


def _distillation_text(distillation: dict[str, Any]) -> str:
    """What ``hf-unlearn distill`` did: these weights are a noised copy of the unlearned model, distilled to it."""
    return (
        f"a copy of the unlearned model moved toward noise (α = {_fmt(distillation['alpha'])}, β = "
        f"{_fmt(distillation['beta'])}), then distilled to it for {distillation['steps']} steps on "
        f"{distillation['retain_examples']} retain examples (KL to the unlearned model "
        f"{_fmt(distillation['kl_perturbed'])} → {_fmt(distillation['kl_distilled'])}; "
        f"[paper]({distillation.get('paper', 'https://arxiv.org/abs/2506.06278')}))"
    )


def _metrics_section(before: dict | None, after: dict | None) -> str:
    if not before or not after:
        return ""
    rows = ["## Before / after", "", "| split | metric | before | after |", "|---|---|---|---|"]
    for split in after:
        for metric in (*METRICS, "truth_ratio", *MEMORIZATION_METRICS):
            if after[split].get(metric) is not None:
                previous = before.get(split, {}).get(metric)
                rows.append(f"| {split} | {metric} | {_fmt(previous)} | {_fmt(after[split][metric])} |")
    return "\n".join(rows) + "\n"


def _utility_section(record: UnlearnRecord) -> str:
    """lm-evaluation-harness scores before -> after per task and metric (:mod:`hf_unlearn.evaluation.utility`)."""
    return lm_eval_section(record.lm_eval, "## Utility on standard benchmarks (lm-evaluation-harness)")


def _robustness_section(audit: dict | None) -> str:
    """The audit's verdicts, each with the threshold it was judged by (details follow in the sections below)."""
    if not audit:
        return ""
    rows = ["## Robustness", "", "| check | result | finding | threshold |", "|---|---|---|---|"]
    for check, verdict in audit["verdicts"].items():
        status = {True: "passed", False: "**failed**", None: "not judged"}[verdict["passed"]]
        rows.append(f"| {check} | {status} | {verdict['finding']} | {verdict['threshold']} |")
    return "\n".join(rows) + "\n"


def _relearning_section(relearning: dict | None) -> str:
    if not relearning:
        return ""
    from ..robustness.relearn import relearning_table, sweep_table

    settings = relearning["settings"]
    return (
        "## Relearning check\n\n"
        f"A copy fine-tuned for {settings['steps']} steps (lr {settings['learning_rate']:g}) on "
        f"{relearning['relearn_examples']} forget examples ({relearning['relearn_data']}); measured on the other "
        f"{relearning['measured_examples']}.\n\n"
        + relearning_table(relearning)
        + "\n"
        + (
            f"\nThe attacker's sweep (worst case):\n\n{sweep_table(relearning['sweep'])}\n"
            if "sweep" in relearning
            else ""
        )
    )


def _ledger_section(record: UnlearnRecord) -> str:
    """Every unlearning request this model went through, this run's last (``unlearning_ledger.json``)."""
    from ..training.ledger import full_ledger, ledger_markdown

    entries = full_ledger(record)
    if not entries:
        return ""
    earlier = len(record.earlier_requests)
    note = (
        f"This model had been unlearned {earlier} time{'s' if earlier > 1 else ''} before this run. "
        if earlier
        else ""
    )
    return (
        "## Unlearning requests\n\n"
        f"{note}Each forget set is named by a hash of its content, never by the data itself.\n\n"
        + ledger_markdown(entries)
        + "\n"
    )


def _quantization_section(quantization: dict | None) -> str:
    if not quantization:
        return ""
    from ..robustness.quantize import quantization_table

    return "## Quantization check\n\n" + quantization_table(quantization) + "\n"


def _usage(record: UnlearnRecord, location: str) -> str:
    if record.adapter:
        return (
            "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n\n"
            f'model = AutoPeftModelForCausalLM.from_pretrained("{location}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{location}")'
        )
    return (
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
        f'model = AutoModelForCausalLM.from_pretrained("{location}")\n'
        f'tokenizer = AutoTokenizer.from_pretrained("{location}")'
    )


def build_model_card(record: UnlearnRecord, location: str, model_name: str | None = None) -> ModelCard:
    """A `huggingface_hub.ModelCard` from a run record; ``location`` is where the model is loaded from (a Hub id
    or the folder it is saved in)."""
    hyperparameters = "\n".join(
        ["| name | value |", "|---|---|"] + [f"| `{k}` | {_fmt(v)} |" for k, v in record.hyperparameters.items()]
    )
    references = "\n".join(
        f"* {paper['authors'].rstrip('.') + '. ' if paper.get('authors') else ''}*{paper['title']}*. {paper['url']}"
        for paper in record.papers
    )
    title = model_name or record.extra.get("model_name") or os.path.basename(os.path.normpath(location))
    sections = dict(
        model_name=title,
        introduction=_introduction(record),
        record_rows=_record_rows(record),
        hyperparameters=hyperparameters,
        metrics=_metrics_section(record.before, record.after) + membership_section(record),
        utility=_utility_section(record),
        quantization=_quantization_section(record.quantization),
        relearning=_relearning_section(record.relearning),
        robustness=_robustness_section(record.audit),
        ledger=_ledger_section(record),
        usage=_usage(record, location),
        references=references or "-",
    )
    datasets = []
    for dataset in (record.forget_dataset, record.retain_dataset):
        name = ((dataset or {}).get("name") or "").split(" / ")[0]
        if is_hub_id(name) and name not in datasets:
            datasets.append(name)
    data = ModelCardData(
        library_name="peft" if record.adapter else "transformers",
        base_model=record.base_model if is_hub_id(record.base_model) else None,
        datasets=datasets or None,
        tags=sorted({"unlearning", "hf_unlearn", record.method, *record.extra.get("tags", [])}),
        # the Hub's results table, and the record of what was forgotten and how well (docs/hub.md)
        model_name=title,
        eval_results=eval_results(record) or None,
        unlearning=unlearning_block(record),
    )
    return ModelCard.from_template(data, template_path=str(TEMPLATE_PATH), **sections)


def write_model_card(record: UnlearnRecord, output_dir: str, repo_id: str | None = None) -> str:
    """Write ``README.md`` (the card) into ``output_dir``; returns its path."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "README.md")
    build_model_card(record, repo_id or output_dir).save(path)
    return path


def write_run_outputs(
    record: UnlearnRecord, output_dir: str, repo_id: str | None = None, peft_model: Any = None
) -> None:
    """What every save of a run writes beside the weights: ``unlearn_record.json`` (with the base weights it
    started from), the request ledger and the card; for a PEFT model, PEFT's own card metadata (library_name: peft,
    base_model, adapter tags) on top of the unlearning card."""
    from ..training.base_model import with_base_weights
    from ..training.ledger import full_ledger, save_ledger

    record = with_base_weights(record)
    record.save(output_dir)
    save_ledger(full_ledger(record), output_dir)
    write_model_card(record, output_dir, repo_id=repo_id)
    if peft_model is not None:
        peft_model.create_or_update_model_card(output_dir)
