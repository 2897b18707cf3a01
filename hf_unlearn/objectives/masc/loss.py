"""MASC, margin self-correction (Di Gennaro, Shevchenko, Yang, arXiv 2606.02920): the buffered hinge on the restricted
margin of each forgotten token against the model's top-k alternatives (§3). Its retain terms, NLL and KL, are in
:mod:`.retain`; the margin itself is in :mod:`.margin`."""

from __future__ import annotations

from typing import Any

import torch
from transformers.utils import logging

from ...data.examples import IGNORE_INDEX
from ...scores import shift_for_causal_lm, upcast_half
from ..registry import (
    LossInputs,
    Paper,
    model_vocab_size,
    register_forget_objective,
)
from .calibration import NeverSeenLevels, matched_thresholds
from .margin import masc_hinge, restricted_margin
from .options import MARGIN_OPTIONS

logger = logging.get_logger(__name__)


MASC_PAPER = Paper(
    "Fast Unlearning at Scale via Margin Self-Correction",
    "https://arxiv.org/abs/2606.02920",
    "Di Gennaro, Shevchenko, Yang",
)


def _check_masc_k(model: Any, config: Any) -> None:
    vocab_size = model_vocab_size(model)
    if config.masc_k >= vocab_size:
        raise ValueError(
            f"masc_k={config.masc_k} is not smaller than the vocabulary size {vocab_size}: the k competitors are "
            "other tokens than the target. Lower masc_k."
        )


def masc_beyond_paper(config: Any) -> tuple[str, ...]:
    """What a MASC run does that arXiv 2606.02920 does not (its hinge: relu(m - (tau - eta)) / eta with
    tau = log(rho / (1 - rho)) for every token)."""
    if config.masc_threshold != "calibration":
        departures = []
    else:
        departures = ["masc_threshold='calibration': each token's threshold from never-seen data, not tau"]
        if config.masc_hinge == "two_sided":
            departures.append("masc_hinge='two_sided': a token below its never-seen counterpart is pulled back up")
        if config.calibration_match != "rank":
            match = config.calibration_match
            departures.append(f"calibration_match={match!r}: each token matched with its never-seen counterpart")
        if config.match_prompt_copies:
            departures.append("match_prompt_copies: a token repeating the prompt matched with never-seen such tokens")
    if config.masc_rival_kl:
        departures.append(
            f"masc_rival_kl={config.masc_rival_kl:g}: a KL holds the start model's distribution over the other tokens"
        )
        if config.masc_rival_temperature != 1:
            departures.append(
                f"masc_rival_temperature={config.masc_rival_temperature:g}: that distribution sharpened (logits / T)"
            )
    return tuple(departures)


@register_forget_objective(
    "masc",
    paper=MASC_PAPER,
    needs_reference=lambda config: config.competitor_source == "teacher" or (config.masc_rival_kl or 0) > 0,
    hyperparameters=MARGIN_OPTIONS,
    prepare=_check_masc_k,
    needs_calibration=lambda config: config.masc_threshold == "calibration",
    needs_prompt_copies=lambda config: config.masc_threshold == "calibration" and config.match_prompt_copies,
    methods={"masc": "kl"},
    forget_weight=0.1,  # MASC's lambda_forget (TOFU/Qwen row of arXiv 2606.02920)
    stops_itself=True,
    beyond_paper=masc_beyond_paper,
)
def masc_loss(inputs: LossInputs) -> torch.Tensor:
    """Buffered hinge on the restricted margin of every answer token (MASC §3).

    The threshold is tau = log(rho / (1 - rho)) for every token (the paper), or with ``masc_threshold=
    "calibration"`` (beyond the paper) each token's never-seen counterpart: the calibration set's margin at the
    token's rank among the batch's forget tokens (:func:`~.calibration.calibrated_thresholds`), so the
    hinge pushes the forget set's margins down to the distribution of data the model never saw, not below it; with
    ``masc_hinge="two_sided"`` (beyond the paper) a token that fell below its counterpart is pulled back up, and with
    ``calibration_match="id_spread"`` (beyond the paper) a token the never-seen answers also use is matched with its
    own id's never-seen level and spread (:func:`~.calibration.matched_thresholds`); with ``match_prompt_copies``
    (beyond the paper) a token that repeats the prompt (the author's name a question spells) is matched with the
    calibration tokens that repeat theirs.
    """
    config = inputs.config
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    teacher = None
    if config.competitor_source == "teacher":
        teacher, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
    result = restricted_margin(
        logits, labels, k=config.masc_k, beta=config.masc_beta, teacher_logits=teacher, delta=config.competitor_delta
    )
    inputs.margins = result  # the stop's running read takes it (one margin a step: UnlearnTrainer._objective_loss)
    tau: float | torch.Tensor = config.masc_tau
    if config.masc_threshold == "calibration":
        levels = None if inputs.calibration_levels is None else NeverSeenLevels(*inputs.calibration_levels)
        thresholds = torch.zeros_like(result.margins)
        copies = None
        if inputs.prompt_copies is not None:
            copies = shift_for_causal_lm(inputs.logits, inputs.prompt_copies)[1][result.mask]
        per_token = [result.margins[result.mask].detach(), labels[result.mask], copies]
        (margins, tokens, copies), own = gathered_across_processes(per_token)
        matched = matched_thresholds(
            margins, inputs.calibration_margins, tokens, levels, copies, inputs.calibration_copy_margins
        )
        # The never-seen margins are kept in float32; a float64 model's margins are not.
        thresholds[result.mask] = matched[own].to(thresholds.dtype)
        tau = thresholds
    two_sided = config.masc_hinge == "two_sided" and config.masc_threshold == "calibration"
    loss = masc_hinge(result, tau=tau, eta=config.masc_eta, num_items=inputs.num_items, two_sided=two_sided)
    if (config.masc_rival_kl or 0) > 0:
        reference, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
        kl = rival_kl(logits, reference, labels, inputs.num_items, temperature=config.masc_rival_temperature)
        loss = loss + config.masc_rival_kl * kl
    return loss


