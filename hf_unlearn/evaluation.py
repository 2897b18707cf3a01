"""TOFU-style evaluation of an unlearned model: one code path for the CLI, the jobs and the benchmarks.

Definitions follow TOFU (Maini et al., "TOFU: A Task of Fictitious Unlearning for LLMs", arXiv 2401.06121, §2.5):
probability, ROUGE-L recall of greedy answers, truth ratio (forget aggregation ``mean(min(TR, 1/TR))``, retain
aggregation ``mean(max(0, 1 - TR))``), forget quality (p-value of the two-sample Kolmogorov-Smirnov test between
the forget-set truth ratios of the evaluated model and of a model trained on the retain split only), and model
utility (harmonic mean of the retain metrics). The exact-reproduction bound is MASC's Proposition 1
(arXiv 2606.02920), from the one margin implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from scipy.stats import hmean, ks_2samp

from .data import pad_examples, tokenize_qa
from .margin import (
    exact_reproduction_bound,
    restricted_margin,
    shift_for_causal_lm,
    threshold_from_probability,
    violation_fractions,
)
from .metrics import evaluate_qa, forget_truth_ratio, retain_truth_ratio, truth_ratios
from .objectives import token_log_probs


def forget_quality(truth_ratios_evaluated: Sequence[float], truth_ratios_retain_only: Sequence[float]) -> float:
    """p-value of the two-sample KS test between forget-set truth ratios (TOFU §2.5): high = indistinguishable
    from a model that never saw the forget set."""
    return float(ks_2samp(list(truth_ratios_evaluated), list(truth_ratios_retain_only)).pvalue)


def model_utility(values: Sequence[float]) -> float:
    """Harmonic mean (TOFU §2.5); 0 as soon as one value is 0, as a harmonic mean should be."""
    values = [float(v) for v in values]
    if not values:
        return float("nan")
    if min(values) <= 0:
        return 0.0
    return float(hmean(values))


@torch.no_grad()
def measure_violations(
    model: Any,
    examples: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    k: int,
    tau: float,
    beta: float = 1.0,
    delta: float | None = None,
    reference_logits: Callable[[dict[str, torch.Tensor]], torch.Tensor] | None = None,
    batch_size: int = 32,
) -> dict[str, torch.Tensor]:
    """Per tokenized example: violation fraction v_i, answer length L_i and answer probability (MASC §3).

    The one model-side use of :func:`~hf_unlearn.margin.restricted_margin` outside the loss: the stopping probe,
    the report's bound and the evaluation all call this. ``reference_logits(batch)`` selects teacher
    competitors. Examples without answer tokens are dropped.
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    fractions, lengths, probabilities = [], [], []
    try:
        for start in range(0, len(examples), batch_size):
            batch = {
                k_: v.to(device) for k_, v in pad_examples(examples[start : start + batch_size], pad_token_id).items()
            }
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            shifted, labels = shift_for_causal_lm(logits, batch["labels"])
            teacher = None
            if reference_logits is not None:
                teacher, _ = shift_for_causal_lm(reference_logits(batch), batch["labels"])
            result = restricted_margin(shifted, labels, k=k, beta=beta, teacher_logits=teacher, delta=delta)
            batch_fractions, batch_lengths = violation_fractions(result, tau)
            log_probs, mask = token_log_probs(logits, batch["labels"])
            probabilities.append(torch.exp(log_probs.sum(-1) / mask.sum(-1).clamp(min=1)).cpu())
            fractions.append(batch_fractions.cpu())
            lengths.append(batch_lengths.cpu())
    finally:
        model.train(was_training)
    fractions_t, lengths_t = torch.cat(fractions), torch.cat(lengths)
    scored = lengths_t > 0
    return {
        "fractions": fractions_t[scored],
        "lengths": lengths_t[scored],
        "probabilities": torch.cat(probabilities)[scored],
    }


