"""One robustness audit of an unlearned model: does the forgetting survive 4-bit quantization, a relearning attack,
and membership attacks? Each part stays callable on its own (:mod:`hf_unlearn.robustness.quantize`,
:mod:`hf_unlearn.robustness.relearn`, :mod:`hf_unlearn.evaluation.membership`); this module runs them together and
states one verdict per check with its threshold.

Thresholds (documented, and written next to each verdict):

* quantization: a forget ROUGE-L recall or exact match that rises by more than
  :data:`hf_unlearn.robustness.quantize.RETURN_THRESHOLD` after a reload in that mode (Zhang et al., ICLR 2025);
* relearning: the measured forget answers end more than :data:`hf_unlearn.robustness.relearn.RELEARN_THRESHOLD`
  ROUGE-L, or their probability more than :data:`hf_unlearn.robustness.relearn.RELEARN_PROBABILITY_THRESHOLD`,
  above a reference relearned the same way (or above the model's own start without a reference);
* membership: every attack the library ships
  (:func:`~hf_unlearn.evaluation.membership.membership_verdict`): the check passes when no attack's AUC is further
  than :data:`~hf_unlearn.evaluation.membership.MEMBERSHIP_TOLERANCE` from the same attack's AUC on the model trained
  without the forget set; an attack below it is under-unlearning (the forget set is still recognised), above it
  over-unlearning. MUSE's PrivLeak per attack is reported beside it. Without a reference model each AUC is judged
  against 0.5 (chance), and the verdict says so (``"no reference"``): a model whose forget and holdout answers
  differ in difficulty is not at 0.5 even after retraining, so that judgement is weaker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The attack MUSE reports (Min-K%); the audit's verdict reads every attack now.
PRIMARY_ATTACK = "min_k"


def membership_check(
    model: Any,
    tokenizer: Any,
    forget_records: Any,
    holdout_records: Any,
    reference_model: Any = None,
    prompt_template: str | None = None,
) -> dict[str, Any]:
    """The membership attacks on forget vs holdout answers (given their questions), AUC per attack and, with a
    reference model, PrivLeak per attack; ``attacks``: which attacks tell the forget set apart
    (:func:`~hf_unlearn.evaluation.membership.membership_verdict`, against 0.5 without a reference model) and
    ``verdict`` (:func:`membership_side`, ``"no reference"`` without one)."""
    from ..evaluation.suites import evaluate_muse, qa_evaluation_sets

    sets = qa_evaluation_sets(tokenizer, forget_records, None, holdout_records, prompt_template)
    privleak_sets = {name: sets[name] for name in ("privleak_forget", "privleak_holdout")}
    retrained = None
    if reference_model is not None:
        retrained = evaluate_muse(reference_model, tokenizer, privleak_sets, attack_reference_model=reference_model)
    measured = evaluate_muse(
        model,
        tokenizer,
        privleak_sets,
        retrained_auc=retrained["auc"] if retrained else None,
        attack_reference_model=reference_model,
        retrained_scores=retrained["scores"] if retrained else None,
    )
    result: dict[str, Any] = {
        "auc": measured["auc"],
        "auc_interval": measured["auc_interval"],
        "privleak": measured["privleak"],
        "attacks": measured["membership"],  # every attack, against the reference's AUC (or 0.5 without one)
    }
    if retrained:
        result["reference_auc"] = retrained["auc"]
        result["verdict"] = membership_side(measured["membership"])
    else:
        result["verdict"] = "no reference"
    return result


def membership_side(verdict: dict[str, Any]) -> str:
    """``"like retraining"`` when no attack tells the forget set apart, else the side the telling attacks read:
    ``"under-unlearned"`` (still a member), ``"over-unlearned"`` (less familiar than never-seen data), or both."""
    sides = {verdict["per_attack"][attack]["side"] for attack in verdict["which"]}
    if not sides:
        return "like retraining"
    if sides == {"member"}:
        return "under-unlearned"
    if sides == {"less familiar"}:
        return "over-unlearned"
    return "under- and over-unlearned (by different attacks)"


def run_audit(
    model: Any,
    tokenizer: Any,
    forget_records: Any,
    retain_records: Any | None = None,
    holdout_records: Any | None = None,
    reference_model: Any = None,
    target_model: Any = None,
    modes: Sequence[str] = ("nf4",),
    relearn_steps: int = 20,
    relearn_learning_rate: float = 1e-4,
    prompt_template: str | None = None,
    relearn_sweep: bool = False,
) -> dict[str, Any]:
    """Quantization, relearning and (with ``holdout_records``) membership checks of ``model`` (never modified), and
    a verdict per check: ``{"quantization", "relearning", "membership", "verdicts"}``. ``relearn_sweep``: the
    relearning attack over :func:`~hf_unlearn.robustness.relearn.relearning_sweep`'s default grid instead of
    ``relearn_steps`` / ``relearn_learning_rate``, judged by its worst case."""
    from .quantize import check_quantization_robustness
    from .relearn import check_relearning_robustness, relearning_sweep, sweep_record

    quantization = check_quantization_robustness(
        model, tokenizer, forget_records, retain_records, modes=tuple(modes), prompt_template=prompt_template
    )
    models = dict(reference_model=reference_model, target_model=target_model, prompt_template=prompt_template)
    if relearn_sweep:
        relearning = sweep_record(relearning_sweep(model, tokenizer, forget_records, **models))
        worst = relearning["sweep"]["worst"]
        attack = f"in the worst case of the sweep (lr {worst['learning_rate']:g}, {worst['steps']} steps)"
    else:
        relearning = check_relearning_robustness(
            model, tokenizer, forget_records, steps=relearn_steps, learning_rate=relearn_learning_rate, **models
        )
        attack = f"after {relearn_steps} steps"
    verdicts = {
        "quantization": quantization_verdict(quantization, modes),
        "relearning": relearning_verdict(relearning, attack),
    }
    result: dict[str, Any] = {"quantization": quantization, "relearning": relearning, "verdicts": verdicts}
    if holdout_records is not None:
        membership = membership_check(
            model, tokenizer, forget_records, holdout_records, reference_model, prompt_template
        )
        result["membership"] = membership
        attacks = membership["attacks"]
        against = "retraining" if reference_model is not None else "0.5 (no reference model)"
        verdicts["membership"] = {
            "passed": attacks["landed"],
            "finding": f"{membership['verdict']}: {attacks['distinguishing']} of {attacks['attacks']} attacks tell "
            "the forget set apart" + (f" ({', '.join(attacks['which'])})" if attacks["which"] else ""),
            "threshold": f"every attack's AUC within {attacks['tolerance']:g} of {against}",
        }
    return result


def relearning_verdict(relearning: dict[str, Any], attack: str) -> dict[str, Any]:
    """The relearning verdict of an attack's result (or a sweep's record, :func:`~.relearn.sweep_record`): failed
    when the greedy answers came back or only their likelihood did (a membership attack reads the latter).
    ``attack`` says which attack the ROUGE-L figure is from; a sweep's probability figure is the grid's largest."""
    from .relearn import RELEARN_PROBABILITY_THRESHOLD, RELEARN_THRESHOLD

    over_grid = " (largest over the grid)" if "sweep" in relearning else ""
    return {
        "passed": not (relearning["knowledge_returned"] or relearning["likelihood_returned"]),
        "finding": f"{relearning['excess_rouge_l_recall']:+.3f} ROUGE-L {attack} and "
        f"{relearning['excess_probability']:+.3f} answer probability{over_grid}, "
        f"against {relearning['compared_with']}",
        "threshold": f"more than +{RELEARN_THRESHOLD} ROUGE-L or +{RELEARN_PROBABILITY_THRESHOLD} probability",
    }


def quantization_verdict(quantization: dict[str, Any], modes: Sequence[str]) -> dict[str, Any]:
    """The quantization verdict over ``modes`` of a result of
    :func:`hf_unlearn.robustness.quantize.check_quantization_robustness`: failed when forgotten knowledge came back
    in a measured mode; otherwise not judged (``passed: None``) when a mode was not measured (too few layers
    quantized; the reason is in the finding); passed only when every mode was measured and held."""
    from .quantize import RETURN_THRESHOLD, mode_measured

    unmeasured = [mode for mode in modes if not mode_measured(quantization[mode])]
    came_back = [mode for mode in modes if mode not in unmeasured and quantization[mode]["knowledge_returned"]]
    reasons = "; ".join(
        f"{mode} not measured: {quantization[mode].get('not_measured', 'no layer was quantized')}"
        for mode in unmeasured
    )
    if came_back:
        passed, finding = False, f"forgotten knowledge came back after {', '.join(came_back)}"
        finding += f" ({reasons})" if reasons else ""
    elif unmeasured:
        passed, finding = None, reasons  # shown as "not judged", with why
    else:
        passed, finding = True, "held"
    return {
        "passed": passed,
        "finding": finding,
        "threshold": f"forget ROUGE-L or exact match rising by more than {RETURN_THRESHOLD}",
    }


def audit_record_fields(audit: dict[str, Any]) -> dict[str, Any]:
    """What an audit adds to a run record (:class:`hf_unlearn.training.record.UnlearnRecord` fields)."""
    return {
        "quantization": audit["quantization"],
        "relearning": audit["relearning"],
        "audit": {"verdicts": audit["verdicts"], "membership": audit.get("membership")},
    }


def audit_markdown(audit: dict[str, Any]) -> str:
    """The verdict table, then each check's own table."""
    from .quantize import quantization_table
    from .relearn import relearning_table, sweep_table

    lines = ["| check | result | finding | threshold |", "|---|---|---|---|"]
    for check, verdict in audit["verdicts"].items():
        status = {True: "passed", False: "FAILED", None: "not judged"}[verdict["passed"]]
        lines.append(f"| {check} | {status} | {verdict['finding']} | {verdict['threshold']} |")
    lines += ["", "### Quantization", "", quantization_table(audit["quantization"]), ""]
    lines += ["### Relearning", "", relearning_table(audit["relearning"]), ""]
    if "sweep" in audit["relearning"]:
        lines += ["The attacker's sweep:", "", sweep_table(audit["relearning"]["sweep"]), ""]
    membership = audit.get("membership")
    if membership:
        lines += ["### Membership attacks (MUSE's orientation: AUC 0 = forget set recognised, 0.5 = chance)", ""]
        lines += ["| attack | AUC | reference AUC | PrivLeak (%) | tells the forget set apart |"]
        lines += ["|---|---|---|---|---|"]
        judged = (membership.get("attacks") or {}).get("per_attack", {})
        for attack, auc in membership["auc"].items():
            reference = (membership.get("reference_auc") or {}).get(attack)
            leak = (membership.get("privleak") or {}).get(attack)
            row = judged.get(attack)
            told = "-" if row is None else (f"yes ({row['side'] or 'NaN'})" if row["distinguishes"] else "no")
            lines.append(
                f"| {attack} | {auc:.3f} | {'-' if reference is None else f'{reference:.3f}'} | "
                f"{'-' if leak is None else f'{leak:+.1f}'} | {told} |"
            )
        lines.append("")
    return "\n".join(lines)


__all__ = [
    "audit_markdown",
    "audit_record_fields",
    "membership_check",
    "membership_side",
    "quantization_verdict",
    "relearning_verdict",
    "run_audit",
]
