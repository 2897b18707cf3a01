"""The established forget objectives: gradient ascent, NPO (arXiv 2404.05868), SimNPO (arXiv 2410.07163), IdkDPO (DPO
with refusals as the chosen answer), UNDIAL (arXiv 2402.10052) and RMU (WMDP, arXiv 2403.03218)."""

from __future__ import annotations

import re
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
    log_ratio,
    mean_over_items,
    objective_hyperparameters,
    preference_margin,
    register_forget_objective,
    register_retain_objective,
    require_answer_tokens,
)

logger = logging.get_logger(__name__)


@register_forget_objective(
    "ga",
    paper=Paper(
        "Knowledge Unlearning for Mitigating Privacy Risks in Language Models",
        "https://arxiv.org/abs/2210.01504",
        "Jang et al.",
    ),
    methods={"ga": "none", "graddiff": "nll"},
)
def gradient_ascent_loss(inputs: LossInputs) -> torch.Tensor:
    """``-NLL_f``: minimising it raises the NLL of the forget answers (gradient ascent; TOFU, arXiv 2401.06121)."""
    return -answer_nll(inputs)


@register_forget_objective(
    "npo",
    paper=Paper("Negative Preference Optimization", "https://arxiv.org/abs/2404.05868", "Zhang, Lin, Bai, Mei"),
    needs_reference=True,
    hyperparameters={"beta": 0.1},
    check=check_bounds(positive=("beta",)),
    normalized_by="sequences",
    methods={"npo": "none", "npo_klr": "kl"},
)
def npo_loss(inputs: LossInputs) -> torch.Tensor:
    """``-(2/beta) mean log sigmoid(-beta (log pi(y|x) - log pi_ref(y|x)))`` with sequence-summed log ratios.

    NPO (arXiv 2404.05868, eq. 3), ``beta`` 0.1 (``forget_loss_kwargs``).
    """
    beta = inputs.hyperparameters["beta"]
    require_answer_tokens(inputs.labels != IGNORE_INDEX, inputs)
    losses = -(2.0 / beta) * F.logsigmoid(-beta * log_ratio(inputs))
    return mean_over_items(losses.sum(), losses.numel(), inputs)


@register_forget_objective(
    "simnpo",
    paper=Paper(
        "Simplicity Prevails: Rethinking Negative Preference Optimization for LLM Unlearning",
        "https://arxiv.org/abs/2410.07163",
        "Fan et al.",
    ),
    hyperparameters={"beta": 4.5, "delta": 0.0},
    check=check_bounds(positive=("beta",)),
    normalized_by="sequences",
    methods={"simnpo": "nll"},
    forget_weight=0.125,  # SimNPO's gamma (arXiv 2410.07163)
)
def simnpo_loss(inputs: LossInputs) -> torch.Tensor:
    """``-(2/beta) mean log sigmoid(beta (NLL(y|x)/|y| - delta))``: length-normalised NPO without a reference.

    SimNPO (arXiv 2410.07163, eq. 4), ``beta`` 4.5 and ``delta`` 0 (``forget_loss_kwargs``).
    """
    beta, delta = inputs.hyperparameters["beta"], inputs.hyperparameters["delta"]
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    require_answer_tokens(mask, inputs)
    lengths = mask.sum(-1).clamp(min=1)
    mean_nll = -log_probs.sum(-1) / lengths
    losses = -(2.0 / beta) * F.logsigmoid(beta * (mean_nll - delta))
    return mean_over_items(losses.sum(), losses.numel(), inputs)


@register_forget_objective(
    "idk_dpo",
    paper=Paper(
        "TOFU: A Task of Fictitious Unlearning for LLMs (IdkDPO)", "https://arxiv.org/abs/2401.06121", "Maini et al."
    ),
    needs_reference=True,
    hyperparameters={"beta": 0.1},
    check=check_bounds(positive=("beta",)),
    normalized_by="sequences",
    needs_refusal=True,
    methods={"idk_dpo": "nll"},
)
def idk_dpo_loss(inputs: LossInputs) -> torch.Tensor:
    """DPO with the refusal as the chosen answer and the forget answer as the rejected one.

    ``-mean log sigmoid(beta [(log pi(y_idk) - log pi_ref(y_idk)) - (log pi(y) - log pi_ref(y))])``, ``beta`` 0.1
    (``forget_loss_kwargs``), sequence-summed log-probabilities, the refusals from ``config.refusal_answers``.
    open-unlearning scales this loss by 2/beta; we keep DPO's own scale.
    """
    losses = -F.logsigmoid(inputs.hyperparameters["beta"] * preference_margin(inputs))
    return mean_over_items(losses.sum(), losses.numel(), inputs)


