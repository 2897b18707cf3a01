"""Token-level scores of a causal LM's logits, read by the objectives, MASC's stop and the evaluation alike: each
answer token's log-probability after the causal shift, Min-K% Prob (Shi et al. 2024, arXiv 2310.16789), TOFU's
answer probability, and MUSE's membership AUC over two sets of scores, with its 95 % interval (DeLong et al. 1988)
alone and as a difference between two models read on the same answers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import mannwhitneyu, norm
from scipy.stats import t as student_t

from .data.examples import IGNORE_INDEX


def upcast_half(values: torch.Tensor) -> torch.Tensor:
    """Half-precision values in float32, anything wider as it is: the reference code upcasts bf16/fp16 logits before
    a softmax or margin (bf16 margins of logits around 20-40 are off by up to 0.15), and a float64 model keeps its
    precision (``.float()`` would round it down to float32)."""
    return values.float() if values.dtype in (torch.float16, torch.bfloat16) else values


def shift_for_causal_lm(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Align causal-LM logits with the tokens they predict: position t scores token t + 1."""
    return logits[..., :-1, :], labels[..., 1:]


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


def membership_auc(forget_scores: Sequence[float], holdout_scores: Sequence[float]) -> float:
    """MUSE's AUC: forget texts labelled 0, holdout texts 1, so ``P(holdout score > forget score) + 1/2 P(tie)`` (the
    Mann-Whitney U statistic over ``n_forget * n_holdout``). Near 0: the forget set is still recognised; 0.5: no
    better than chance."""
    if not forget_scores or not holdout_scores:
        raise ValueError("membership_auc needs at least one forget score and one holdout score.")
    statistic = mannwhitneyu(list(holdout_scores), list(forget_scores), alternative="two-sided").statistic
    return float(statistic) / (len(forget_scores) * len(holdout_scores))


#: The coverage of every membership AUC's interval.
INTERVAL_LEVEL = 0.95

#: The columns that name the unit an answer was drawn with (the author it is about), first found first: answers of one
#: author share its name and familiarity, so intervals resample authors, not answers (:func:`_side_variance`).
GROUP_COLUMNS = ("group", "author")


def groups_of(records: Any) -> list[Any] | None:
    """One group per record (its ``group``, else its ``author``: the first of :data:`GROUP_COLUMNS` every record
    has), or None when they do not all name one: then each answer is its own draw. Takes a ``datasets.Dataset`` (read
    by column) or a sequence of dicts."""
    columns = getattr(records, "column_names", None)
    for column in GROUP_COLUMNS:
        if columns is not None and column in columns:
            return list(records[column])
        if columns is None and len(records) and all(column in record for record in records):
            return [record[column] for record in records]
    return None


def _delong_components(
    forget_scores: Sequence[float], holdout_scores: Sequence[float]
) -> tuple[float, np.ndarray, np.ndarray]:
    """The AUC of :func:`membership_auc` and DeLong's structural components (DeLong, DeLong & Clarke-Pearson 1988):
    for each holdout score the share of forget scores under it (ties half), and for each forget score the share of
    holdout scores over it."""
    holdout = np.asarray(holdout_scores, dtype=np.float64)[:, None]
    forget = np.asarray(forget_scores, dtype=np.float64)[None, :]
    wins = (holdout > forget) + 0.5 * (holdout == forget)
    return float(wins.mean()), wins.mean(axis=1), wins.mean(axis=0)


def _half_width(variance: float, level: float, groups: Sequence[Sequence[Any] | None] = ()) -> float:
    """The interval's half-width: the normal quantile over answers; with groups, Student's t with one less degree of
    freedom than the smaller side's groups (the variance rests on that many draws: at 4 authors a side the normal
    quantile covered 87 % of simulated draws, t with 3 degrees 94 %)."""
    counts = [len(np.unique(np.asarray(g))) for g in groups if g is not None]
    quantile = student_t.ppf(0.5 + level / 2, min(counts) - 1) if counts else norm.ppf(0.5 + level / 2)
    return float(quantile * math.sqrt(max(variance, 0.0)))


def _both_or_neither(forget_groups: Any, holdout_groups: Any) -> tuple[Any, Any]:
    """The groups of both sides, or neither: a side drawn by groups beside one drawn by answers would mix two kinds
    of draw, so then both are read as answers."""
    if forget_groups is None or holdout_groups is None:
        return None, None
    return forget_groups, holdout_groups


def _side_variance(components: np.ndarray, groups: Sequence[Any] | None) -> float:
    """The variance one side's structural ``components`` add to an AUC: DeLong's ``var / n`` over independent
    answers, or, with ``groups`` (the unit each answer was drawn with, e.g. its author), Obuchowski's clustered form
    (Obuchowski 1997, "Nonparametric analysis of clustered ROC curve data", Biometrics 53): the components summed per
    group, so answers that share an author count as one draw. NaN with fewer than two groups."""
    count = len(components)
    if groups is None:
        return float(components.var(ddof=1)) / count
    if len(groups) != count:
        raise ValueError(f"{len(groups)} groups for {count} scores: give one group per answer.")
    _, index = np.unique(np.asarray(groups), return_inverse=True)
    clusters = int(index.max()) + 1
    if clusters < 2:
        return float("nan")
    sums = np.bincount(index, weights=components, minlength=clusters)
    sizes = np.bincount(index, minlength=clusters)
    spread = float(np.sum((sums - sizes * components.mean()) ** 2))
    return clusters / (clusters - 1) * spread / count**2


