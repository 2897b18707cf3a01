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
    """What an objective may read. ``logits`` and ``labels`` are unshifted, as the model returns them.

    ``hidden_states`` / ``reference_hidden_states`` are the per-layer tuples of ``output_hidden_states=True``
    (only for objectives registered with ``needs_hidden_states``); ``refusal`` holds the same fields for the
    batch whose answers were replaced by a refusal (only for ``needs_refusal`` objectives).
    """

    logits: torch.Tensor
    labels: torch.Tensor
    config: Any
    reference_logits: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    reference_hidden_states: tuple[torch.Tensor, ...] | None = None
    refusal: LossInputs | None = None


@dataclass(frozen=True)
class Objective:
    """A registered objective and what the trainer must supply for it.

    ``needs_reference(config)``: logits (and hidden states) of the frozen start model; ``needs_hidden_states``:
    ``output_hidden_states=True``; ``needs_refusal``: a second batch with refusal answers (IdkDPO).
    """

    name: str
    fn: Callable[[LossInputs], torch.Tensor]
    needs_reference: Callable[[Any], bool]
    citation: str
    needs_hidden_states: bool = False
    needs_refusal: bool = False


FORGET_OBJECTIVES: dict[str, Objective] = {}
RETAIN_OBJECTIVES: dict[str, Objective] = {}


def _register(
    registry: dict[str, Objective],
    name: str,
    citation: str,
    needs_reference: bool | Callable[[Any], bool],
    needs_hidden_states: bool,
    needs_refusal: bool,
) -> Callable[[Callable[[LossInputs], torch.Tensor]], Callable[[LossInputs], torch.Tensor]]:
    def decorator(fn: Callable[[LossInputs], torch.Tensor]) -> Callable[[LossInputs], torch.Tensor]:
        needs = needs_reference if callable(needs_reference) else (lambda _config, value=needs_reference: value)
        registry[name] = Objective(name, fn, needs, citation, needs_hidden_states, needs_refusal)
        return fn

    return decorator


def register_forget_objective(
    name: str,
    citation: str = "",
    needs_reference: bool | Callable[[Any], bool] = False,
    needs_hidden_states: bool = False,
    needs_refusal: bool = False,
):
    """Register a forget objective under ``name`` (usable as ``UnlearnConfig(forget_loss=name)``)."""
    return _register(FORGET_OBJECTIVES, name, citation, needs_reference, needs_hidden_states, needs_refusal)


def register_retain_objective(
    name: str,
    citation: str = "",
    needs_reference: bool | Callable[[Any], bool] = False,
    needs_hidden_states: bool = False,
):
    """Register a retain objective under ``name`` (usable as ``UnlearnConfig(retain_loss=name)``)."""
    return _register(RETAIN_OBJECTIVES, name, citation, needs_reference, needs_hidden_states, False)


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
def npo_loss(inputs: LossInputs) -> torch.Tensor:
    """``-(2/beta) mean log sigmoid(-beta (log pi(y|x) - log pi_ref(y|x)))`` with sequence-summed log ratios.

    NPO (arXiv 2404.05868, eq. 3), beta = ``config.npo_beta`` (0.1).
    """
    beta = inputs.config.npo_beta
    _require_answer_tokens(inputs.labels != IGNORE_INDEX)
    log_ratio = sequence_log_prob(inputs.logits, inputs.labels) - sequence_log_prob(
        inputs.reference_logits, inputs.labels
    )
    return -(2.0 / beta) * F.logsigmoid(-beta * log_ratio).mean()


@register_forget_objective(
    "simnpo", citation="Fan et al. Simplicity Prevails: Rethinking Negative Preference Optimization. arXiv 2410.07163"
)
def simnpo_loss(inputs: LossInputs) -> torch.Tensor:
    """``-(2/beta) mean log sigmoid(beta (NLL(y|x)/|y| - delta))``: length-normalised NPO without a reference.

    SimNPO (arXiv 2410.07163, eq. 4), beta = ``config.simnpo_beta`` (4.5), delta = ``config.simnpo_delta`` (0).
    """
    config = inputs.config
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    _require_answer_tokens(mask)
    lengths = mask.sum(-1).clamp(min=1)
    mean_nll = -log_probs.sum(-1) / lengths
    return -(2.0 / config.simnpo_beta) * F.logsigmoid(config.simnpo_beta * (mean_nll - config.simnpo_delta)).mean()


