"""Benchmark suites: everything ``hf-unlearn eval`` reports for one model on TOFU, MUSE or the embedded benchmark.

TOFU's metrics (Maini et al., arXiv 2401.06121, §2.5) come from :func:`hf_unlearn.metrics.evaluate_unlearning`,
MUSE's (Shi et al., arXiv 2407.06460, §3.1) from :mod:`hf_unlearn.muse`. Forget quality and PrivLeak compare with
a model trained without the forget set: pass it in (``reference_model``) or pass its evaluation (``reference``);
this module never trains one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .metrics import evaluate_unlearning


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
        members, others = (
            membership_scores(
                model,
                tokenizer,
                sets[name]["text"],
                k,
                batch_size,
                max_length,
                # Prompted texts (the embedded QA): only the trained part, the answer, is scored.
                prompts=sets[name]["prompt"] if "prompt" in sets[name].column_names else None,
            )
            for name in ("privleak_forget", "privleak_holdout")
        )
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
    reference_model: tuple[Any, Any] | None = None,
) -> dict[str, Any]:
    """Everything ``hf-unlearn eval`` reports for one model on one benchmark.

    ``embedded`` and ``tofu`` get TOFU's metrics (:func:`~hf_unlearn.metrics.evaluate_unlearning`), ``embedded``,
    ``muse_news`` and ``muse_books`` MUSE's (:func:`evaluate_muse`, under ``"muse"``). The model trained without
    the forget set gives forget quality (its ``forget_truth_ratios``) and PrivLeak (its ``muse.auc``): pass its
    evaluation as ``reference``, or the model itself as ``reference_model=(model, tokenizer)`` and it is evaluated
    here first (its result is returned under ``"reference"``). Without either, those two are ``None``. ``path``
    replaces the Hub id (a local copy of the dataset repository). ``max_examples`` keeps the first N of every set.
    """
    from .loaders import BENCHMARKS, benchmark_sets

    if benchmark not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}.")
    if reference is not None and reference_model is not None:
        raise ValueError("Pass reference (an evaluation) or reference_model (a model to evaluate), not both.")
    sets = benchmark_sets(benchmark, split, path)
    if max_examples is not None:
        sets = {name: data.select(range(min(max_examples, len(data)))) for name, data in sets.items()}
    result: dict[str, Any] = {"benchmark": benchmark, "split": split}
    if reference_model is not None:
        reference = _evaluate_sets(*reference_model, sets, None, show_progress)
        result["reference"] = {k: v for k, v in reference.items() if k in ("forget_truth_ratios", "muse")}
    result.update(_evaluate_sets(model, tokenizer, sets, reference, show_progress))
    return result


def _evaluate_sets(
    model: Any, tokenizer: Any, sets: Mapping[str, Any], reference: Mapping[str, Any] | None, show_progress: bool
) -> dict[str, Any]:
    result: dict[str, Any] = {}
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
