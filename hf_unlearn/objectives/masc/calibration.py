"""Thresholds from never-seen data (beyond the MASC paper): each forget token's counterpart among the margins of
answers the model never trained on (the calibration set), by rank (:func:`calibrated_thresholds`) or, for a token the
never-seen answers use too, by its id's own never-seen level and spread (:class:`NeverSeenLevels`,
:func:`matched_thresholds`), and the calibration gap the stop reads (:func:`calibration_gap`). Findings:
docs/studies/masc_landing.md."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ...data.examples import IGNORE_INDEX


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
