"""MASC's restricted margin, its hinge, the violation statistic built on it, and its exact-reproduction bound.

This is the one implementation of the margin: the MASC hinge loss (:mod:`.loss`), the online stopping rule
(:func:`measure_violations`, :mod:`.probe`) and the evaluation all call :func:`restricted_margin`. Reference: Di
Gennaro, Shevchenko, Yang, "Fast Unlearning at Scale via Margin Self-Correction", arXiv 2606.02920 (2026), §3
(restricted margin, threshold, hinge) and Proposition 1 (exact-reproduction bound). The thresholds matched to
never-seen data (beyond the paper) are in :mod:`.calibration`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...data.examples import IGNORE_INDEX, prompt_copies
from ...data.pairing import pad_examples
from ...forwards import answer_logits
from ...scores import (
    leave_out_final,
    min_k_per_example,
    probabilities_of,
    shift_for_causal_lm,
    token_log_probs,
    upcast_half,
)

COMPETITOR_SOURCES = ("self", "teacher")


def threshold_from_probability(rho: float) -> float:
    """``tau = log(rho / (1 - rho))``: a margin above tau means a restricted posterior above rho (MASC §3)."""
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be strictly between 0 and 1, got {rho}.")
    return math.log(rho / (1.0 - rho))


@dataclass
class MarginResult:
    """Margins of every position (garbage where ``mask`` is False) and the mask of scored answer tokens."""

    margins: torch.Tensor
    mask: torch.Tensor


def restricted_margin(
    logits: torch.Tensor,
    labels: torch.Tensor,
    k: int,
    beta: float = 1.0,
    teacher_logits: torch.Tensor | None = None,
    delta: float | None = None,
) -> MarginResult:
    """Token-level restricted margin ``m = beta*z(y) - logsumexp_{v in S_k} beta*z(v)`` (MASC §3).

    ``logits`` (..., V) and ``labels`` (...) must already be aligned (see :func:`shift_for_causal_lm`);
    positions whose label is ``-100`` are not scored. The competitor set ``S_k`` holds the k highest
    non-target logits of the current model (source ``self``) or, when ``teacher_logits`` are given, the k
    highest non-target logits of the teacher (the frozen start model), scored by the current model
    (source ``teacher``). With ``delta``, teacher competitors more than ``delta`` logits below the teacher's
    best non-target token are dropped (at least that best one stays).

    The competitor set is chosen without gradient; gradient flows through the selected current-model logits.
    Memory: one top-(k+1) over the vocabulary; the target is removed from it instead of masking a copy of the
    logits, so nothing of size k x V is allocated. Numerics: the k + 1 gathered logits are upcast to float32
    before the log-sum-exp and the subtraction, as the MASC reference code does (it upcasts the logits); in
    bf16, logits around 20-40 would otherwise put the margin off by up to 0.15. Only the gathered values are
    upcast, never a vocabulary-sized copy.
    """
    vocab_size = logits.shape[-1]
    if k < 1 or k >= vocab_size:
        raise ValueError(
            f"k={k} competitors need 1 <= k < vocabulary size ({vocab_size}): the target token is not a competitor."
        )
    mask = labels != IGNORE_INDEX
    targets = labels.masked_fill(~mask, 0)
    target_logit = upcast_half(logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1))

    chooser = logits if teacher_logits is None else teacher_logits
    with torch.no_grad():
        chosen_values, chosen_index = chooser.topk(k + 1, dim=-1)
        keep = _drop_target(chosen_index, targets)
        if teacher_logits is not None and delta is not None:
            best_other = chosen_values.masked_fill(~keep, float("-inf")).amax(-1, keepdim=True)
            keep &= chosen_values >= best_other - delta
    competitor_logits = upcast_half(logits.gather(-1, chosen_index))
    scaled = (beta * competitor_logits).masked_fill(~keep, float("-inf"))
    margins = beta * target_logit - torch.logsumexp(scaled, dim=-1)
    return MarginResult(margins=margins, mask=mask)


def _drop_target(index: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Keep k of the top-(k+1) candidates: drop the target if it is among them, else the last one."""
    is_target = index == targets.unsqueeze(-1)
    target_absent = ~is_target.any(-1, keepdim=True)
    drop = is_target.clone()
    drop[..., -1:] |= target_absent
    return ~drop


def masc_hinge(
    result: MarginResult,
    tau: float | torch.Tensor,
    eta: float,
    num_items: torch.Tensor | float | None = None,
    two_sided: bool = False,
) -> torch.Tensor:
    """Buffered hinge ``relu(m - (tau - eta)) / eta`` averaged over scored tokens (MASC §3); ``tau`` is a number, or
    a tensor of per-token thresholds shaped like the margins.

    It upper-bounds the violation indicator ``1[m > tau]`` and its gradient is zero once every margin is
    below ``tau - eta``. With ``num_items`` the sum over this batch's scored tokens is divided by it instead (the
    count of scored tokens in the whole accumulated batch, so gradient accumulation gives the big batch's mean).

    ``two_sided`` (beyond the paper, for per-token never-seen thresholds): ``(relu(m - tau) + relu(tau - eta - m)) /
    eta``, zero on the band ``[tau - eta, tau]``: a token stops being pushed once it reaches its never-seen
    counterpart ``tau`` and is pulled back up once it falls more than ``eta`` below it.
    """
    if eta <= 0:
        raise ValueError(f"eta must be positive, got {eta}.")
    active = result.mask
    if num_items is None and not active.any():  # under the trainer the data was checked before training
        raise ValueError("The batch has no answer tokens (all labels are -100): there is nothing to forget.")
    if two_sided:
        per_token = (torch.relu(result.margins - tau) + torch.relu(tau - eta - result.margins)) / eta
    else:
        per_token = torch.relu(result.margins - (tau - eta)) / eta
    # Masked with `where`, not selected: a boolean index would read its size from the device every step.
    hinge = torch.where(active, per_token, 0.0)
    return hinge.sum() / (num_items if num_items is not None else active.sum())


