"""Thresholds from never-seen data (beyond the MASC paper): each forget token's counterpart among the margins of
answers the model never trained on (the calibration set), by rank (:func:`calibrated_thresholds`) or, for a token the
never-seen answers use too, by its id's own never-seen level and spread (:class:`NeverSeenLevels`,
:func:`matched_thresholds`); the calibration gap (:func:`calibration_gap`); and what the calibration answers read at
one set of weights (:class:`NeverSeenReference`), the loss's thresholds and the stop's reference. Findings:
docs/studies/masc_landing.md."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


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


class NeverSeenLevels(NamedTuple):
    """What a forget token whose id the never-seen answers use too is matched with (``calibration_match='id_spread'``,
    beyond the MASC paper): the ``ids`` (sorted), their mean never-seen margins ``values``, and each id's own
    never-seen deviations from its mean (``spread``, grouped in the order of ``ids``: id ``i``'s from
    ``spread_offsets[i]`` to ``spread_offsets[i + 1]``, :func:`spread_by_id`), so that "was" is matched with how
    never-seen answers spread "was", not held at its mean."""

    ids: torch.Tensor
    values: torch.Tensor
    spread: torch.Tensor
    spread_offsets: torch.Tensor

    def to(self, device: Any) -> NeverSeenLevels:
        return NeverSeenLevels(*(t.to(device) for t in self))


def token_levels(
    margins: torch.Tensor, tokens: torch.Tensor, shared_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Never-seen margins split by token (beyond the MASC paper): for each token id of ``shared_ids`` (the ids the
    forget answers use) that occurs in ``tokens``, its mean never-seen margin (``ids`` sorted, ``levels``); and the
    sorted margins of the other never-seen tokens (the never-seen answers' own words: their names and facts)."""
    margins, tokens = margins.detach().float().flatten(), tokens.flatten()
    shared = torch.isin(tokens, shared_ids.to(tokens.device))
    ids, inverse = torch.unique(tokens[shared], sorted=True, return_inverse=True)
    sums = torch.zeros(len(ids), dtype=torch.float32, device=margins.device).index_add_(0, inverse, margins[shared])
    counts = torch.bincount(inverse, minlength=len(ids)).float()
    return ids, sums / counts.clamp(min=1), margins[~shared].sort().values


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
    starts (``offsets``, one longer than ``ids``): "was" is matched with how never-seen answers spread "was" (pooled
    over ids, a function word's missing low tail was supplied by name pieces: docs/studies/masc_landing.md)."""
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
    copies: torch.Tensor | None = None,
    copy_margins: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each forget token's never-seen counterpart. Without ``levels``: by rank (:func:`calibrated_thresholds`).
    With ``levels`` (:class:`NeverSeenLevels`) and the tokens' ids (beyond the MASC paper): a token whose id the
    never-seen answers use too ("was", "born", the end of turn) gets that id's never-seen level plus the id's own
    never-seen deviation at the rank of its deviation among this call's tokens of the same id
    (:func:`deviations_by_id`: never-seen answers' shared words are not all equally predictable, and their low tail
    is part of what Min-K% reads); the others (the forget answers' own names and facts) get the never-seen answers'
    own words' margin at their rank among themselves. With ``copies`` (which tokens repeat the prompt) and
    ``copy_margins`` (the never-seen tokens that repeat theirs, ``match_prompt_copies``, beyond the paper): a copy is
    matched by rank with the never-seen copies, and the other tokens as above with the other never-seen tokens."""
    if copies is not None and copy_margins is not None and copy_margins.numel():
        copies = copies.to(margins.device).bool()
        thresholds = torch.empty_like(margins, dtype=torch.float32)
        if bool(copies.any()):
            thresholds[copies] = calibrated_thresholds(margins[copies], copy_margins)
        rest = ~copies
        if bool(rest.any()):
            own_tokens = None if tokens is None else tokens.to(margins.device)[rest]
            thresholds[rest] = matched_thresholds(margins[rest], calibration_margins, own_tokens, levels)
        return thresholds
    if levels is None or tokens is None:
        return calibrated_thresholds(margins, calibration_margins)
    levels = NeverSeenLevels(*levels).to(margins.device)
    tokens = tokens.to(margins.device)
    shared = torch.isin(tokens, levels.ids)
    thresholds = torch.empty_like(margins, dtype=torch.float32)
    if bool(shared.any()):
        groups = torch.searchsorted(levels.ids, tokens[shared])
        shared_levels = levels.values[groups]
        deviations = margins[shared] - shared_levels
        thresholds[shared] = shared_levels + deviations_by_id(deviations, groups, levels.spread, levels.spread_offsets)
    own = calibration_margins if calibration_margins.numel() else levels.values
    if bool((~shared).any()):
        thresholds[~shared] = calibrated_thresholds(margins[~shared], own)
    return thresholds


def calibration_gap(
    margins: torch.Tensor,
    calibration_margins: torch.Tensor,
    tokens: torch.Tensor | None = None,
    levels: NeverSeenLevels | tuple[torch.Tensor, ...] | None = None,
    copies: torch.Tensor | None = None,
    copy_margins: torch.Tensor | None = None,
) -> float:
    """How much more familiar the forget answers look than never-seen ones: the mean, over the forget tokens, of
    ``relu(m_i - c_i)``, each forget margin's excess over its never-seen counterpart (:func:`matched_thresholds`; by
    rank: the sorted margins against the never-seen margins at the same quantiles, a one-sided 1-Wasserstein
    distance between the two margin distributions, in logits; 0 when the forget margins lie at or below never-seen
    data's everywhere)."""
    if margins.numel() == 0:
        return 0.0
    margins = margins.detach().float()
    thresholds = matched_thresholds(margins, calibration_margins, tokens, levels, copies, copy_margins)
    return torch.relu(margins - thresholds).mean().item()


class NeverSeenReference(NamedTuple):
    """What the calibration answers read at one set of weights (beyond the MASC paper): their scored tokens' sorted
    margins (with a token match, those of their own words: :func:`token_levels`), the ``levels`` a forget token whose
    id they use too is matched with (``None`` with ``calibration_match='rank'``), each answer's Min-K% (``min_k``, what
    the membership stop reads), and their violation rate and mean answer probability (recorded); with
    ``match_prompt_copies``, the sorted margins of their tokens that repeat the prompt (``copy_margins``), which
    ``margins`` and ``levels`` then leave out."""

    margins: torch.Tensor
    levels: NeverSeenLevels | None
    min_k: torch.Tensor
    violation_rate: float
    probability: float
    copy_margins: torch.Tensor | None = None

    def gap(self, forget: Any) -> float:
        """:func:`calibration_gap` of one probe set's forget ``margins``, ``tokens`` and ``copies`` against this
        reference."""
        levels = None if self.levels is None else self.levels.to("cpu")
        copy_margins = None if self.copy_margins is None else self.copy_margins.cpu()
        copies = forget.get("copies")
        return calibration_gap(
            forget["margins"], self.margins.cpu(), forget.get("tokens"), levels, copies, copy_margins
        )


def never_seen_reference(
    measured: Any, forget_ids: torch.Tensor, match: str, device: Any, by_copies: bool = False
) -> NeverSeenReference:
    """The :class:`NeverSeenReference` of one measurement of the calibration answers (``measure_violations``'
    result) for forget answers that use the token ids ``forget_ids``, matched by ``match``; ``by_copies``: the tokens
    that repeat the prompt kept apart (``match_prompt_copies``)."""
    margins, tokens, levels, copy_margins = measured["margins"], measured["tokens"], None, None
    if by_copies:
        copies = measured["copies"]
        copy_margins = margins[copies].sort().values.to(device)
        margins, tokens = margins[~copies], tokens[~copies]
    if match == "id_spread":  # the ids the never-seen answers share with the forget set at their own levels
        ids, values, own = token_levels(margins, tokens, forget_ids)
        spread, offsets = spread_by_id(margins, tokens, ids, values)
        levels = NeverSeenLevels(ids, values, spread, offsets).to(device)
        margins = own
    return NeverSeenReference(
        margins=margins.sort().values.to(device),
        levels=levels,
        min_k=measured["min_k"],
        violation_rate=measured["fractions"].mean().item(),
        probability=measured["probabilities"].mean().item(),
        copy_margins=copy_margins,
    )