def rival_kl(
    logits: torch.Tensor,
    reference_logits: torch.Tensor,
    labels: torch.Tensor,
    num_items: torch.Tensor | float | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """KL(start model || model) of the distribution over the tokens *other than the answer token*, at each answer
    token (aligned ``logits``/``labels``, as :func:`~hf_unlearn.scores.shift_for_causal_lm` returns them),
    summed and divided by ``num_items`` (else by this batch's answer tokens). Beyond the MASC paper: the hinge
    decides how far the forgotten token falls; this term decides what takes its place, the alternatives the start
    model had there (another name, another profession) rather than a rival the hinge raised at every position. With
    ``temperature`` below 1 the start model's distribution is sharpened first (its logits divided by it): the
    replacement is then as confident as a model that never saw the answer, not as uncertain as the leftover mass of
    one that memorised it (docs/studies/attack_landing.md)."""
    mask = labels != IGNORE_INDEX
    targets = labels[mask]
    student = upcast_half(logits[mask])
    teacher = upcast_half(reference_logits[mask].detach()) / temperature
    student = student.scatter(-1, targets.unsqueeze(-1), float("-inf"))
    teacher = teacher.scatter(-1, targets.unsqueeze(-1), float("-inf"))
    student_log = torch.log_softmax(student, dim=-1)
    teacher_log = torch.log_softmax(teacher, dim=-1)
    # The answer token's own column is -inf in both: 0 * (-inf) is masked out explicitly.
    per_token = torch.where(teacher_log.isfinite(), teacher_log.exp() * (teacher_log - student_log), 0.0).sum(-1)
    return per_token.sum() / (num_items if num_items is not None else mask.sum().clamp(min=1))


def gathered_across_processes(
    per_token: list[torch.Tensor | None],
) -> tuple[list[torch.Tensor | None], slice]:
    """Per-token 1-D tensors of every data-parallel process, concatenated in rank order, and the slice of them that is
    this process's. Under DDP, FSDP or ZeRO each process holds part of the micro-batch, and a rank-matched threshold
    (:func:`~.calibration.matched_thresholds`) is a token's rank among every token of the call: ranked
    among the whole micro-batch's tokens, the thresholds are those of one process on the same batch (tested). A
    ``None`` stays ``None``; every process must call this (the loss runs in lockstep)."""
    count = 0 if per_token[0] is None else per_token[0].numel()
    whole = slice(0, count)
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return per_token, whole
    world = torch.distributed.get_world_size()
    if world == 1:
        return per_token, whole
    device = per_token[0].device
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    torch.distributed.all_gather(sizes, torch.tensor([count], dtype=torch.long, device=device))
    counts = [int(size) for size in sizes]
    gathered: list[torch.Tensor | None] = []
    for tensor in per_token:
        if tensor is None:
            gathered.append(None)
            continue
        as_sent = tensor.to(torch.uint8) if tensor.dtype == torch.bool else tensor  # gloo does not send bool
        padded = torch.zeros(max(counts), dtype=as_sent.dtype, device=device)
        padded[:count] = as_sent
        parts = [torch.empty_like(padded) for _ in range(world)]
        torch.distributed.all_gather(parts, padded)
        joined = torch.cat([part[:n] for part, n in zip(parts, counts, strict=True)])
        gathered.append(joined.bool() if tensor.dtype == torch.bool else joined)
    start = sum(counts[: torch.distributed.get_rank()])
    return gathered, slice(start, start + count)