@register_forget_objective(
    "undial",
    paper=Paper(
        "UNDIAL: Self-Distillation with Adjusted Logits for Robust Unlearning in Large Language Models",
        "https://arxiv.org/abs/2402.10052",
        "Dong et al.",
    ),
    needs_reference=True,
    hyperparameters={"beta": 10.0},
    methods={"undial": "nll"},
)
def undial_loss(inputs: LossInputs) -> torch.Tensor:
    """Cross-entropy to ``softmax(z_ref - beta * onehot(y))`` on the answer tokens, ``beta`` 10
    (``forget_loss_kwargs``).

    UNDIAL (arXiv 2402.10052, §3): the frozen model's distribution with the target token's logit lowered.
    open-unlearning averages over every position (prompt and padding too); we average over answer tokens.
    """
    logits, labels = shift_for_causal_lm(inputs.logits, inputs.labels)
    reference, _ = shift_for_causal_lm(inputs.reference_logits, inputs.labels)
    mask = labels != IGNORE_INDEX
    require_answer_tokens(mask, inputs)
    # Selecting the answer positions costs one device sync, and keeps the vocabulary-sized softmax to them.
    answer_labels = labels[mask].unsqueeze(-1)
    reference_answers = upcast_half(reference[mask])
    lowered = torch.full(
        answer_labels.shape, -inputs.hyperparameters["beta"], device=logits.device, dtype=reference_answers.dtype
    )
    adjusted = reference_answers.scatter_add(-1, answer_labels, lowered)
    target = F.softmax(adjusted, dim=-1)
    cross_entropy = -(target * F.log_softmax(upcast_half(logits[mask]), dim=-1)).sum(-1)
    return mean_over_items(cross_entropy.sum(), cross_entropy.numel(), inputs)


def _rmu_hidden(hidden_states: tuple[torch.Tensor, ...], layer: int) -> torch.Tensor:
    return hidden_states[layer + 1]  # hidden_states[0] is the embedding output


def _masked_squared_error(hidden: torch.Tensor, target: torch.Tensor, inputs: LossInputs) -> torch.Tensor:
    """Per attended token, the mean squared error across the hidden dimension; averaged over attended tokens."""
    per_token = (upcast_half(hidden) - upcast_half(target)).pow(2).mean(-1)
    mask = inputs.attention_mask.to(per_token.dtype)
    return mean_over_items((per_token * mask).sum(), mask.sum(), inputs)


def rmu_layers(model: Any, layer: int | None, trainable_layers: list[int] | None) -> tuple[int, list[int]]:
    """RMU's steered layer and the layers whose MLP weights train, the defaults chosen for ``model`` (layer 7, or
    the second-to-last of a smaller model; the steered layer and the two before it), refused by name when the model
    cannot have them.

    ``output_hidden_states`` gives the output of decoder layer l as ``hidden_states[l + 1]`` for every layer but
    the last, whose entry is taken after the model's final norm (Llama, Qwen2, GPT-2 alike), so the last layer
    cannot be steered this way and is refused.
    """
    num_layers = model.config.get_text_config().num_hidden_layers
    if num_layers < 2:
        raise ValueError(
            f"RMU steers the output of a decoder layer below the last one, and {type(model).__name__} has "
            f"{num_layers} layer: use a model with at least 2 layers or another method."
        )
    if layer is None:
        layer = min(7, num_layers - 2)
        logger.warning(
            f"RMU: forget_loss_kwargs['layer'] was not set; steering decoder layer {layer} (of 0..{num_layers - 1})."
        )
    if not 0 <= layer < num_layers:
        raise ValueError(f"RMU layer={layer} but the model has {num_layers} layers (0..{num_layers - 1}).")
    if layer == num_layers - 1:
        raise ValueError(
            f"RMU layer={layer} is the last decoder layer, whose hidden state the model only returns after its final "
            f"norm, so RMU would steer the normalised output instead of the layer's. Choose a layer between 0 and "
            f"{num_layers - 2}."
        )
    if trainable_layers is None:
        trainable_layers = [i for i in range(layer - 2, layer + 1) if i >= 0]
        logger.warning(f"RMU: training the MLP weights of layers {trainable_layers} (trainable_layers).")
    return layer, list(trainable_layers)