def reproduction_bound(
    model: Any, tokenizer: Any, records: Any, k: int = 10, rho: float = 0.5, batch_size: int = 32
) -> dict[str, float]:
    """MASC Proposition 1 at beta = 1 on ``records``: mean and max of ``rho^((1 - v_i) L_i)``, and the violation
    rate, with self-competitors (k) and threshold tau = log(rho / (1 - rho))."""
    examples = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in records]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    measured = measure_violations(model, examples, pad_id, k, threshold_from_probability(rho), batch_size=batch_size)
    bounds = exact_reproduction_bound(measured["fractions"], measured["lengths"], rho)
    return {
        "mean": bounds.mean().item(),
        "max": bounds.max().item(),
        "violation_rate": measured["fractions"].mean().item(),
    }


def evaluate_unlearning(
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any | None = None,
    retain_only_truth_ratios: Sequence[float] | None = None,
    extra_retain_sets: dict[str, Any] | None = None,
    k: int = 10,
    rho: float = 0.5,
) -> dict[str, Any]:
    """Forget and retain metrics, truth ratios, forget quality (when the retain-only model's forget truth ratios
    are given), model utility and the exact-reproduction bound. ``extra_retain_sets`` (e.g. TOFU's
    ``real_authors``, ``world_facts``) count towards model utility like the retain set."""
    result: dict[str, Any] = {"forget": evaluate_qa(model, tokenizer, forget)}
    forget_ratios = truth_ratios(model, tokenizer, forget)
    result["forget"]["truth_ratio"] = forget_truth_ratio(forget_ratios)
    result["forget_truth_ratios"] = forget_ratios
    utility_values: list[float] = []
    for name, records in {"retain": retain, **(extra_retain_sets or {})}.items():
        if records is None:
            continue
        metrics = evaluate_qa(model, tokenizer, records)
        ratios = truth_ratios(model, tokenizer, records)
        metrics["truth_ratio"] = retain_truth_ratio(ratios) if ratios else float("nan")
        result[name] = metrics
        utility_values += [metrics["probability"], metrics["rouge_l_recall"]]
        if ratios:
            utility_values.append(metrics["truth_ratio"])
    result["model_utility"] = model_utility(utility_values) if utility_values else None
    result["forget_quality"] = (
        forget_quality(forget_ratios, retain_only_truth_ratios) if retain_only_truth_ratios is not None else None
    )
    bound = reproduction_bound(model, tokenizer, forget, k=k, rho=rho)
    result["exact_reproduction_bound"] = bound["mean"]
    result["exact_reproduction_bound_max"] = bound["max"]
    return result


def retain_only_truth_ratios(split: str = "forget10") -> list[float]:
    """Forget-set truth ratios of the embedded benchmark's retain-only model (learned once, then cached)."""
    from .benchmarks.fictitious_authors import learn_target_model, load_split, retain_split_for

    retain_split = retain_split_for(split)
    model, tokenizer, _ = learn_target_model(learn_split=retain_split, show_progress=False)
    return truth_ratios(model, tokenizer, load_split(split))


def evaluation_markdown(result: dict[str, Any]) -> str:
    """A short Markdown summary of :func:`evaluate_unlearning`'s result."""

    def fmt(value: Any) -> str:
        return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = [f"# Evaluation of {result.get('model', 'the model')}", ""]
    lines += ["| set | ROUGE-L recall | probability | exact match | truth ratio |", "|---|---|---|---|---|"]
    for name, metrics in result.items():
        if isinstance(metrics, dict) and "rouge_l_recall" in metrics:
            lines.append(
                f"| {name} | {fmt(metrics['rouge_l_recall'])} | {fmt(metrics['probability'])} | "
                f"{fmt(metrics['exact_match'])} | {fmt(metrics.get('truth_ratio'))} |"
            )
    lines += [
        "",
        f"- Forget quality (KS p-value vs the retain-only model): {fmt(result.get('forget_quality'))}",
        f"- Model utility (harmonic mean of retain metrics): {fmt(result.get('model_utility'))}",
        f"- Exact-reproduction bound (MASC Proposition 1): {fmt(result.get('exact_reproduction_bound'))}",
        "",
    ]
    return "\n".join(lines)
