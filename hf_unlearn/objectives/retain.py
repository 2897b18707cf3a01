"""The retain terms: the answer NLL on retain examples and the token-mean KL(p_theta0 || p_theta) to the frozen start
model on retain answer tokens (MASC's retain term, arXiv 2606.02920 §3)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..data.examples import IGNORE_INDEX
from ..scores import shift_for_causal_lm, upcast_half
from .masc.loss import MASC_PAPER
from .registry import LossInputs, Paper, answer_nll, mean_over_items, register_retain_objective, require_answer_tokens


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
    require_answer_tokens(mask, inputs)
    # Selecting the answer positions costs one device sync, and keeps the vocabulary-sized softmax to them.
    log_p = F.log_softmax(upcast_half(logits[mask]), dim=-1)
    log_p_ref = F.log_softmax(upcast_half(reference[mask]), dim=-1)
    return mean_over_items(F.kl_div(log_p, log_p_ref, log_target=True, reduction="sum"), mask.sum(), inputs)
