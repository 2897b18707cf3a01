"""The model card of an unlearned model: what was forgotten, how, and what it cost (TRL's template pattern)."""

from __future__ import annotations

import os
from typing import Any

from huggingface_hub import ModelCard, ModelCardData

from .report import format_value

PAPERS = {
    "masc": ("Fast Unlearning at Scale via Margin Self-Correction", "https://arxiv.org/abs/2606.02920"),
    "ga": ("Knowledge Unlearning for Mitigating Privacy Risks in Language Models", "https://arxiv.org/abs/2210.01504"),
    "graddiff": ("Continual Learning and Private Unlearning", "https://arxiv.org/abs/2203.12817"),
    "npo": ("Negative Preference Optimization", "https://arxiv.org/abs/2404.05868"),
    "npo_klr": ("Negative Preference Optimization", "https://arxiv.org/abs/2404.05868"),
    "simnpo": ("Simplicity Prevails: Rethinking Negative Preference Optimization", "https://arxiv.org/abs/2410.07163"),
    "rmu": ("The WMDP Benchmark (RMU)", "https://arxiv.org/abs/2403.03218"),
    "idk_dpo": ("TOFU: A Task of Fictitious Unlearning for LLMs", "https://arxiv.org/abs/2401.06121"),
    "undial": ("UNDIAL: Self-Distillation with Adjusted Logits", "https://arxiv.org/abs/2402.10052"),
}
SURGERY_PAPER = (
    "Modeling LLM Unlearning as an Asymmetric Two-Task Learning Problem",
    "https://arxiv.org/abs/2604.14808",
)

TEMPLATE = """
# {model_name}

This model is [{base_model}]({base_link}) after **machine unlearning** with
[hf_unlearn](https://pypi.org/project/hf_unlearn/): it was trained to forget `{forget_dataset}` while keeping
`{retain_dataset}`.

## Unlearning record

| | |
|---|---|
| Method | `{method}` — [{paper_title}]({paper_link}) |
| Objectives | forget `{forget_objective}`, retain `{retain_objective}` |
| Gradient surgery | {surgery} |
| Stopping | {stopping} |
| Last violation rate | {violation_rate} (alpha = {alpha}, `{stop_probe}` probe) |
| Exact-reproduction bound (MASC Proposition 1) | {bound} |

### Hyperparameters

{hyperparameters}

{metrics}
{quantization}
## How to use

```python
from transformers import AutoModelForCausalLM, AutoTokenizer

model = AutoModelForCausalLM.from_pretrained("{repo_id}")
tokenizer = AutoTokenizer.from_pretrained("{repo_id}")
```

Forgetting here means the answers above are no longer produced or preferred under the metrics reported; it is not
a proof that no trace of the data remains in the weights.
"""


def _fmt(value: Any) -> str:
    return format_value(value, ".4g")


def _metrics_section(before: dict | None, after: dict | None) -> str:
    if not before or not after:
        return ""
    rows = ["## Before / after", "", "| split | metric | before | after |", "|---|---|---|---|"]
    for split in after:
        for metric in ("rouge_l_recall", "probability", "exact_match"):
            if metric in after[split]:
                previous = before.get(split, {}).get(metric)
                rows.append(f"| {split} | {metric} | {_fmt(previous)} | {_fmt(after[split][metric])} |")
    return "\n".join(rows) + "\n"


def _quantization_section(quantization: dict | None) -> str:
    if not quantization:
        return ""
    from .quantize import quantization_table

    return "## Quantization check\n\n" + quantization_table(quantization) + "\n"


def build_model_card(record: dict, repo_id: str | None = None) -> ModelCard:
    """A `huggingface_hub.ModelCard` from an unlearning record (see `UnlearnTrainer.unlearning_record`)."""
    method = record["method"]
    title, link = PAPERS.get(method, (method, ""))
    base = record.get("base_model") or "a causal language model"
    surgery = record["hyperparameters"].get("gradient_surgery", "sum")
    surgery_text = (
        "none (weighted sum of the losses)"
        if surgery == "sum"
        else f"`{surgery}` — [{SURGERY_PAPER[0]}]({SURGERY_PAPER[1]})"
    )
    stopping = (
        f"stopped itself at step {record['stop_step']} of at most {record['max_steps']}"
        if record.get("stopped_early")
        else f"ran {record.get('stop_step')} of {record.get('max_steps')} steps (no early stop)"
    )
    hyperparameters = "\n".join(
        ["| name | value |", "|---|---|"] + [f"| `{k}` | {_fmt(v)} |" for k, v in record["hyperparameters"].items()]
    )
    body = TEMPLATE.format(
        model_name=record.get("model_name") or "Unlearned model",
        base_model=base,
        base_link=f"https://huggingface.co/{base}" if record.get("base_model") else "#",
        forget_dataset=record.get("forget_dataset") or "the forget set",
        retain_dataset=record.get("retain_dataset") or "the retain set",
        method=method,
        paper_title=title,
        paper_link=link,
        forget_objective=record["forget_objective"],
        retain_objective=record["retain_objective"],
        surgery=surgery_text,
        stopping=stopping,
        violation_rate=_fmt(record.get("violation_rate")),
        alpha=_fmt(record.get("alpha")),
        stop_probe=record.get("stop_probe"),
        bound=_fmt(record.get("exact_reproduction_bound")),
        hyperparameters=hyperparameters,
        metrics=_metrics_section(record.get("before"), record.get("after")),
        quantization=_quantization_section(record.get("quantization")),
        repo_id=repo_id or record.get("model_name") or "path/to/model",
    )
    data = ModelCardData(
        library_name="transformers",
        base_model=record.get("base_model"),
        tags=sorted({"unlearning", "hf_unlearn", method, *record.get("tags", [])}),
    )
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def write_model_card(record: dict, output_dir: str, repo_id: str | None = None) -> str:
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "README.md")
    build_model_card(record, repo_id).save(path)
    return path
