"""The KV cache as the measurement uses it: which models can continue one, and a batch's shared prefix encoded once.

Every teacher-forced row of a chat model starts with the same tokens (SmolLM2's template puts a ~30-token system
prompt before each question): :func:`forward_after_shared_prefix` runs those once, repeats their keys and values over
the batch, and runs each row's remaining tokens as the continuation, at the positions the full forward gives them.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

#: A batch's shared leading tokens are run once only when they are at least this many (below, the extra forward
#: call costs more than it saves).
SHARED_PREFIX_MIN_TOKENS = 8


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
    over them, else ``None``: a forward that takes no cache or no position ids, or a cache with a layer that holds
    no per-token keys and values to repeat (a linear-attention or convolution state, which would also run through a
    left-padded prompt's padding; a KV-sharing layer's placeholder)."""
    keyword = cache_keyword(model)
    if keyword is None:
        return None
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
    differing = (input_ids[:, :limit] != input_ids[:1, :limit]).any(dim=0).nonzero()
    length = int(differing[0]) if len(differing) else limit
    return length if length >= SHARED_PREFIX_MIN_TOKENS else 0


def forward_after_shared_prefix(
    model: Any, keyword: str, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix: int, **extra: Any
) -> torch.Tensor:
    """The logits of right-padded ``input_ids`` (B, T) whose first ``prefix`` tokens are the same in every row (and
    not padding), for the positions from ``prefix`` on (fewer with ``logits_to_keep`` in ``extra``): the prefix run
    once (one row) into a ``DynamicCache``, the cache repeated over the rows, the rest run as its continuation at
    positions ``prefix, prefix + 1, ...`` (what the full forward gives right-padded rows)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    keep_one = {"logits_to_keep": 1} if "logits_to_keep" in extra else {}
    model(input_ids=input_ids[:1, :prefix], use_cache=True, **{keyword: cache}, **keep_one)
    rows = input_ids.shape[0]
    cache.reorder_cache(torch.zeros(rows, dtype=torch.long, device=input_ids.device))
    positions = torch.arange(prefix, input_ids.shape[1], device=input_ids.device).expand(rows, -1)
    return model(
        input_ids=input_ids[:, prefix:], attention_mask=attention_mask, position_ids=positions, use_cache=True,
        **{keyword: cache}, **extra,
    ).logits  # fmt: skip


__all__ = [
    "SHARED_PREFIX_MIN_TOKENS",
    "cache_keyword",
    "forward_after_shared_prefix",
    "prompt_cache_keyword",
    "shared_prefix_length",
]
