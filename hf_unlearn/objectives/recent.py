"""The 2025 methods open-unlearning added: WGA (arXiv 2502.19301), SatImp (arXiv 2505.11953), CE-U (arXiv 2503.01224),
AltPO (arXiv 2409.13474) and PDU (arXiv 2506.05314, primal-dual with a dual variable kept across steps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from transformers.utils import logging

from ..data.examples import IGNORE_INDEX
from ..scores import shift_for_causal_lm, token_log_probs, upcast_half
from .registry import (
    LossInputs,
    Paper,
    answer_nll,
    check_bounds,
    mean_over_items,
    objective_hyperparameters,
    preference_margin,
    register_forget_objective,
    register_retain_objective,
    require_answer_tokens,
)

logger = logging.get_logger(__name__)


WGA_PAPER = Paper(
    "Rethinking LLM Unlearning Objectives: A Gradient Perspective and Go Beyond (WGA)",
    "https://arxiv.org/abs/2502.19301",
    "Wang et al.",
)


@register_forget_objective(
    "wga",
    paper=WGA_PAPER,
    hyperparameters={"beta": 1.0},
    check=check_bounds(nonnegative=("beta",)),
    methods={"wga": "nll"},
)
def wga_loss(inputs: LossInputs) -> torch.Tensor:
    """Weighted gradient ascent: ``mean_t sg(p_t)^beta log p_t`` over the answer tokens (WGA, arXiv 2502.19301).

    Each token's ascent is scaled by its own probability (no gradient through the weight), so tokens already unlikely
    stop being pushed; ``beta`` 1 (``forget_loss_kwargs``). As open-unlearning: one mean over the batch's answer
    tokens.
    """
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    require_answer_tokens(mask, inputs)
    weights = torch.exp(log_probs.detach()).pow(inputs.hyperparameters["beta"])
    return mean_over_items((weights * log_probs * mask).sum(), mask.sum(), inputs)


@register_forget_objective(
    "satimp",
    paper=Paper(
        "Exploring Criteria of Loss Reweighting to Enhance LLM Unlearning (SatImp)",
        "https://arxiv.org/abs/2505.11953",
        "Yang et al.",
    ),
    hyperparameters={"beta1": 5.0, "beta2": 1.0},
    check=check_bounds(nonnegative=("beta1", "beta2")),
    methods={"satimp": "nll"},
    # SatImp's reference code adds 0.1 x retain NLL (tmlr-group/SatImp, coeff 0.1; the open-unlearning YAML has
    # forget 0.1 and retain 1 instead, its README and Python defaults agree with the paper's).
    retain_weight=0.1,
)
def satimp_loss(inputs: LossInputs) -> torch.Tensor:
    """Saturation x importance reweighted ascent: ``mean_t sg(p_t)^beta1 sg(1 - p_t)^beta2 log p_t`` (SatImp,
    arXiv 2505.11953), ``beta1`` 5 and ``beta2`` 1 (``forget_loss_kwargs``), no gradient through the weights; one
    mean over the batch's answer tokens, as open-unlearning."""
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    require_answer_tokens(mask, inputs)
    probs = torch.exp(log_probs.detach())
    weights = probs.pow(inputs.hyperparameters["beta1"]) * (1.0 - probs).pow(inputs.hyperparameters["beta2"])
    return mean_over_items((weights * log_probs * mask).sum(), mask.sum(), inputs)


