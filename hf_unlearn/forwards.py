"""The teacher-forced forward that the probes, the measurement and the start model's logits share: the LM head only
where an answer token is predicted, a batch's shared prefix encoded once, and which models can continue a KV cache.

Every teacher-forced row of a chat model starts with the same tokens (SmolLM2's template puts a ~25-token system
prompt before each question): :func:`forward_after_shared_prefix` runs those once, repeats their keys and values over
the batch, and runs each row's remaining tokens as the continuation, at the positions the full forward gives them.
:func:`answer_logits` puts it together with ``logits_to_keep`` (the LM head from the first predicted answer token
on). Below the objectives and the metrics: it imports nothing of the package but the label convention.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from .data.examples import IGNORE_INDEX

#: A batch's shared leading tokens are run once only when they are at least this many (below, the extra forward
#: call costs more than it saves).
SHARED_PREFIX_MIN_TOKENS = 8


def accepts_logits_to_keep(model: Any) -> bool:
    """Whether the (base) model's forward takes ``logits_to_keep`` (transformers' generative models do)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        return "logits_to_keep" in inspect.signature(base.forward).parameters
    except (TypeError, ValueError):
        return False


def answer_window(labels: torch.Tensor) -> int:
    """The first position whose logits predict an answer token in any row of ``labels`` (B, T): the LM head is
    needed from there on only (``logits_to_keep = T - answer_window(labels)``)."""
    scored = labels != IGNORE_INDEX
    if not bool(scored.any()):
        return 0
    first = int(scored.int().argmax(dim=-1)[scored.any(dim=-1)].min())
    return max(first - 1, 0)


def cache_keyword(model: Any) -> str | None:
    """The keyword the (base) model's forward takes its KV cache under (``cache`` in newer transformers,
    ``past_key_values`` before), when it also takes ``position_ids`` and ``use_cache``; ``None`` otherwise (then
    greedy decoding falls back to transformers' ``generate``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        parameters = set(inspect.signature(base.forward).parameters)
    except (TypeError, ValueError):
        return None
    config = getattr(base, "config", None)  # a plain torch module may have none
    if config is None or getattr(config, "is_encoder_decoder", False):
        return None
    if not {"position_ids", "use_cache"} <= parameters:
        return None
    return next((name for name in ("cache", "past_key_values") if name in parameters), None)


def prompt_cache_keyword(model: Any) -> str | None:
    """The cache keyword (:func:`cache_keyword`) when tokens can be scored as continuations of a KV cache repeated
    over them, else ``None``: a forward that takes no cache or no position ids, a PEFT prompt-learning adapter (prompt
    or prefix tuning: its virtual tokens go before each call), or a cache with a layer that holds
    no per-token keys and values to repeat (a linear-attention or convolution state, which would also run through a
    left-padded prompt's padding; a KV-sharing layer's placeholder)."""
    keyword = cache_keyword(model)
    if keyword is None or getattr(getattr(model, "active_peft_config", None), "is_prompt_learning", False):
        return None  # a prompt-learning adapter puts its own virtual tokens or cache before every call
    from transformers import DynamicCache, cache_utils

    recurrent = getattr(cache_utils, "LinearAttentionCacheLayerMixin", ())
    layers = DynamicCache(config=model.config).layers
    if not all(isinstance(layer, cache_utils.DynamicLayer) and not isinstance(layer, recurrent) for layer in layers):
        return None
    return keyword


def shared_prefix_length(input_ids: torch.Tensor, limit: int) -> int:
    """How many leading tokens every row of ``input_ids`` (B, T) shares, at most ``limit``; 0 when fewer than
    :data:`SHARED_PREFIX_MIN_TOKENS`."""
    limit = min(limit, input_ids.shape[1])
    if input_ids.shape[0] < 2 or limit < SHARED_PREFIX_MIN_TOKENS:
        return 0
    ids = input_ids[:, :limit].cpu().numpy()  # one copy to the host (none for the collator's host copy)
    differing = (ids != ids[:1]).any(axis=0).nonzero()[0]
    length = int(differing[0]) if len(differing) else limit
    return length if length >= SHARED_PREFIX_MIN_TOKENS else 0


def left_padded_positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of a left-padded batch: 0 at each row's first token (and on its padding)."""
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