def _separates_or_ties(by_holdout: np.ndarray, by_forget: np.ndarray) -> bool:
    """Whether every answer's DeLong placement is the same on both sides: the scores separate the two sets perfectly
    (AUC 0 or 1) or tie throughout. DeLong's variance is then zero, a certainty no finite draw gives (another draw of
    as many answers could overlap), so no interval is read from it."""
    return float(np.ptp(by_holdout)) == 0.0 and float(np.ptp(by_forget)) == 0.0


def membership_auc_interval(
    forget_scores: Sequence[float],
    holdout_scores: Sequence[float],
    level: float = INTERVAL_LEVEL,
    forget_groups: Sequence[Any] | None = None,
    holdout_groups: Sequence[Any] | None = None,
) -> tuple[float, float]:
    """The ``level`` interval of :func:`membership_auc` (DeLong's variance, normal approximation, clipped to [0, 1]):
    how far another draw of as many answers of each kind could read. With ``forget_groups`` / ``holdout_groups`` (one
    per answer: the author it is about) the draw is of groups, not answers (:func:`_side_variance`): answers about one
    author share its name and its familiarity, so they are not independent draws; the quantile is then Student's t
    (:func:`_half_width`). NaN with fewer than two answers (or groups) of either kind. Where the scores separate the
    sets perfectly (AUC 0 or 1) the interval has no width (:func:`_separates_or_ties`)."""
    if len(forget_scores) < 2 or len(holdout_scores) < 2:
        return float("nan"), float("nan")
    forget_groups, holdout_groups = _both_or_neither(forget_groups, holdout_groups)
    auc, by_holdout, by_forget = _delong_components(forget_scores, holdout_scores)
    variance = _side_variance(by_holdout, holdout_groups) + _side_variance(by_forget, forget_groups)
    if math.isnan(variance):
        return float("nan"), float("nan")
    half = _half_width(variance, level, (forget_groups, holdout_groups))
    return max(0.0, auc - half), min(1.0, auc + half)


def paired_auc_difference(
    forget_scores: Sequence[float],
    holdout_scores: Sequence[float],
    reference_forget_scores: Sequence[float],
    reference_holdout_scores: Sequence[float],
    level: float = INTERVAL_LEVEL,
    forget_groups: Sequence[Any] | None = None,
    holdout_groups: Sequence[Any] | None = None,
) -> tuple[float, float, float]:
    """``(difference, low, high)``: one model's :func:`membership_auc` minus another's (the never-trained model's),
    both read on the same answers in the same order, with the ``level`` interval of the difference (DeLong's paired
    covariance: answers hard for one model are hard for the other, so the difference is read more finely than
    either AUC; with groups, clustered as :func:`membership_auc_interval` says). NaN interval with fewer than two
    answers (or groups) of either kind, and where both models' scores separate the sets the same way or tie
    throughout (:func:`_separates_or_ties`, the same AUC): both at AUC 1 would otherwise read a difference of 0 with a
    zero-width interval, "lands" for certain, where another draw could overlap for either. Separated the opposite
    ways (AUC 1 against 0) they keep the zero-width difference of 1, which no draw brings within a tolerance. Where
    one model separates them and the other does not, the other's spread gives the interval its width. Two models
    with the same overlapping scores read 0 exactly: that difference is certain."""
    if len(forget_scores) != len(reference_forget_scores) or len(holdout_scores) != len(reference_holdout_scores):
        raise ValueError(
            "paired_auc_difference reads both models on the same answers: the score lists differ in length."
        )
    auc, by_holdout, by_forget = _delong_components(forget_scores, holdout_scores)
    reference, reference_by_holdout, reference_by_forget = _delong_components(
        reference_forget_scores, reference_holdout_scores
    )
    difference = auc - reference
    if len(forget_scores) < 2 or len(holdout_scores) < 2:
        return difference, float("nan"), float("nan")
    forget_groups, holdout_groups = _both_or_neither(forget_groups, holdout_groups)
    variance = _side_variance(by_holdout - reference_by_holdout, holdout_groups) + _side_variance(
        by_forget - reference_by_forget, forget_groups
    )
    degenerate = (
        difference == 0.0
        and _separates_or_ties(by_holdout, by_forget)
        and _separates_or_ties(reference_by_holdout, reference_by_forget)
    )
    if math.isnan(variance) or degenerate:
        return difference, float("nan"), float("nan")
    half = _half_width(variance, level, (forget_groups, holdout_groups))
    return difference, difference - half, difference + half


__all__ = [
    "GROUP_COLUMNS",
    "INTERVAL_LEVEL",
    "answer_probabilities",
    "groups_of",
    "leave_out_final",
    "membership_auc",
    "membership_auc_interval",
    "min_k_count",
    "min_k_per_example",
    "paired_auc_difference",
    "probabilities_of",
    "shift_for_causal_lm",
    "token_log_probs",
    "upcast_half",
]
