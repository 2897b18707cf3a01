"""Forget and retain objectives: small pure functions registered by name.

Each objective takes :class:`LossInputs` (the current model's logits on one batch, its labels, the frozen
reference model's logits when the objective asked for them, and the config) and returns a scalar loss to
*minimise*. The trainer runs the forwards once and looks objectives up by name; it never branches on the
method.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .data import IGNORE_INDEX
from .margin import masc_hinge, restricted_margin, shift_for_causal_lm


@dataclass
class LossInputs:
    """What an objective may read. ``logits`` and ``labels`` are unshifted, as the model returns them."""

    logits: torch.Tensor
    labels: torch.Tensor
    config: Any
    reference_logits: torch.Tensor | None = None


@dataclass(frozen=True)
class Objective:
    """A registered objective. ``needs_reference(config)`` says whether the trainer must supply reference logits."""

    name: str
    fn: Callable[[LossInputs], torch.Tensor]
    needs_reference: Callable[[Any], bool]
    citation: str


FORGET_OBJECTIVES: dict[str, Objective] = {}
RETAIN_OBJECTIVES: dict[str, Objective] = {}


def _register(
    registry: dict[str, Objective], name: str, citation: str, needs_reference: bool | Callable[[Any], bool]
) -> Callable[[Callable[[LossInputs], torch.Tensor]], Callable[[LossInputs], torch.Tensor]]:
    def decorator(fn: Callable[[LossInputs], torch.Tensor]) -> Callable[[LossInputs], torch.Tensor]:
        needs = needs_reference if callable(needs_reference) else (lambda _config, value=needs_reference: value)
        registry[name] = Objective(name=name, fn=fn, needs_reference=needs, citation=citation)
        return fn

    return decorator


def register_forget_objective(name: str, citation: str = "", needs_reference: bool | Callable[[Any], bool] = False):
    """Register a forget objective under ``name`` (usable as ``UnlearnConfig(forget_loss=name)``)."""
    return _register(FORGET_OBJECTIVES, name, citation, needs_reference)


def register_retain_objective(name: str, citation: str = "", needs_reference: bool | Callable[[Any], bool] = False):
    """Register a retain objective under ``name`` (usable as ``UnlearnConfig(retain_loss=name)``)."""
    return _register(RETAIN_OBJECTIVES, name, citation, needs_reference)


def get_objective(registry: dict[str, Objective], name: str, kind: str) -> Objective:
    if name not in registry:
        raise ValueError(f"Unknown {kind} objective {name!r}; registered: {sorted(registry)}.")
    return registry[name]


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each answer token and the answer-token mask, after the causal shift."""
    logits, labels = shift_for_causal_lm(logits, labels)
    mask = labels != IGNORE_INDEX
    log_probs = -F.cross_entropy(logits.transpose(1, 2).float(), labels.masked_fill(~mask, 0), reduction="none")
    return log_probs * mask, mask


def _require_answer_tokens(mask: torch.Tensor) -> None:
    if not mask.any():
        raise ValueError("The batch has no answer tokens (all labels are -100): there is nothing to score.")


def answer_nll(inputs: LossInputs) -> torch.Tensor:
    """Mean negative log-likelihood over the answer tokens of the batch."""
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    _require_answer_tokens(mask)
    return -log_probs.sum() / mask.sum()


def sequence_log_prob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of answer-token log-probabilities per sequence, log pi(y|x)."""
    log_probs, _ = token_log_probs(logits, labels)
    return log_probs.sum(-1)


# --- forget objectives ------------------------------------------------------------------------------------


@register_forget_objective(
    "masc",
    citation="Di Gennaro, Shevchenko, Yang. Fast Unlearning at Scale via Margin Self-Correction. arXiv 2606.02920",
    needs_reference=lambda config: config.competitor_source == "teacher",
)
def masc_loss(inputs: LossInputs) -> torch.Tensor:
    """Buffered hinge on the restricted margin of every answer token (MASC §3)."""
    config = inputs.config
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    teacher = None
    if config.competitor_source == "teacher":
        teacher, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
    result = restricted_margin(
        logits, labels, k=config.masc_k, beta=config.masc_beta, teacher_logits=teacher, delta=config.competitor_delta
    )
    return masc_hinge(result, tau=config.masc_tau, eta=config.masc_eta)


@register_forget_objective("ga", citation="Gradient ascent on the forget set (Jang et al., ACL 2023)")
def gradient_ascent_loss(inputs: LossInputs) -> torch.Tensor:
    """``-NLL_f``: minimising it raises the NLL of the forget answers (DESIGN §5, GA)."""
    return -answer_nll(inputs)


@register_forget_objective(
    "npo",
    citation="Zhang, Lin, Bai, Mei. Negative Preference Optimization. arXiv 2404.05868",
    needs_reference=True,
)
def npo_loss(inputs: LossInputs, beta: float = 0.1) -> torch.Tensor:
    """``-(2/beta) mean log sigmoid(-beta (log pi(y|x) - log pi_ref(y|x)))`` with sequence-summed log ratios."""
    _require_answer_tokens(inputs.labels != IGNORE_INDEX)
    log_ratio = sequence_log_prob(inputs.logits, inputs.labels) - sequence_log_prob(
        inputs.reference_logits, inputs.labels
    )
    return -(2.0 / beta) * F.logsigmoid(-beta * log_ratio).mean()


# --- retain objectives ------------------------------------------------------------------------------------


@register_retain_objective("nll", citation="Cross-entropy on retain answers (GradDiff, Liu et al. 2022)")
def retain_nll_loss(inputs: LossInputs) -> torch.Tensor:
    return answer_nll(inputs)


@register_retain_objective(
    "kl", citation="Token-mean KL(p_ref || p_theta) on retain answers (MASC §3, NPO+KLR)", needs_reference=True
)
def retain_kl_loss(inputs: LossInputs) -> torch.Tensor:
    """Token-mean ``KL(p_theta0 || p_theta)`` over retain answer tokens (MASC §3 objective)."""
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    reference, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    _require_answer_tokens(mask)
    log_p = F.log_softmax(logits[mask].float(), dim=-1)
    log_p_ref = F.log_softmax(reference[mask].float(), dim=-1)
    return F.kl_div(log_p, log_p_ref, log_target=True, reduction="batchmean")