def violation_fractions(result: MarginResult, tau: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example: the fraction of answer tokens with ``m > tau`` (v_i, MASC §3) and the answer length L_i.

    Examples without answer tokens get fraction 0 and length 0; callers drop them.
    """
    flat_margins = result.margins.reshape(result.margins.shape[0], -1)
    flat_mask = result.mask.reshape(result.mask.shape[0], -1)
    violating = ((flat_margins > tau) & flat_mask).sum(-1).float()
    lengths = flat_mask.sum(-1)
    fractions = violating / lengths.clamp(min=1).float()
    return fractions, lengths


def exact_reproduction_bound(fractions: torch.Tensor, lengths: torch.Tensor, rho: float) -> torch.Tensor:
    """MASC Proposition 1 (beta = 1): P(greedy-or-sampled answer reproduced exactly) <= rho^((1 - v_i) L_i).

    A non-violating token has ``m <= tau``, so its restricted posterior, which upper-bounds its full softmax
    probability, is at most rho; the answer's probability is at most the product over those tokens.
    """
    return torch.pow(torch.tensor(rho, dtype=torch.float64), ((1.0 - fractions.double()) * lengths.double()))


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
    min_k_leaves_out: int | None = None,
    with_copies: bool = False,
) -> dict[str, torch.Tensor]:
    """Per tokenized example: violation fraction v_i, answer length L_i and answer probability (MASC §3); and
    ``margins``, every scored token's margin, with its id in ``tokens`` and, ``with_copies``, whether it repeats the
    prompt in ``copies`` (:func:`~hf_unlearn.data.prompt_copies`; for :func:`calibration_gap`); ``min_k``, each
    example's Min-K% Prob (:func:`min_k_per_example`), without a final ``min_k_leaves_out`` token
    (:func:`leave_out_final`).

    The one model-side measurement of the margin outside the loss: the stopping probe, the run record's bound and
    the evaluation all call this. ``reference_logits(batch)`` selects teacher competitors. Examples without
    answer tokens are dropped. Every process of a distributed run must call it (the forward of a sharded model is
    a collective).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    fractions, lengths, probabilities, margins, tokens, min_k, copies = [], [], [], [], [], [], []
    try:
        for start in range(0, len(examples), batch_size):
            padded = pad_examples(examples[start : start + batch_size], pad_token_id)
            batch = {key: value.to(device) for key, value in padded.items()}
            # The LM head (and the top-k over the vocabulary) only where an answer token is predicted, a chat
            # template's shared system prompt run once: the prompt is often half the sequence.
            logits, first = answer_logits(model, batch["input_ids"], batch["attention_mask"], batch["labels"])
            answer_labels = batch["labels"][:, first:]
            shifted, labels = shift_for_causal_lm(logits, answer_labels)
            teacher = None
            if reference_logits is not None:
                teacher, _ = shift_for_causal_lm(reference_logits(batch)[:, first:], answer_labels)
            result = restricted_margin(shifted, labels, k=k, beta=beta, teacher_logits=teacher, delta=delta)
            batch_fractions, batch_lengths = violation_fractions(result, tau)
            margins.append(result.margins[result.mask].float().cpu())
            tokens.append(labels[result.mask].cpu())
            if with_copies:
                repeats = prompt_copies(batch["input_ids"], batch["labels"], batch["attention_mask"])[:, first:]
                copies.append(repeats[:, 1:][result.mask].cpu())
            answer_log_probs = token_log_probs(logits.detach(), answer_labels)  # one log-softmax for both reads
            probabilities.append(probabilities_of(*answer_log_probs)[0].cpu())
            log_probs, scored_mask = answer_log_probs
            min_k.append(min_k_per_example(log_probs, leave_out_final(scored_mask, labels, min_k_leaves_out)).cpu())
            fractions.append(batch_fractions.cpu())
            lengths.append(batch_lengths.cpu())
    finally:
        model.train(was_training)
    all_fractions, all_lengths = torch.cat(fractions), torch.cat(lengths)
    scored = all_lengths > 0
    measured = {
        "fractions": all_fractions[scored],
        "lengths": all_lengths[scored],
        "probabilities": torch.cat(probabilities)[scored],
        "min_k": torch.cat(min_k)[scored],
        "margins": torch.cat(margins),
        "tokens": torch.cat(tokens),
    }
    if with_copies:
        measured["copies"] = torch.cat(copies)
    return measured