@register_forget_objective(
    "ce_u",
    paper=Paper("Cross-Entropy Unlearning (CE-U)", "https://arxiv.org/abs/2503.01224", "Yang"),
    hyperparameters={"ignore_first_n_answer_tokens": 1},
    check=check_bounds(nonnegative=("ignore_first_n_answer_tokens",)),
    methods={"ce_u": "none"},
)
def ce_u_loss(inputs: LossInputs) -> torch.Tensor:
    """Cross-entropy to the model's own distribution with the true token removed (CE-U, arXiv 2503.01224).

    At each answer token, the target is ``q = softmax(sg(z))`` with the true token's logit set to -inf, and the loss
    ``-sum_v q_v log softmax(z)_v``: its gradient on the logits is ``p - q``, whose true-token part ``p_y`` is bounded
    (no reference model, no extra data). The first ``ignore_first_n_answer_tokens`` (1, ``forget_loss_kwargs``) answer
    tokens of each example are not scored, as in open-unlearning. Under the trainer the sum is divided by all the
    accumulated answer tokens, the skipped ones included (a plain mean over the scored ones without it).
    """
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    require_answer_tokens(mask, inputs)
    skip = inputs.hyperparameters["ignore_first_n_answer_tokens"]
    if skip > 0:
        mask = mask & (mask.long().cumsum(-1) > skip)
    # Selecting the answer positions costs one device sync, and keeps the vocabulary-sized softmax to them.
    answer_logits = upcast_half(logits[mask])
    targets = labels[mask].unsqueeze(-1)
    without_true = answer_logits.detach().scatter(-1, targets, float("-inf"))
    q = F.softmax(without_true, dim=-1)
    cross_entropy = -(q * F.log_softmax(answer_logits, dim=-1)).sum(-1)
    if inputs.num_items is None and cross_entropy.numel() == 0:
        return logits.sum() * 0.0  # every answer shorter than the skipped tokens: nothing to unlearn here
    return mean_over_items(cross_entropy.sum(), cross_entropy.numel(), inputs)


@register_forget_objective(
    "altpo",
    paper=Paper(
        "Alternate Preference Optimization for Unlearning Factual Knowledge in Large Language Models (AltPO)",
        "https://arxiv.org/abs/2409.13474",
        "Mekala et al.",
    ),
    needs_reference=True,
    hyperparameters={"beta": 0.1},
    check=check_bounds(positive=("beta",)),
    normalized_by="sequences",
    needs_alternate=True,
    methods={"altpo": "nll"},
)
def altpo_loss(inputs: LossInputs) -> torch.Tensor:
    """DPO with a plausible alternative answer as the chosen one and the forget answer as the rejected one (AltPO,
    arXiv 2409.13474): ``-(2/beta) mean log sigmoid(beta [(log pi(a~) - log pi_ref(a~)) - (log pi(a) - log
    pi_ref(a))])``, sequence-summed log-probabilities, ``beta`` 0.1 (``forget_loss_kwargs``), as open-unlearning.

    The alternatives come from the forget records' ``config.alternate_column`` (default ``perturbed_answer``, TOFU's
    answers with changed facts; a list gives example i its (i mod n)-th); the paper samples 5 per question from the
    model itself.
    """
    beta = inputs.hyperparameters["beta"]
    losses = -(2.0 / beta) * F.logsigmoid(beta * preference_margin(inputs))
    return mean_over_items(losses.sum(), losses.numel(), inputs)


PDU_PAPER = Paper(
    "Constrained Entropic Unlearning: A Primal-Dual Framework for Large Language Models (PDU)",
    "https://arxiv.org/abs/2506.05314",
    "Entesari et al.",
)


@register_forget_objective("pdu", paper=PDU_PAPER, methods={"pdu": "pdu_dual"})
def pdu_forget_loss(inputs: LossInputs) -> torch.Tensor:
    """Logit-margin flattening: ``mean_t (max_v z_t,v - mean_v z_t,v)^2`` at the positions that predict answer
    tokens (PDU, arXiv 2506.05314): the output distribution there is driven towards uniform. open-unlearning masks
    the unshifted positions (it skips the prediction of the first answer token); we score every answer token."""
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    require_answer_tokens(mask, inputs)
    answer_logits = upcast_half(logits[mask])
    flatness = (answer_logits.amax(-1) - answer_logits.mean(-1)).pow(2)
    return mean_over_items(flatness.sum(), flatness.numel(), inputs)