def forward_after_prompts(
    model: Any,
    keyword: str,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    rows: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    **extra: Any,
) -> torch.Tensor:
    """The logits of right-padded ``input_ids`` (B, T), row ``i`` the continuation of the left-padded prompt
    ``prompt_ids[rows[i]]``: the prompts run once into a ``DynamicCache``, the cache repeated over the rows
    (``reorder_cache``, beam search's own), the continuations run at the positions after their own prompt's tokens
    (absolute position embeddings, GPT-2's, and rotary ones, Llama's and Qwen2's, then see the positions of the full
    sequence). ``extra``: the continuation forward's other keywords (``logits_to_keep``)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    keep_one = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    model(
        input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=left_padded_positions(prompt_mask),
        use_cache=True, **{keyword: cache}, **keep_one,
    )  # fmt: skip
    cache.reorder_cache(rows)
    start = prompt_mask.sum(dim=-1)[rows]
    positions = start[:, None] + torch.arange(input_ids.shape[1], device=input_ids.device)
    return model(
        input_ids=input_ids, attention_mask=torch.cat([prompt_mask[rows], attention_mask], dim=-1),
        position_ids=positions, use_cache=True, **{keyword: cache}, **extra,
    ).logits  # fmt: skip


def forward_after_shared_prefix(
    model: Any, keyword: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int, **extra: Any
) -> torch.Tensor:
    """The logits of right-padded ``input_ids`` (B, T) whose first ``prefix`` tokens are the same in every row (and
    not padding), for the positions from ``prefix`` on (fewer with ``logits_to_keep`` in ``extra``): the prefix is
    the one prompt of :func:`forward_after_prompts`, every row's remaining tokens its continuation."""
    shared = input_ids[:1, :prefix]
    rows = torch.zeros(input_ids.shape[0], dtype=torch.long, device=input_ids.device)
    return forward_after_prompts(
        model, keyword, shared, attention_mask[:1, :prefix], rows, input_ids[:, prefix:], attention_mask[:, prefix:],
        **extra,
    )  # fmt: skip


def answer_logits(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    first: int | None = None,
    prefix: int | None = None,
) -> tuple[torch.Tensor, int]:
    """The logits of a right-padded teacher-forced batch from position ``start`` on, and ``start``: the first
    position whose logits predict an answer token when the model takes ``logits_to_keep`` (the LM head runs from
    there on), else the end of the rows' shared prefix; the shared prefix runs once when the model's cache allows
    (:func:`forward_after_shared_prefix`). ``labels[:, start:]`` aligns with the result as a causal LM's labels
    with its logits. ``first`` (:func:`answer_window`) and ``prefix`` (:func:`shared_prefix_length` up to
    ``first``), when the caller knows them, spare reading the batch back from the device."""
    keep = accepts_logits_to_keep(model)
    first = answer_window(labels) if first is None else first
    keyword = prompt_cache_keyword(model) if first else None
    if keyword is None:
        prefix = 0
    elif prefix is None:
        prefix = shared_prefix_length(input_ids, first)
    start = first if keep else prefix
    extra = {"logits_to_keep": input_ids.shape[1] - start} if keep else {}
    if prefix:
        return forward_after_shared_prefix(model, keyword, input_ids, attention_mask, prefix, **extra), start
    return model(input_ids=input_ids, attention_mask=attention_mask, **extra).logits, start


__all__ = [
    "SHARED_PREFIX_MIN_TOKENS",
    "accepts_logits_to_keep",
    "answer_logits",
    "answer_window",
    "cache_keyword",
    "forward_after_prompts",
    "forward_after_shared_prefix",
    "left_padded_positions",
    "prompt_cache_keyword",
    "shared_prefix_length",
]
