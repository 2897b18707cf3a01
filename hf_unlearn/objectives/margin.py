"""The restricted margin of MASC, the violation statistic built on it, and its exact-reproduction bound.

This is the one implementation of the margin: the MASC hinge loss, the online stopping rule
(:func:`measure_violations`) and the evaluation all call :func:`restricted_margin`. Reference: Di Gennaro,
Shevchenko, Yang, "Fast Unlearning at Scale via Margin Self-Correction", arXiv 2606.02920 (2026), §3 (restricted
margin, threshold, hinge) and Proposition 1 (exact-reproduction bound). It also holds the per-token answer
log-probabilities that the objectives and the metrics score answers with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from ..data.examples import IGNORE_INDEX
from ..data.pairing import pad_examples
from ..forwards import answer_logits

COMPETITOR_SOURCES = ("self", "teacher")


def threshold_from_probability(rho: float) -> float:
    """``tau = log(rho / (1 - rho))``: a margin above tau means a restricted posterior above rho (MASC §3)."""
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho must be strictly between 0 and 1, got {rho}.")
    return math.log(rho / (1.0 - rho))


def shift_for_causal_lm(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Align causal-LM logits with the tokens they predict: position t scores token t + 1."""
    return logits[..., :-1, :], labels[..., 1:]


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


def upcast_half(values: torch.Tensor) -> torch.Tensor:
    """Half-precision values in float32, anything wider as it is: the reference code upcasts bf16/fp16 logits before
    a softmax or margin (bf16 margins of logits around 20-40 are off by up to 0.15), and a float64 model keeps its
    precision (``.float()`` would round it down to float32)."""
    return values.float() if values.dtype in (torch.float16, torch.bfloat16) else values


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


def hoeffding_upper_bound(rate: float, num_examples: int, probe_index: int, delta: float) -> float:
    """One-sided Hoeffding upper confidence bound on the violation rate at the j-th probe (MASC §3).

    ``rate + sqrt(log(1/delta_j) / (2n))`` with ``delta_j = 6 delta / (pi^2 (j+1)^2)``, so the bound holds at
    every probe of the run simultaneously with probability ``1 - delta``.
    """
    delta_j = 6.0 * delta / (math.pi**2 * (probe_index + 1) ** 2)
    return rate + math.sqrt(math.log(1.0 / delta_j) / (2.0 * num_examples))


def exact_reproduction_bound(fractions: torch.Tensor, lengths: torch.Tensor, rho: float) -> torch.Tensor:
    """MASC Proposition 1 (beta = 1): P(greedy-or-sampled answer reproduced exactly) <= rho^((1 - v_i) L_i).

    A non-violating token has ``m <= tau``, so its restricted posterior, which upper-bounds its full softmax
    probability, is at most rho; the answer's probability is at most the product over those tokens.
    """
    return torch.pow(torch.tensor(rho, dtype=torch.float64), ((1.0 - fractions.double()) * lengths.double()))


def calibrated_thresholds(margins: torch.Tensor, calibration_margins: torch.Tensor) -> torch.Tensor:
    """Per-token thresholds matched by rank to data the model never trained on (beyond the MASC paper).

    The i-th smallest of ``margins`` (a 1-D tensor of n scored tokens, rank 0 to n - 1) gets the never-seen margin at
    the same quantile, ``quantile(calibration_margins, rank_i / (n - 1))`` with torch's linear interpolation (the
    lowest gets the never-seen minimum, the highest the maximum; one token gets the median), so a sample matched
    against itself has no excess. Used as the hinge's threshold instead of a fixed tau, it pushes each forget token
    only down to where never-seen data of the same rank sits, not below it.
    """
    ranks = torch.argsort(torch.argsort(margins.detach())).to(torch.float32)
    count = margins.numel()
    positions = ranks / (count - 1) if count > 1 else torch.full_like(ranks, 0.5)
    return torch.quantile(calibration_margins.to(device=margins.device, dtype=torch.float32), positions)