def _pdu_state(values: Any) -> dict[str, Any]:
    return {"dual": float(values["dual_init"]), "epsilon": values["epsilon"], "last_retain_loss": None, "updates": 0}


def _pdu_initial_state(config: Any) -> dict[str, Any]:
    return _pdu_state(objective_hyperparameters(config, "retain"))


def _pdu_update_state(
    state: dict[str, Any], config: Any, step: int, across_processes: Callable[[torch.Tensor], Any]
) -> None:
    """The dual ascent step after an optimizer step: ``lambda <- max(0, lambda + eta (L_retain - epsilon))`` with
    the retain NLL of the step's whole batch (its micro-batches and processes; open-unlearning updates on every
    micro-batch and process). ``epsilon`` defaults to ``(1 + epsilon_slack)`` times the first step's retain loss, the
    paper's relative bound; no update during the first ``dual_warmup_steps`` steps (``retain_loss_kwargs``).
    ``across_processes(local)`` turns this process's value of the step's retain loss into the whole batch's."""
    pending = state.pop("_pending", [])
    shares = state.pop("_window_shares", False)
    if not pending:
        return
    values = objective_hyperparameters(config, "retain")
    # Under the trainer each micro-batch's NLL is its share of the window's mean (divided by the window's token
    # count), so the shares add up; called on its own, each is a plain mean, so they are averaged.
    local = torch.stack(pending).sum() if shares else torch.stack(pending).mean()
    retain_loss = float(across_processes(local))
    if state["epsilon"] is None:
        state["epsilon"] = (1.0 + values["epsilon_slack"]) * retain_loss
    state["last_retain_loss"] = retain_loss
    if step > values["dual_warmup_steps"]:
        state["dual"] = max(0.0, state["dual"] + values["dual_step"] * (retain_loss - state["epsilon"]))
        state["updates"] += 1


def _check_pdu(values: Any, option: str) -> None:
    """PDU's bound is a number or None (chosen from the first step), its step sizes and warmup >= 0."""
    epsilon = values["epsilon"]
    if epsilon is not None and (isinstance(epsilon, bool) or not isinstance(epsilon, (int, float))):
        raise ValueError(
            f"{option}['epsilon'] must be a number (the bound on the retain loss) or None, got {epsilon!r}."
        )
    check_bounds(nonnegative=("epsilon_slack", "dual_init", "dual_step", "dual_warmup_steps"))(values, option)


@register_retain_objective(
    "pdu_dual",
    paper=PDU_PAPER,
    hyperparameters={
        "epsilon": None,
        "epsilon_slack": 0.1,
        "dual_init": 1.0,
        "dual_step": 1.0,
        "dual_warmup_steps": 0,
    },
    check=_check_pdu,
    initial_state=_pdu_initial_state,
    update_state=_pdu_update_state,
)
def pdu_retain_loss(inputs: LossInputs) -> torch.Tensor:
    """``lambda * NLL_retain``, the Lagrangian's retain term of PDU (arXiv 2506.05314) with the dual variable
    ``lambda`` kept in :attr:`LossInputs.state` (the constant ``-lambda epsilon`` is dropped: it has no gradient).
    The retain NLL of every micro-batch is kept for the dual update after the optimizer step. ``epsilon`` (None:
    ``(1 + epsilon_slack)`` x the first step's retain loss), ``epsilon_slack`` 0.1, ``dual_init`` 1, ``dual_step`` 1
    and ``dual_warmup_steps`` 0 are set with ``retain_loss_kwargs``."""
    nll = answer_nll(inputs)
    state = inputs.state if inputs.state is not None else _pdu_state(inputs.hyperparameters)
    state.setdefault("_pending", []).append(nll.detach())
    state["_window_shares"] = inputs.num_items is not None
    return state["dual"] * nll
