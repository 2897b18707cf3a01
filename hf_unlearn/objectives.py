"""Forget and retain objectives: small pure functions registered by name, with what each one needs.

Each objective takes :class:`LossInputs` (the current model's logits on one batch, its labels, the frozen
reference model's logits when the objective asked for them, and the config) and returns a scalar loss to
*minimise*. A registration says everything the trainer must know about an objective, so the trainer never
branches on a method name: whether it needs the reference model, hidden states or refusal answers, which config
fields are its hyperparameters (they go into the run record and the model card), what its mean is taken over
(answer tokens, sequences or attended tokens: the trainer counts that unit over the whole gradient-accumulation
window and all processes and passes the count as ``num_items``, as Trainer does with ``num_items_in_batch``),
the paper it comes from, and an optional ``prepare`` hook that checks the model and chooses what trains.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers.utils import logging

from .data import IGNORE_INDEX
from .margin import (
    calibrated_thresholds,
    masc_hinge,
    restricted_margin,
    shift_for_causal_lm,
    token_log_probs,
    upcast_half,
)

logger = logging.get_logger(__name__)

#: What an objective's mean is taken over; the trainer counts the same unit over the accumulation window.
NORMALIZATIONS = ("answer_tokens", "sequences", "attended_tokens")


@dataclass
class LossInputs:
    """What an objective may read. ``logits`` and ``labels`` are unshifted, as the model returns them.

    ``hidden_states`` / ``reference_hidden_states`` are the per-layer tuples of ``output_hidden_states=True``
    (only for objectives registered with ``needs_hidden_states``); ``refusal`` holds the same fields for the
    batch whose answers were replaced by a refusal (only for ``needs_refusal`` objectives). ``num_items`` is the
    number of the objective's units (answer tokens, sequences, attended tokens) in the whole accumulated batch of
    every process; the loss is a sum over this batch divided by it. ``None``: this batch's own count (a plain mean).
    ``calibration_margins`` (only for objectives registered with ``needs_calibration``): the restricted margins of
    every answer token of the calibration set (data of the same kind the model never trained on), measured under
    the current model at the last probe.
    """

    logits: torch.Tensor
    labels: torch.Tensor
    config: Any
    reference_logits: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    reference_hidden_states: tuple[torch.Tensor, ...] | None = None
    refusal: LossInputs | None = None
    num_items: torch.Tensor | float | None = None
    calibration_margins: torch.Tensor | None = None
    state: dict[str, Any] | None = None


@dataclass(frozen=True)
class Paper:
    """Where an objective (or a gradient surgery) comes from: one entry of the citations in the model card."""

    title: str
    url: str
    authors: str = ""

    def __str__(self) -> str:
        return f"{self.authors}. {self.title}. {self.url}" if self.authors else f"{self.title}. {self.url}"


@dataclass(frozen=True)
class Objective:
    """A registered objective and what the trainer must supply for it.

    ``needs_reference(config)``: logits (and hidden states) of the frozen start model; ``needs_hidden_states``:
    ``output_hidden_states=True``; ``needs_refusal``: a second batch with refusal answers (IdkDPO);
    ``hyperparameters``: the config fields the objective reads; ``normalized_by``: one of :data:`NORMALIZATIONS`;
    ``prepare(model, config)``: called once before training, before any weight changes, to refuse a model the
    objective cannot work with or to choose which parameters train; ``needs_calibration(config)``: the calibration
    set's margins (:attr:`LossInputs.calibration_margins`); ``needs_alternate``: a second batch whose answers are
    plausible alternatives from the forget records' ``config.alternate_column`` (AltPO), in the same field as the
    refusal batch; ``initial_state(config)``: the objective keeps state across steps (PDU's dual variable), given to
    it as :attr:`LossInputs.state`, updated after each optimizer step by ``update_state(state, config, step,
    across_processes)`` and saved with checkpoints (JSON values; keys starting with ``_`` are not saved).
    """

    name: str
    fn: Callable[[LossInputs], torch.Tensor]
    needs_reference: Callable[[Any], bool]
    paper: Paper | None = None
    hyperparameters: tuple[str, ...] = ()
    normalized_by: str = "answer_tokens"
    needs_hidden_states: bool = False
    needs_refusal: bool = False
    prepare: Callable[[Any, Any], None] | None = None
    needs_calibration: Callable[[Any], bool] = lambda _config: False
    needs_alternate: bool = False
    initial_state: Callable[[Any], dict[str, Any]] | None = None
    update_state: Callable[..., None] | None = None


FORGET_OBJECTIVES: dict[str, Objective] = {}
RETAIN_OBJECTIVES: dict[str, Objective] = {}


def _register(registry: dict[str, Objective], name: str, needs_reference: bool | Callable[[Any], bool], **options):
    if options.get("normalized_by", "answer_tokens") not in NORMALIZATIONS:
        raise ValueError(f"normalized_by must be one of {NORMALIZATIONS}, got {options['normalized_by']!r}.")
    unknown = set(options) - {"paper", "hyperparameters", "normalized_by", "needs_hidden_states", "needs_refusal",
                              "prepare", "needs_calibration", "needs_alternate", "initial_state",
                              "update_state"}  # fmt: skip
    if unknown:
        raise TypeError(f"Unknown objective option(s) {sorted(unknown)}.")

    def decorator(fn: Callable[[LossInputs], torch.Tensor]) -> Callable[[LossInputs], torch.Tensor]:
        needs = needs_reference if callable(needs_reference) else (lambda _config, value=needs_reference: value)
        registry[name] = Objective(name, fn, needs, **options)
        return fn

    return decorator


def register_forget_objective(name: str, needs_reference: bool | Callable[[Any], bool] = False, **options: Any):
    """Register a forget objective under ``name`` (usable as ``UnlearnConfig(forget_loss=name)``).

    ``needs_reference``: a bool, or a function of the config. ``options`` are :class:`Objective`'s fields:
    ``paper``, ``hyperparameters``, ``normalized_by``, ``needs_hidden_states``, ``needs_refusal``, ``prepare``.
    """
    return _register(FORGET_OBJECTIVES, name, needs_reference, **options)


def register_retain_objective(name: str, needs_reference: bool | Callable[[Any], bool] = False, **options: Any):
    """Register a retain objective under ``name`` (usable as ``UnlearnConfig(retain_loss=name)``); the options
    are :func:`register_forget_objective`'s, except ``needs_refusal``."""
    if options.get("needs_refusal") or options.get("needs_alternate"):
        raise ValueError("Only forget objectives can ask for refusal or alternate answers.")
    return _register(RETAIN_OBJECTIVES, name, needs_reference, **options)


def get_objective(registry: dict[str, Objective], name: str, kind: str) -> Objective:
    if name not in registry:
        raise ValueError(f"Unknown {kind} objective {name!r}; registered: {sorted(registry)}.")
    return registry[name]


def _mean(total: torch.Tensor, local_count: torch.Tensor | int, inputs: LossInputs) -> torch.Tensor:
    """``total`` over the accumulated batch's count when the trainer gave one, else over this batch's."""
    return total / (inputs.num_items if inputs.num_items is not None else local_count)


def _require_answer_tokens(mask: torch.Tensor, inputs: LossInputs) -> None:
    """Refuse a batch without answer tokens. Skipped under the trainer (``num_items`` given), which checked every
    example before training: reading the device here would cost a host sync per step on a GPU."""
    if inputs.num_items is None and not mask.any():
        raise ValueError("The batch has no answer tokens (all labels are -100): there is nothing to score.")


def answer_nll(inputs: LossInputs) -> torch.Tensor:
    """Mean negative log-likelihood over the answer tokens of the batch."""
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    _require_answer_tokens(mask, inputs)
    return _mean(-log_probs.sum(), mask.sum(), inputs)


def sequence_log_prob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of answer-token log-probabilities per sequence, log pi(y|x)."""
    log_probs, _ = token_log_probs(logits, labels)
    return log_probs.sum(-1)


def _log_ratio(inputs: LossInputs) -> torch.Tensor:
    """``log pi(y|x) - log pi_ref(y|x)`` per sequence (sequence-summed), the quantity NPO and DPO are built on."""
    return sequence_log_prob(inputs.logits, inputs.labels) - sequence_log_prob(inputs.reference_logits, inputs.labels)


def _preference_margin(inputs: LossInputs) -> torch.Tensor:
    """DPO's margin with the paired batch (:attr:`LossInputs.refusal`: a refusal or an alternative answer) as the
    chosen answer and the forget answer as the rejected one."""
    _require_answer_tokens(inputs.labels != IGNORE_INDEX, inputs)
    return _log_ratio(inputs.refusal) - _log_ratio(inputs)


def _vocab_size(model: Any) -> int:
    embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "weight"):
        # ds_shape: the full shape of a weight DeepSpeed ZeRO-3 partitioned (its own shape is then empty).
        return getattr(embeddings.weight, "ds_shape", embeddings.weight.shape)[0]
    return model.config.get_text_config().vocab_size


# --- forget objectives ------------------------------------------------------------------------------------

MASC_PAPER = Paper(
    "Fast Unlearning at Scale via Margin Self-Correction",
    "https://arxiv.org/abs/2606.02920",
    "Di Gennaro, Shevchenko, Yang",
)


def _check_masc_k(model: Any, config: Any) -> None:
    vocab_size = _vocab_size(model)
    if config.masc_k >= vocab_size:
        raise ValueError(
            f"masc_k={config.masc_k} is not smaller than the vocabulary size {vocab_size}: the k competitors are "
            "other tokens than the target. Lower masc_k."
        )


@register_forget_objective(
    "masc",
    paper=MASC_PAPER,
    needs_reference=lambda config: config.competitor_source == "teacher",
    hyperparameters=(
        "masc_k",
        "masc_beta",
        "masc_rho",
        "masc_eta",
        "masc_threshold",
        "competitor_source",
        "competitor_delta",
    ),
    prepare=_check_masc_k,
    needs_calibration=lambda config: config.masc_threshold == "calibration",
)
def masc_loss(inputs: LossInputs) -> torch.Tensor:
    """Buffered hinge on the restricted margin of every answer token (MASC §3).

    The threshold is tau = log(rho / (1 - rho)) for every token (the paper), or with ``masc_threshold=
    "calibration"`` (beyond the paper) each token's never-seen counterpart: the calibration set's margin at the
    token's rank among the batch's forget tokens (:func:`~hf_unlearn.margin.calibrated_thresholds`), so the hinge
    pushes the forget set's margins down to the distribution of data the model never saw, not below it.
    """
    config = inputs.config
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    teacher = None
    if config.competitor_source == "teacher":
        teacher, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
    result = restricted_margin(
        logits, labels, k=config.masc_k, beta=config.masc_beta, teacher_logits=teacher, delta=config.competitor_delta
    )
    tau: float | torch.Tensor = config.masc_tau
    if config.masc_threshold == "calibration":
        thresholds = torch.zeros_like(result.margins)
        thresholds[result.mask] = calibrated_thresholds(result.margins[result.mask], inputs.calibration_margins)
        tau = thresholds
    return masc_hinge(result, tau=tau, eta=config.masc_eta, num_items=inputs.num_items)


@register_forget_objective(
    "ga",
    paper=Paper(
        "Knowledge Unlearning for Mitigating Privacy Risks in Language Models",
        "https://arxiv.org/abs/2210.01504",
        "Jang et al.",
    ),
)
def gradient_ascent_loss(inputs: LossInputs) -> torch.Tensor:
    """``-NLL_f``: minimising it raises the NLL of the forget answers (DESIGN §5, GA)."""
    return -answer_nll(inputs)


@register_forget_objective(
    "npo",
    paper=Paper("Negative Preference Optimization", "https://arxiv.org/abs/2404.05868", "Zhang, Lin, Bai, Mei"),
    needs_reference=True,
    hyperparameters=("npo_beta",),
    normalized_by="sequences",
)
def npo_loss(inputs: LossInputs) -> torch.Tensor:
    """``-(2/beta) mean log sigmoid(-beta (log pi(y|x) - log pi_ref(y|x)))`` with sequence-summed log ratios.

    NPO (arXiv 2404.05868, eq. 3), beta = ``config.npo_beta`` (0.1).
    """
    beta = inputs.config.npo_beta
    _require_answer_tokens(inputs.labels != IGNORE_INDEX, inputs)
    losses = -(2.0 / beta) * F.logsigmoid(-beta * _log_ratio(inputs))
    return _mean(losses.sum(), losses.numel(), inputs)


@register_forget_objective(
    "simnpo",
    paper=Paper(
        "Simplicity Prevails: Rethinking Negative Preference Optimization for LLM Unlearning",
        "https://arxiv.org/abs/2410.07163",
        "Fan et al.",
    ),
    hyperparameters=("simnpo_beta", "simnpo_delta"),
    normalized_by="sequences",
)
def simnpo_loss(inputs: LossInputs) -> torch.Tensor:
    """``-(2/beta) mean log sigmoid(beta (NLL(y|x)/|y| - delta))``: length-normalised NPO without a reference.

    SimNPO (arXiv 2410.07163, eq. 4), beta = ``config.simnpo_beta`` (4.5), delta = ``config.simnpo_delta`` (0).
    """
    config = inputs.config
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    _require_answer_tokens(mask, inputs)
    lengths = mask.sum(-1).clamp(min=1)
    mean_nll = -log_probs.sum(-1) / lengths
    losses = -(2.0 / config.simnpo_beta) * F.logsigmoid(config.simnpo_beta * (mean_nll - config.simnpo_delta))
    return _mean(losses.sum(), losses.numel(), inputs)


@register_forget_objective(
    "idk_dpo",
    paper=Paper(
        "TOFU: A Task of Fictitious Unlearning for LLMs (IdkDPO)", "https://arxiv.org/abs/2401.06121", "Maini et al."
    ),
    needs_reference=True,
    hyperparameters=("dpo_beta", "refusal_answers"),
    normalized_by="sequences",
    needs_refusal=True,
)
def idk_dpo_loss(inputs: LossInputs) -> torch.Tensor:
    """DPO with the refusal as the chosen answer and the forget answer as the rejected one.

    ``-mean log sigmoid(beta [(log pi(y_idk) - log pi_ref(y_idk)) - (log pi(y) - log pi_ref(y))])``, beta =
    ``config.dpo_beta`` (0.1), sequence-summed log-probabilities. open-unlearning scales this loss by 2/beta; we
    keep DPO's own scale.
    """
    losses = -F.logsigmoid(inputs.config.dpo_beta * _preference_margin(inputs))
    return _mean(losses.sum(), losses.numel(), inputs)


@register_forget_objective(
    "undial",
    paper=Paper(
        "UNDIAL: Self-Distillation with Adjusted Logits for Robust Unlearning in Large Language Models",
        "https://arxiv.org/abs/2402.10052",
        "Dong et al.",
    ),
    needs_reference=True,
    hyperparameters=("undial_beta",),
)
def undial_loss(inputs: LossInputs) -> torch.Tensor:
    """Cross-entropy to ``softmax(z_ref - beta * onehot(y))`` on the answer tokens, beta = ``config.undial_beta``.

    UNDIAL (arXiv 2402.10052, §3): the frozen model's distribution with the target token's logit lowered.
    open-unlearning averages over every position (prompt and padding too); we average over answer tokens.
    """
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    reference, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    _require_answer_tokens(mask, inputs)
    # Selecting the answer positions costs one device sync, and keeps the vocabulary-sized softmax to them.
    answer_labels = labels[mask].unsqueeze(-1)
    reference_answers = upcast_half(reference[mask])
    lowered = torch.full(
        answer_labels.shape, -inputs.config.undial_beta, device=logits.device, dtype=reference_answers.dtype
    )
    adjusted = reference_answers.scatter_add(-1, answer_labels, lowered)
    target = F.softmax(adjusted, dim=-1)
    cross_entropy = -(target * F.log_softmax(upcast_half(logits[mask]), dim=-1)).sum(-1)
    return _mean(cross_entropy.sum(), cross_entropy.numel(), inputs)


WGA_PAPER = Paper(
    "Rethinking LLM Unlearning Objectives: A Gradient Perspective and Go Beyond (WGA)",
    "https://arxiv.org/abs/2502.19301",
    "Wang et al.",
)


@register_forget_objective("wga", paper=WGA_PAPER, hyperparameters=("wga_beta",))
def wga_loss(inputs: LossInputs) -> torch.Tensor:
    """Weighted gradient ascent: ``mean_t sg(p_t)^beta log p_t`` over the answer tokens (WGA, arXiv 2502.19301).

    Each token's ascent is scaled by its own probability (no gradient through the weight), so tokens already
    unlikely stop being pushed; beta = ``config.wga_beta`` (1). As open-unlearning: one mean over the batch's answer
    tokens.
    """
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    _require_answer_tokens(mask, inputs)
    weights = torch.exp(log_probs.detach()).pow(inputs.config.wga_beta)
    return _mean((weights * log_probs * mask).sum(), mask.sum(), inputs)


@register_forget_objective(
    "satimp",
    paper=Paper(
        "Exploring Criteria of Loss Reweighting to Enhance LLM Unlearning (SatImp)",
        "https://arxiv.org/abs/2505.11953",
        "Yang et al.",
    ),
    hyperparameters=("satimp_beta1", "satimp_beta2"),
)
def satimp_loss(inputs: LossInputs) -> torch.Tensor:
    """Saturation x importance reweighted ascent: ``mean_t sg(p_t)^beta1 sg(1 - p_t)^beta2 log p_t`` (SatImp,
    arXiv 2505.11953), beta1 = ``config.satimp_beta1`` (5), beta2 = ``config.satimp_beta2`` (1), no gradient through
    the weights; one mean over the batch's answer tokens, as open-unlearning."""
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    _require_answer_tokens(mask, inputs)
    probs = torch.exp(log_probs.detach())
    weights = probs.pow(inputs.config.satimp_beta1) * (1.0 - probs).pow(inputs.config.satimp_beta2)
    return _mean((weights * log_probs * mask).sum(), mask.sum(), inputs)


@register_forget_objective(
    "ce_u",
    paper=Paper("Cross-Entropy Unlearning (CE-U)", "https://arxiv.org/abs/2503.01224", "Yang"),
    hyperparameters=("ceu_ignore_first_n_answer_tokens",),
)
def ce_u_loss(inputs: LossInputs) -> torch.Tensor:
    """Cross-entropy to the model's own distribution with the true token removed (CE-U, arXiv 2503.01224).

    At each answer token, the target is ``q = softmax(sg(z))`` with the true token's logit set to -inf, and the loss
    ``-sum_v q_v log softmax(z)_v``: its gradient on the logits is ``p - q``, whose true-token part ``p_y`` is
    bounded (no reference model, no extra data). The first ``config.ceu_ignore_first_n_answer_tokens`` (1) answer
    tokens of each example are not scored, as in open-unlearning. Under the trainer the sum is divided by all the
    accumulated answer tokens, the skipped ones included (a plain mean over the scored ones without it).
    """
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    _require_answer_tokens(mask, inputs)
    skip = inputs.config.ceu_ignore_first_n_answer_tokens
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
    return _mean(cross_entropy.sum(), cross_entropy.numel(), inputs)


@register_forget_objective(
    "altpo",
    paper=Paper(
        "Alternate Preference Optimization for Unlearning Factual Knowledge in Large Language Models (AltPO)",
        "https://arxiv.org/abs/2409.13474",
        "Mekala et al.",
    ),
    needs_reference=True,
    hyperparameters=("altpo_beta", "alternate_column"),
    normalized_by="sequences",
    needs_alternate=True,
)
def altpo_loss(inputs: LossInputs) -> torch.Tensor:
    """DPO with a plausible alternative answer as the chosen one and the forget answer as the rejected one (AltPO,
    arXiv 2409.13474): ``-(2/beta) mean log sigmoid(beta [(log pi(a~) - log pi_ref(a~)) - (log pi(a) - log
    pi_ref(a))])``, sequence-summed log-probabilities, beta = ``config.altpo_beta`` (0.1), as open-unlearning.

    The alternatives come from the forget records' ``config.alternate_column`` (default ``perturbed_answer``, TOFU's
    answers with changed facts; a list gives example i its (i mod n)-th); the paper samples 5 per question from the
    model itself.
    """
    beta = inputs.config.altpo_beta
    losses = -(2.0 / beta) * F.logsigmoid(beta * _preference_margin(inputs))
    return _mean(losses.sum(), losses.numel(), inputs)


PDU_PAPER = Paper(
    "Constrained Entropic Unlearning: A Primal-Dual Framework for Large Language Models (PDU)",
    "https://arxiv.org/abs/2506.05314",
    "Entesari et al.",
)


@register_forget_objective("pdu", paper=PDU_PAPER)
def pdu_forget_loss(inputs: LossInputs) -> torch.Tensor:
    """Logit-margin flattening: ``mean_t (max_v z_t,v - mean_v z_t,v)^2`` at the positions that predict answer
    tokens (PDU, arXiv 2506.05314): the output distribution there is driven towards uniform. open-unlearning masks
    the unshifted positions (it skips the prediction of the first answer token); we score every answer token."""
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    _require_answer_tokens(mask, inputs)
    answer_logits = upcast_half(logits[mask])
    flatness = (answer_logits.amax(-1) - answer_logits.mean(-1)).pow(2)
    return _mean(flatness.sum(), flatness.numel(), inputs)


def _pdu_initial_state(config: Any) -> dict[str, Any]:
    return {"dual": float(config.pdu_dual_init), "epsilon": config.pdu_epsilon, "last_retain_loss": None, "updates": 0}


def _pdu_update_state(
    state: dict[str, Any], config: Any, step: int, across_processes: Callable[[torch.Tensor], Any]
) -> None:
    """The dual ascent step after an optimizer step: ``lambda <- max(0, lambda + eta (L_retain - epsilon))`` with
    the retain NLL of the step's whole batch (its micro-batches and processes; open-unlearning updates on every
    micro-batch and process). ``epsilon`` defaults to ``(1 + pdu_epsilon_slack)`` times the first step's retain
    loss, the paper's relative bound; no update during the first ``pdu_dual_warmup_steps`` steps.
    ``across_processes(local)`` turns this process's value of the step's retain loss into the whole batch's."""
    pending = state.pop("_pending", [])
    shares = state.pop("_window_shares", False)
    if not pending:
        return
    # Under the trainer each micro-batch's NLL is its share of the window's mean (divided by the window's token
    # count), so the shares add up; called on its own, each is a plain mean, so they are averaged.
    local = torch.stack(pending).sum() if shares else torch.stack(pending).mean()
    retain_loss = float(across_processes(local))
    if state["epsilon"] is None:
        state["epsilon"] = (1.0 + config.pdu_epsilon_slack) * retain_loss
    state["last_retain_loss"] = retain_loss
    if step > config.pdu_dual_warmup_steps:
        state["dual"] = max(0.0, state["dual"] + config.pdu_dual_step * (retain_loss - state["epsilon"]))
        state["updates"] += 1


@register_retain_objective(
    "pdu_dual",
    paper=PDU_PAPER,
    hyperparameters=("pdu_epsilon", "pdu_epsilon_slack", "pdu_dual_init", "pdu_dual_step", "pdu_dual_warmup_steps"),
    initial_state=_pdu_initial_state,
    update_state=_pdu_update_state,
)
def pdu_retain_loss(inputs: LossInputs) -> torch.Tensor:
    """``lambda * NLL_retain``, the Lagrangian's retain term of PDU (arXiv 2506.05314) with the dual variable
    ``lambda`` kept in :attr:`LossInputs.state` (the constant ``-lambda epsilon`` is dropped: it has no gradient).
    The retain NLL of every micro-batch is kept for the dual update after the optimizer step."""
    nll = answer_nll(inputs)
    state = inputs.state if inputs.state is not None else _pdu_initial_state(inputs.config)
    state.setdefault("_pending", []).append(nll.detach())
    state["_window_shares"] = inputs.num_items is not None
    return state["dual"] * nll


def _rmu_hidden(hidden_states: tuple[torch.Tensor, ...], layer: int) -> torch.Tensor:
    return hidden_states[layer + 1]  # hidden_states[0] is the embedding output


def _masked_squared_error(hidden: torch.Tensor, target: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
    """Per attended token, the mean squared error across the hidden dimension; averaged over attended tokens."""
    per_token = (upcast_half(hidden) - upcast_half(target)).pow(2).mean(-1)
    mask = inputs.attention_mask.to(per_token.dtype)
    return _mean((per_token * mask).sum(), mask.sum(), inputs)


def _select_rmu_parameters(model: Any, config: Any) -> None:
    """RMU trains only the MLP weights of a few layers (arXiv 2403.03218, §5); freeze everything else.

    ``output_hidden_states`` gives the output of decoder layer l as ``hidden_states[l + 1]`` for every layer but
    the last, whose entry is taken after the model's final norm (Llama, Qwen2, GPT-2 alike), so the last layer
    cannot be steered this way and is refused.
    """
    if hasattr(model, "peft_config"):
        raise ValueError("RMU chooses which MLP weights train itself; pass the base model without a PEFT wrapper.")
    num_layers = model.config.get_text_config().num_hidden_layers
    if num_layers < 2:
        raise ValueError(
            f"RMU steers the output of a decoder layer below the last one, and {type(model).__name__} has "
            f"{num_layers} layer: use a model with at least 2 layers or another method."
        )
    if config.rmu_layer is None:
        config.rmu_layer = min(7, num_layers - 2)
        logger.warning(
            f"RMU: rmu_layer was not set; steering decoder layer {config.rmu_layer} (of 0..{num_layers - 1})."
        )
    if not 0 <= config.rmu_layer < num_layers:
        raise ValueError(f"rmu_layer={config.rmu_layer} but the model has {num_layers} layers (0..{num_layers - 1}).")
    if config.rmu_layer == num_layers - 1:
        raise ValueError(
            f"rmu_layer={config.rmu_layer} is the last decoder layer, whose hidden state the model only returns after "
            f"its final norm, so RMU would steer the normalised output instead of the layer's. Choose a layer "
            f"between 0 and {num_layers - 2}."
        )
    if config.rmu_trainable_layers is None:
        config.rmu_trainable_layers = [i for i in range(config.rmu_layer - 2, config.rmu_layer + 1) if i >= 0]
        logger.warning(
            f"RMU: training the MLP weights of layers {config.rmu_trainable_layers} (rmu_trainable_layers)."
        )
    pattern = re.compile(r"\.(?:layers|h|blocks)\.(" + "|".join(map(str, config.rmu_trainable_layers)) + r")\.mlp\.")
    selected = 0
    for name, param in model.named_parameters():
        param.requires_grad_(bool(pattern.search(name)))
        selected += int(param.requires_grad)
    if selected == 0:
        raise ValueError(
            f"RMU found no MLP weights of layers {config.rmu_trainable_layers} in {type(model).__name__} "
            "(looked for '.layers.N.mlp.' / '.h.N.mlp.'); set rmu_trainable_layers."
        )


RMU_PAPER = Paper(
    "The WMDP Benchmark: Measuring and Reducing Malicious Use With Unlearning (RMU)",
    "https://arxiv.org/abs/2403.03218",
    "Li et al.",
)


@register_forget_objective(
    "rmu",
    paper=RMU_PAPER,
    hyperparameters=("rmu_layer", "rmu_trainable_layers", "rmu_steering_coefficient"),
    normalized_by="attended_tokens",
    needs_hidden_states=True,
    prepare=_select_rmu_parameters,
)
def rmu_forget_loss(inputs: LossInputs) -> torch.Tensor:
    """``MSE(h_l(x_forget), c * u)``: steer layer l's activations on forget inputs to a fixed random direction.

    RMU (arXiv 2403.03218, §5): u is a random unit vector fixed for the run (seeded), c =
    ``config.rmu_steering_coefficient``; l = ``config.rmu_layer``. Averaged over every attended token (prompt
    included), as the WMDP reference does; open-unlearning's TOFU variant uses answer tokens.
    """
    config = inputs.config
    hidden = _rmu_hidden(inputs.hidden_states, config.rmu_layer)
    direction = rmu_direction(hidden.shape[-1], config.seed, hidden.device)
    target = (config.rmu_steering_coefficient * direction).expand_as(hidden)
    return _masked_squared_error(hidden, target, inputs)


@register_retain_objective(
    "rmu_retain",
    paper=RMU_PAPER,
    needs_reference=True,
    hyperparameters=("rmu_layer",),
    normalized_by="attended_tokens",
    needs_hidden_states=True,
)
def rmu_retain_loss(inputs: LossInputs) -> torch.Tensor:
    """RMU retain term: MSE to the frozen model's layer-l activations on retain inputs (arXiv 2403.03218, §5)."""
    layer = inputs.config.rmu_layer
    hidden = _rmu_hidden(inputs.hidden_states, layer)
    target = _rmu_hidden(inputs.reference_hidden_states, layer)
    return _masked_squared_error(hidden, target, inputs)


def rmu_direction(size: int, seed: int, device: torch.device) -> torch.Tensor:
    """The fixed random unit vector u of RMU (uniform in [0, 1) then normalised, as in the reference code)."""
    generator = torch.Generator().manual_seed(seed)
    direction = torch.rand(size, generator=generator)
    return (direction / direction.norm()).to(device)


# --- retain objectives ------------------------------------------------------------------------------------


@register_retain_objective(
    "nll",
    paper=Paper(
        "Continual Learning and Private Unlearning (GradDiff)", "https://arxiv.org/abs/2203.12817", "Liu et al."
    ),
)
def retain_nll_loss(inputs: LossInputs) -> torch.Tensor:
    """Cross-entropy on the retain answers (GradDiff's retain term)."""
    return answer_nll(inputs)


@register_retain_objective("kl", paper=MASC_PAPER, needs_reference=True)
def retain_kl_loss(inputs: LossInputs) -> torch.Tensor:
    """Token-mean ``KL(p_theta0 || p_theta)`` over retain answer tokens (MASC §3 objective, NPO+KLR).

    open-unlearning averages over every position (prompt and padding too); we average over answer tokens.
    """
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    reference, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    _require_answer_tokens(mask, inputs)
    # Selecting the answer positions costs one device sync, and keeps the vocabulary-sized softmax to them.
    log_p = F.log_softmax(upcast_half(logits[mask]), dim=-1)
    log_p_ref = F.log_softmax(upcast_half(reference[mask]), dim=-1)
    return _mean(F.kl_div(log_p, log_p_ref, log_target=True, reduction="sum"), mask.sum(), inputs)