def _select_rmu_parameters(model: Any, config: Any) -> None:
    """RMU trains only the MLP weights of a few layers (arXiv 2403.03218, §5); freeze everything else. The layers
    chosen for the model (:func:`rmu_layers`) are written into ``config.forget_loss_kwargs``, so the losses, the run
    record and the model card read the values used."""
    if hasattr(model, "peft_config"):
        raise ValueError("RMU chooses which MLP weights train itself; pass the base model without a PEFT wrapper.")
    values = objective_hyperparameters(config, "forget")
    layer, trainable = rmu_layers(model, values["layer"], values["trainable_layers"])
    # A new dict: the trainer's configuration is a copy of the caller's, which keeps its own kwargs.
    config.forget_loss_kwargs = {**(config.forget_loss_kwargs or {}), "layer": layer, "trainable_layers": trainable}
    pattern = re.compile(r"\.(?:layers|h|blocks)\.(" + "|".join(map(str, trainable)) + r")\.mlp\.")
    selected = 0
    for name, param in model.named_parameters():
        param.requires_grad_(bool(pattern.search(name)))
        selected += int(param.requires_grad)
    if selected == 0:
        raise ValueError(
            f"RMU found no MLP weights of layers {trainable} in {type(model).__name__} "
            "(looked for '.layers.N.mlp.' / '.h.N.mlp.'); set forget_loss_kwargs['trainable_layers']."
        )


def _check_rmu(values: Any, option: str) -> None:
    """RMU's layers are layer indices (None: chosen for the model)."""
    layer, trainable = values.get("layer"), values.get("trainable_layers")
    if layer is not None and (isinstance(layer, bool) or not isinstance(layer, int)):
        raise ValueError(f"{option}['layer'] must be a decoder layer index (an int) or None, got {layer!r}.")
    if trainable is not None and (
        not isinstance(trainable, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in trainable)
    ):
        raise ValueError(f"{option}['trainable_layers'] must be a list of layer indices or None, got {trainable!r}.")


RMU_PAPER = Paper(
    "The WMDP Benchmark: Measuring and Reducing Malicious Use With Unlearning (RMU)",
    "https://arxiv.org/abs/2403.03218",
    "Li et al.",
)


@register_forget_objective(
    "rmu",
    paper=RMU_PAPER,
    hyperparameters={"layer": None, "trainable_layers": None, "steering_coefficient": 6.5},
    shared=("layer",),
    check=_check_rmu,
    normalized_by="attended_tokens",
    needs_hidden_states=True,
    prepare=_select_rmu_parameters,
    methods={"rmu": "rmu_retain"},
)
def rmu_forget_loss(inputs: LossInputs) -> torch.Tensor:
    """``MSE(h_l(x_forget), c * u)``: steer layer l's activations on forget inputs to a fixed random direction.

    RMU (arXiv 2403.03218, §5): u is a random unit vector fixed for the run (seeded), c = ``steering_coefficient``
    (6.5), l = ``layer`` (``forget_loss_kwargs``; None: chosen for the model when the trainer is built). Averaged over
    every attended token (prompt included), as the WMDP reference does; open-unlearning's TOFU variant uses answer
    tokens.
    """
    hidden = _rmu_hidden(inputs.hidden_states, inputs.hyperparameters["layer"])
    direction = rmu_direction(hidden.shape[-1], inputs.config.seed, hidden.device)
    target = (inputs.hyperparameters["steering_coefficient"] * direction).expand_as(hidden)
    return _masked_squared_error(hidden, target, inputs)


@register_retain_objective(
    "rmu_retain",
    paper=RMU_PAPER,
    needs_reference=True,
    hyperparameters={"layer": None},
    shared=("layer",),
    check=_check_rmu,
    normalized_by="attended_tokens",
    needs_hidden_states=True,
)
def rmu_retain_loss(inputs: LossInputs) -> torch.Tensor:
    """RMU retain term: MSE to the frozen model's layer-l activations on retain inputs (arXiv 2403.03218, §5); the
    ``layer`` is the forget term's (a shared hyperparameter)."""
    layer = inputs.hyperparameters["layer"]
    hidden = _rmu_hidden(inputs.hidden_states, layer)
    target = _rmu_hidden(inputs.reference_hidden_states, layer)
    return _masked_squared_error(hidden, target, inputs)


def rmu_direction(size: int, seed: int, device: torch.device) -> torch.Tensor:
    """The fixed random unit vector u of RMU (uniform in [0, 1) then normalised, as in the reference code)."""
    generator = torch.Generator().manual_seed(seed)
    direction = torch.rand(size, generator=generator)
    return (direction / direction.norm()).to(device)