def prompt_copies(
    input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Per position of ``labels`` (B, T, unshifted): whether the answer token there also occurs in its own row's
    prompt (the attended positions that are not scored), e.g. an author's name that the answer repeats from the
    question. A model that never saw the answer can still copy such a token, so it has its own never-seen level
    (``calibration_match='prompt'``, beyond the MASC paper)."""
    prompt = labels == IGNORE_INDEX
    if attention_mask is not None:
        prompt = prompt & attention_mask.bool()
    rows = []
    for row in range(input_ids.shape[0]):  # one row at a time: (T, T) rather than (B, T, T) booleans
        rows.append(torch.isin(input_ids[row], input_ids[row][prompt[row]]))
    return torch.stack(rows) & (labels != IGNORE_INDEX)


class NeverSeenLevels(NamedTuple):
    """What a forget token whose id the never-seen answers use too is matched with (beyond the MASC paper): the
    ``ids`` (sorted) and their mean never-seen margins ``values``; with ``calibration_match='prompt'`` the sorted
    never-seen margins of own words copied from their prompt (``copied``); with ``spread`` the sorted deviations of
    the never-seen shared tokens from their id's mean, so that shared tokens are matched to the never-seen
    *distribution* of their id (its mean plus the deviation at their rank), not held at its mean. A plain tuple of
    the first fields is read the same way. With ``spread_offsets`` (``calibration_match='id_spread'``) ``spread`` holds
    each id's own deviations, grouped in the order of ``ids``, id ``i``'s from ``spread_offsets[i]`` to
    ``spread_offsets[i + 1]`` (:func:`spread_by_id`)."""

    ids: torch.Tensor
    values: torch.Tensor
    copied: torch.Tensor | None = None
    spread: torch.Tensor | None = None
    spread_offsets: torch.Tensor | None = None

    def to(self, device: Any) -> NeverSeenLevels:
        return NeverSeenLevels(*(None if t is None else t.to(device) for t in self))


def token_levels(
    margins: torch.Tensor, tokens: torch.Tensor, shared_ids: torch.Tensor, copied: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Never-seen margins split by token (beyond the MASC paper): for each token id of ``shared_ids`` (the ids the
    forget answers use) that occurs in ``tokens``, its mean never-seen margin (``ids`` sorted, ``levels``); the
    sorted margins of the other never-seen tokens (the never-seen answers' own words: their names and facts); with
    ``copied`` (:func:`prompt_copies` of each token), those of the own words copied from their own prompt, which the
    third value then leaves out (empty without ``copied``); and the sorted deviations of the shared tokens from
    their id's mean level (:attr:`NeverSeenLevels.spread`)."""
    margins, tokens = margins.detach().float().flatten(), tokens.flatten()
    shared = torch.isin(tokens, shared_ids.to(tokens.device))
    ids, inverse = torch.unique(tokens[shared], sorted=True, return_inverse=True)
    sums = torch.zeros(len(ids), dtype=torch.float32, device=margins.device).index_add_(0, inverse, margins[shared])
    counts = torch.bincount(inverse, minlength=len(ids)).float()
    levels = sums / counts.clamp(min=1)
    from_prompt = torch.zeros_like(shared) if copied is None else copied.flatten().bool().to(shared.device) & ~shared
    own = ~shared & ~from_prompt
    deviations = (margins[shared] - levels[inverse]).sort().values
    return ids, levels, margins[own].sort().values, margins[from_prompt].sort().values, deviations


def _grouped_order(values: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """The order that sorts by group, and by value within each group."""
    by_value = torch.argsort(values, stable=True)
    return by_value[torch.argsort(groups[by_value], stable=True)]


def spread_by_id(
    margins: torch.Tensor, tokens: torch.Tensor, ids: torch.Tensor, levels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each shared id's own never-seen spread (beyond the MASC paper; ``calibration_match='id_spread'``): the
    never-seen margins of the ids in ``ids`` (sorted, as :func:`token_levels` gives them, with their mean ``levels``)
    minus their id's level, sorted within each id and grouped in the order of ``ids``, and where each id's group
    starts (``offsets``, one longer than ``ids``). Pooled over ids (``'token_spread'``), a function word's missing low
    tail can be supplied by name pieces; per id, "was" is matched with how never-seen answers spread "was"."""
    margins, tokens = margins.detach().float().flatten(), tokens.flatten().to(margins.device)
    ids, levels = ids.to(margins.device), levels.to(margins.device)
    shared = torch.isin(tokens, ids)
    groups = torch.searchsorted(ids, tokens[shared])
    deviations = margins[shared] - levels[groups]
    counts = torch.bincount(groups, minlength=len(ids))
    return deviations[_grouped_order(deviations, groups)], torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def deviations_by_id(
    deviations: torch.Tensor, groups: torch.Tensor, spread: torch.Tensor, offsets: torch.Tensor
) -> torch.Tensor:
    """Each forget deviation's never-seen counterpart within its own id (``groups``: the index of each one's id):
    ranked among this call's n deviations of the same id, the id's never-seen deviation (:func:`spread_by_id`) at
    the quantile rank / (n - 1), as :func:`calibrated_thresholds` ranks (torch's linear interpolation; an id that
    occurs once gets its never-seen median), so that never-seen answers matched against themselves have no excess."""
    order = _grouped_order(deviations, groups)
    counts = torch.bincount(groups, minlength=len(offsets) - 1)
    starts = counts.cumsum(0) - counts
    ranks = torch.empty_like(groups)
    ranks[order] = torch.arange(len(groups), device=groups.device) - starts[groups[order]]
    count = counts[groups].float()
    positions = torch.where(count > 1, ranks.float() / (count - 1).clamp(min=1), torch.full_like(count, 0.5))
    sizes = (offsets[1:] - offsets[:-1])[groups]
    exact = positions * (sizes - 1).float()
    low = exact.floor().long()
    high = torch.minimum(low + 1, sizes - 1)
    first = offsets[:-1][groups]
    fraction = exact - low.float()
    return spread[first + low] * (1 - fraction) + spread[first + high] * fraction


def matched_thresholds(
    margins: torch.Tensor,
    calibration_margins: torch.Tensor,
    tokens: torch.Tensor | None = None,
    levels: NeverSeenLevels | tuple[torch.Tensor, ...] | None = None,
    copied: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each forget token's never-seen counterpart. Without ``levels``: by rank (:func:`calibrated_thresholds`).
    With ``levels`` (:class:`NeverSeenLevels`) and the tokens' ids (beyond the MASC paper): a token whose id the
    never-seen answers use too ("was", "born", the end of turn) gets that id's never-seen level, plus, with
    ``levels.spread``, the never-seen deviation from the level at the rank of its own deviation among this call's
    shared tokens (never-seen answers' shared words are not all equally predictable: their low tail is part of what
    Min-K% reads), or with ``levels.spread_offsets`` among this call's tokens of the same id, against that id's own
    never-seen deviations (:func:`deviations_by_id`); the others (the forget answers' own names and facts) get the
    never-seen answers' own words' margin at their rank among themselves; with ``levels.copied`` and ``copied``
    (:func:`prompt_copies`), an own word repeated from its prompt is ranked among the never-seen words repeated from
    theirs."""
    if levels is None or tokens is None:
        return calibrated_thresholds(margins, calibration_margins)
    levels = NeverSeenLevels(*levels).to(margins.device)
    ids, values = levels.ids, levels.values
    tokens = tokens.to(margins.device)
    shared = torch.isin(tokens, ids)
    thresholds = torch.empty_like(margins, dtype=torch.float32)
    groups = torch.searchsorted(ids, tokens[shared])
    shared_levels = values[groups]
    if levels.spread is not None and levels.spread.numel() and bool(shared.any()):
        deviations = margins[shared] - shared_levels
        if levels.spread_offsets is None:
            shared_levels = shared_levels + calibrated_thresholds(deviations, levels.spread)
        else:
            shared_levels = shared_levels + deviations_by_id(deviations, groups, levels.spread, levels.spread_offsets)
    thresholds[shared] = shared_levels
    own = calibration_margins if calibration_margins.numel() else values
    from_prompt = torch.zeros_like(shared)
    if levels.copied is not None and copied is not None and levels.copied.numel():
        from_prompt = copied.to(margins.device).bool() & ~shared
        if bool(from_prompt.any()):
            thresholds[from_prompt] = calibrated_thresholds(margins[from_prompt], levels.copied)
    rest = ~shared & ~from_prompt
    if bool(rest.any()):
        thresholds[rest] = calibrated_thresholds(margins[rest], own)
    return thresholds


def calibration_gap(
    margins: torch.Tensor,
    calibration_margins: torch.Tensor,
    tokens: torch.Tensor | None = None,
    levels: NeverSeenLevels | tuple[torch.Tensor, ...] | None = None,
    copied: torch.Tensor | None = None,
) -> float:
    """How much more familiar the forget answers look than never-seen ones: the mean, over the forget tokens, of
    ``relu(m_i - c_i)``, each forget margin's excess over its never-seen counterpart (:func:`matched_thresholds`; by
    rank: the sorted margins against the never-seen margins at the same quantiles, a one-sided 1-Wasserstein
    distance between the two margin distributions, in logits; 0 when the forget margins lie at or below never-seen
    data's everywhere)."""
    if margins.numel() == 0:
        return 0.0
    margins = margins.detach().float()
    thresholds = matched_thresholds(margins, calibration_margins, tokens, levels, copied)
    return torch.relu(margins - thresholds).mean().item()


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each answer token (at least float32) and the answer-token mask, after the causal shift.

    ``logits`` (B, T, V) and ``labels`` (B, T) as the model returns and takes them; positions whose shifted label
    is ``-100`` get 0 and are False in the mask.
    """
    logits, labels = shift_for_causal_lm(logits, labels)
    mask = labels != IGNORE_INDEX
    log_probs = -F.cross_entropy(upcast_half(logits.transpose(1, 2)), labels.masked_fill(~mask, 0), reduction="none")
    return log_probs * mask, mask


def min_k_count(n: int, k: float) -> int:
    """MUSE's number of lowest tokens, ``int(k * n)``, and at least one (short answers would otherwise score none)."""
    return max(1, int(k * n))


def min_k_per_example(log_probs: torch.Tensor, mask: torch.Tensor, k: float = 0.4) -> torch.Tensor:
    """Min-K% Prob of each row (Shi et al. 2024, arXiv 2310.16789, §3): the mean of the lowest :func:`min_k_count`
    of its scored token log-probabilities (``log_probs`` and ``mask`` as :func:`token_log_probs` returns them), NaN
    for a row that scores nothing; higher means "more likely seen in training". What the calibrated stop reads of
    forget and never-seen answers, as the evaluation's membership attack reads them."""
    rows = []
    for row, scored in zip(log_probs.double(), mask, strict=True):
        values = row[scored]
        count = min_k_count(values.numel(), k)
        lowest = torch.topk(values, count, largest=False).values.mean() if values.numel() else row.new_tensor(math.nan)
        rows.append(lowest)
    return torch.stack(rows) if rows else log_probs.new_zeros(0, dtype=torch.float64)


def leave_out_final(mask: torch.Tensor, labels: torch.Tensor, token_id: int | None) -> torch.Tensor:
    """``mask`` (B, T) without each row's last scored position where ``labels`` holds ``token_id`` there (None: as
    given). With the EOS id: the answer tokens the evaluation's membership attack scores, which reads the completion
    as :func:`~hf_unlearn.data.prompts.prompt_and_completion` gives it, without the EOS that
    :func:`~hf_unlearn.data.tokenize_qa` (and ``tokenize_text``) append for training."""
    if token_id is None or not bool(mask.any()):
        return mask
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask, positions, -1).amax(dim=-1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    final = (last >= 0) & (labels[rows, last.clamp(min=0)] == token_id)
    kept = mask.clone()
    kept[rows[final], last[final]] = False
    return kept


def answer_probabilities(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example of a batch: TOFU's answer probability exp(mean answer-token log-probability), 0 where nothing is
    scored, and 1.0 / 0.0 for whether anything is."""
    return probabilities_of(*token_log_probs(logits.detach(), labels))


def probabilities_of(log_probs: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`answer_probabilities` from the token log-probabilities and mask :func:`token_log_probs` returned."""
    lengths = mask.sum(-1)
    scored = (lengths > 0).float()
    return torch.exp(log_probs.sum(-1) / lengths.clamp(min=1)) * scored, scored


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
) -> dict[str, torch.Tensor]:
    """Per tokenized example: violation fraction v_i, answer length L_i and answer probability (MASC §3); and
    ``margins``, every scored token's margin, with its id in ``tokens`` and whether its prompt holds it too in
    ``copied`` (for :func:`calibration_gap`); ``min_k``, each example's Min-K% Prob (:func:`min_k_per_example`),
    without a final ``min_k_leaves_out`` token (:func:`leave_out_final`).

    The one model-side measurement of the margin outside the loss: the stopping probe, the run record's bound and
    the evaluation all call this. ``reference_logits(batch)`` selects teacher competitors. Examples without
    answer tokens are dropped. Every process of a distributed run must call it (the forward of a sharded model is
    a collective).
    """
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    fractions, lengths, probabilities, margins, tokens, copied, min_k = [], [], [], [], [], [], []
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
            repeated = prompt_copies(batch["input_ids"], batch["labels"], batch["attention_mask"])[:, first:]
            copied.append(repeated[:, 1:][result.mask].cpu())
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
    return {
        "fractions": all_fractions[scored],
        "lengths": all_lengths[scored],
        "probabilities": torch.cat(probabilities)[scored],
        "min_k": torch.cat(min_k)[scored],
        "margins": torch.cat(margins),
        "tokens": torch.cat(tokens),
        "copied": torch.cat(copied),
    }