@register_forget_objective(
    "idk_dpo",
    citation="Maini et al. TOFU (arXiv 2401.06121), IdkDPO: DPO (Rafailov et al. 2023) with refusals preferred",
    needs_reference=True,
    needs_refusal=True,
)
def idk_dpo_loss(inputs: LossInputs) -> torch.Tensor:
    """DPO with the refusal as the chosen answer and the forget answer as the rejected one.

    ``-mean log sigmoid(beta [(log pi(y_idk) - log pi_ref(y_idk)) - (log pi(y) - log pi_ref(y))])``, beta =
    ``config.dpo_beta`` (0.1), sequence-summed log-probabilities.
    """
    refusal = inputs.refusal
    _require_answer_tokens(inputs.labels != IGNORE_INDEX)
    chosen = sequence_log_prob(refusal.logits, refusal.labels) - sequence_log_prob(
        refusal.reference_logits, refusal.labels
    )
    rejected = sequence_log_prob(inputs.logits, inputs.labels) - sequence_log_prob(
        inputs.reference_logits, inputs.labels
    )
    return -F.logsigmoid(inputs.config.dpo_beta * (chosen - rejected)).mean()


@register_forget_objective(
    "undial",
    citation="Dong et al. UNDIAL: Self-Distillation with Adjusted Logits for Robust Unlearning. arXiv 2402.10052",
    needs_reference=True,
)
def undial_loss(inputs: LossInputs) -> torch.Tensor:
    """Cross-entropy to ``softmax(z_ref - beta * onehot(y))`` on the answer tokens, beta = ``config.undial_beta``.

    UNDIAL (arXiv 2402.10052, §3): the frozen model's distribution with the target token's logit lowered.
    """
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    reference, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    _require_answer_tokens(mask)
    adjusted = (
        reference[mask]
        .float()
        .scatter_add(
            -1,
            labels[mask].unsqueeze(-1),
            torch.full((int(mask.sum()), 1), -inputs.config.undial_beta, device=logits.device),
        )
    )
    target = F.softmax(adjusted, dim=-1)
    return -(target * F.log_softmax(logits[mask].float(), dim=-1)).sum(-1).mean()


def _rmu_hidden(hidden_states: tuple[torch.Tensor, ...], layer: int) -> torch.Tensor:
    return hidden_states[layer + 1]  # hidden_states[0] is the embedding output


def _masked_mse(hidden: torch.Tensor, target: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over attended tokens of the per-token mean squared error across the hidden dimension."""
    per_token = (hidden.float() - target.float()).pow(2).mean(-1)
    mask = attention_mask.bool()
    return per_token[mask].mean()


@register_forget_objective(
    "rmu",
    citation="Li et al. The WMDP Benchmark (RMU). arXiv 2403.03218",
    needs_hidden_states=True,
)
def rmu_forget_loss(inputs: LossInputs) -> torch.Tensor:
    """``MSE(h_l(x_forget), c * u)``: steer layer l's activations on forget inputs to a fixed random direction.

    RMU (arXiv 2403.03218, §5): u is a random unit vector fixed for the run (seeded), c =
    ``config.rmu_steering_coefficient``; l = ``config.rmu_layer``.
    """
    config = inputs.config
    hidden = _rmu_hidden(inputs.hidden_states, config.rmu_layer)
    direction = rmu_direction(hidden.shape[-1], config.seed, hidden.device)
    target = (config.rmu_steering_coefficient * direction).expand_as(hidden)
    return _masked_mse(hidden, target, inputs.attention_mask)


@register_retain_objective(
    "rmu_retain",
    citation="RMU retain term: MSE to the frozen model's activations on retain inputs (arXiv 2403.03218, §5)",
    needs_reference=True,
    needs_hidden_states=True,
)
def rmu_retain_loss(inputs: LossInputs) -> torch.Tensor:
    layer = inputs.config.rmu_layer
    hidden = _rmu_hidden(inputs.hidden_states, layer)
    target = _rmu_hidden(inputs.reference_hidden_states, layer)
    return _masked_mse(hidden, target, inputs.attention_mask)


def rmu_direction(size: int, seed: int, device: torch.device) -> torch.Tensor:
    """The fixed random unit vector u of RMU (uniform in [0, 1) then normalised, as in the reference code)."""
    generator = torch.Generator().manual_seed(seed)
    direction = torch.rand(size, generator=generator)
    return (direction / direction.norm()).to(device)


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
