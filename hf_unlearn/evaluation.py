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
from .metrics import (
    evaluate_qa,
    forget_truth_ratio,
    normalized_probabilities,
    qa_records,
    retain_truth_ratio,
    truth_ratios,
)
from .objectives import token_log_probs
from .report import format_value


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
    examples = [tokenize_qa(tokenizer, r["question"], r["answer"]) for r in qa_records(records)]
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
    batch_size: int = 32,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Forget and retain metrics, truth ratios, forget quality (when the retain-only model's forget truth ratios
    are given), model utility and the exact-reproduction bound (TOFU §2.5, MASC Proposition 1).

    ``forget``/``retain`` are datasets or records with ``question`` and ``answer``; truth ratios also need
    ``paraphrased_answer`` and ``perturbed_answer`` and are skipped (``None``) without them. ``extra_retain_sets``
    (e.g. TOFU's ``real_authors``, ``world_facts``) count towards model utility like the retain set.
    """
    result: dict[str, Any] = {
        "forget": evaluate_qa(model, tokenizer, forget, batch_size=batch_size, show_progress=show_progress)
    }
    forget_ratios = truth_ratios(model, tokenizer, forget, batch_size=batch_size, show_progress=show_progress)
    result["forget"]["truth_ratio"] = forget_truth_ratio(forget_ratios) if forget_ratios else None
    result["forget_truth_ratios"] = forget_ratios
    utility_values: list[float] = []
    for name, records in {"retain": retain, **(extra_retain_sets or {})}.items():
        if records is None:
            continue
        metrics = evaluate_qa(model, tokenizer, records, batch_size=batch_size, show_progress=show_progress)
        if name != "retain":  # real authors / world facts: Prob is normalised over the answer options
            options = normalized_probabilities(model, tokenizer, records, batch_size, show_progress)
            if options:
                metrics["answer_probability"] = metrics["probability"]
                metrics["probability"] = sum(options) / len(options)
        ratios = truth_ratios(model, tokenizer, records, batch_size=batch_size, show_progress=show_progress)
        metrics["truth_ratio"] = retain_truth_ratio(ratios) if ratios else None
        result[name] = metrics
        utility_values += [metrics["probability"], metrics["rouge_l_recall"]]
        if ratios:
            utility_values.append(metrics["truth_ratio"])
    result["model_utility"] = model_utility(utility_values) if utility_values else None
    result["forget_quality"] = (
        forget_quality(forget_ratios, retain_only_truth_ratios)
        if retain_only_truth_ratios is not None and forget_ratios
        else None
    )
    bound = reproduction_bound(model, tokenizer, forget, k=k, rho=rho, batch_size=batch_size)
    result["exact_reproduction_bound"] = bound["mean"]
    result["exact_reproduction_bound_max"] = bound["max"]
    return result


def forget_quality_sentence(before: float | None, after: float | None) -> str | None:
    """One line saying whether unlearning moved the model towards one that never saw the forget set."""
    if before is None or after is None:
        return None
    verdict = (
        "higher than the target model's: closer to a model that never saw the forget set"
        if after > before
        else "not higher than the target model's: no closer to a model that never saw the forget set"
    )
    return (
        f"Forget quality (KS p-value of forget-set truth ratios vs a retain-only model) went from {before:.3g} "
        f"to {after:.3g}, {verdict}."
    )


def evaluate_muse(
    model: Any,
    tokenizer: Any,
    sets: Mapping[str, Any],
    retrained_auc: Mapping[str, float] | None = None,
    k: float = 0.4,
    verbmem_tokens: int = 128,
    knowmem_tokens: int = 32,
    batch_size: int = 8,
    generation_batch_size: int = 32,
    max_length: int = 2048,
    show_progress: bool = False,
) -> dict[str, Any]:
    """MUSE's VerbMem, KnowMem (forget and retain) and the membership attacks' AUC, with PrivLeak against
    ``retrained_auc`` (the same AUCs measured on a model retrained without the forget set), on whichever of
    :func:`hf_unlearn.loaders.muse_evaluation_sets`'s sets ``sets`` has. ``batch_size`` is for scoring whole
    texts (up to ``max_length`` tokens), ``generation_batch_size`` for KnowMem's short answers."""
    from .muse import knowmem, membership_auc, membership_scores, privleak, verbmem

    result: dict[str, Any] = {}
    if sets.get("verbmem") is not None:
        data = sets["verbmem"]
        result["verbmem_forget"] = verbmem(
            model, tokenizer, data["prompt"], data["continuation"], verbmem_tokens, batch_size, show_progress
        )
    for side in ("forget", "retain"):
        data = sets.get(f"knowmem_{side}")
        if data is not None:
            icl = sets.get(f"knowmem_{side}_icl")
            result[f"knowmem_{side}"] = knowmem(
                model,
                tokenizer,
                data["question"],
                data["answer"],
                knowmem_tokens,
                generation_batch_size,
                icl_examples=list(icl) if icl is not None else None,
                show_progress=show_progress,
            )
    if sets.get("privleak_forget") is not None and sets.get("privleak_holdout") is not None:
        members = membership_scores(model, tokenizer, sets["privleak_forget"]["text"], k, batch_size, max_length)
        others = membership_scores(model, tokenizer, sets["privleak_holdout"]["text"], k, batch_size, max_length)
        result["auc"] = {attack: membership_auc(members[attack], others[attack]) for attack in members}
        result["privleak"] = (
            {attack: privleak(auc, retrained_auc[attack]) for attack, auc in result["auc"].items()}
            if retrained_auc
            else None
        )
    return result


def evaluate_benchmark(
    model: Any,
    tokenizer: Any,
    benchmark: str = "embedded",
    split: str = "forget10",
    path: str | None = None,
    reference: Mapping[str, Any] | None = None,
    max_examples: int | None = None,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Everything ``hf-unlearn eval`` reports for one model on one benchmark.

    ``embedded`` and ``tofu`` get TOFU's metrics (:func:`evaluate_unlearning`), ``embedded``, ``muse_news`` and
    ``muse_books`` MUSE's (:func:`evaluate_muse`, under ``"muse"``). ``reference`` is the evaluation of the model
    trained without the forget set (its ``forget_truth_ratios`` give forget quality, its ``muse.auc`` PrivLeak);
    on the embedded benchmark it defaults to the benchmark's own retain-only model. ``path`` replaces the Hub id
    (a local copy of the dataset repository). ``max_examples`` keeps the first N of every set, for a quick look.
    """
    from .loaders import BENCHMARKS, embedded_evaluation_sets, muse_evaluation_sets, tofu_evaluation_sets

    if benchmark not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}.")
    if benchmark == "embedded":
        sets = embedded_evaluation_sets(split)
        if reference is None:
            reference = embedded_reference(split)
    elif benchmark == "tofu":
        sets = tofu_evaluation_sets(split, **({"path": path} if path else {}))
    else:
        sets = muse_evaluation_sets(benchmark, path)
    if max_examples is not None:
        sets = {name: data.select(range(min(max_examples, len(data)))) for name, data in sets.items()}
    result: dict[str, Any] = {"benchmark": benchmark, "split": split}
    if "forget" in sets:
        extra = {name: sets[name] for name in ("real_authors", "world_facts") if name in sets}
        result.update(
            evaluate_unlearning(
                model,
                tokenizer,
                sets["forget"],
                sets.get("retain"),
                retain_only_truth_ratios=(reference or {}).get("forget_truth_ratios"),
                extra_retain_sets=extra or None,
                show_progress=show_progress,
            )
        )
    if any(name.startswith(("verbmem", "knowmem", "privleak")) for name in sets):
        retrained_auc = ((reference or {}).get("muse") or {}).get("auc")
        result["muse"] = evaluate_muse(model, tokenizer, sets, retrained_auc, show_progress=show_progress)
    return result


def _retain_only_model(split: str, cache_dir: str | None, architecture: str) -> tuple[Any, Any]:
    """The embedded benchmark's model learned without ``split``'s authors (learned once, then cached)."""
    from .benchmarks.fictitious_authors import learn_target_model, retain_split_for

    model, tokenizer, _ = learn_target_model(
        cache_dir=cache_dir, architecture=architecture, learn_split=retain_split_for(split), show_progress=False
    )
    return model, tokenizer


def embedded_reference(
    split: str = "forget10", cache_dir: str | None = None, architecture: str = "llama"
) -> dict[str, Any]:
    """What forget quality and PrivLeak compare with on the embedded benchmark: the retain-only model's forget
    truth ratios and membership-attack AUCs."""
    from .loaders import embedded_evaluation_sets

    model, tokenizer = _retain_only_model(split, cache_dir, architecture)
    sets = embedded_evaluation_sets(split)
    privleak_sets = {name: sets[name] for name in ("privleak_forget", "privleak_holdout")}
    return {
        "forget_truth_ratios": truth_ratios(model, tokenizer, sets["forget"]),
        "muse": evaluate_muse(model, tokenizer, privleak_sets),
    }


def retain_only_truth_ratios(
    split: str = "forget10", cache_dir: str | None = None, architecture: str = "llama"
) -> list[float]:
    """Forget-set truth ratios of the embedded benchmark's retain-only model (what the demo's forget quality
    compares with)."""
    from .benchmarks.fictitious_authors import load_split

    model, tokenizer = _retain_only_model(split, cache_dir, architecture)
    return truth_ratios(model, tokenizer, load_split(split))


def evaluation_markdown(result: dict[str, Any]) -> str:
    """A short Markdown summary of :func:`evaluate_benchmark`'s (or :func:`evaluate_unlearning`'s) result."""

    def fmt(value: Any) -> str:
        return format_value(value, ".4g")

    lines = [f"# Evaluation of {result.get('model', 'the model')}", ""]
    if "forget" in result:
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
            f"- Exact-reproduction bound (MASC Proposition 1): {fmt(result.get('exact_reproduction_bound'))} "
            f"(measured exact match {fmt(result['forget'].get('exact_match'))})",
            "",
        ]
    muse = result.get("muse")
    if muse:
        lines += ["## MUSE", "", "| metric | value |", "|---|---|"]
        for key in ("verbmem_forget", "knowmem_forget", "knowmem_retain"):
            if key in muse:
                lines.append(f"| {key} (ROUGE-L F1) | {fmt(muse[key])} |")
        for attack, auc in (muse.get("auc") or {}).items():
            leak = (muse.get("privleak") or {}).get(attack)
            lines.append(f"| membership AUC, {attack} | {fmt(auc)} |")
            lines.append(f"| PrivLeak, {attack} (%, ideal about 0) | {fmt(leak)} |")
        lines.append("")
    return "\n".join(lines)
