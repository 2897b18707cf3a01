"""Gradient surgery inside Trainer's step: the forget gradient kept apart from ``p.grad`` over the accumulation window,
and combined with the retain gradient in place at the window's last micro-batch, before Trainer clips and steps.

Each part's backward runs through Trainer's own ``training_step`` (so DDP all-reduces both); the forget gradient is
swapped in and out of ``p.grad`` around its backward. Under FSDP2 the gradients are DTensor shards: they are combined
shard by shard with the dot products summed across processes (:func:`~hf_unlearn.surgery.combine.local_shards`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .combine import combine_gradients_, local_shards


class SurgeryBuffers:
    """The forget gradients of the current window (one per trainable parameter) and the surgery statistics summed
    since Trainer's last log. ``params`` is passed at every call: the trainer binds them lazily (FSDP2 replaces
    them with sharded ones when the model is prepared)."""

    def __init__(self, strategy: str, forget_weight: float, retain_weight: float, with_stats: bool) -> None:
        self.strategy = strategy
        self.forget_weight = forget_weight
        self.retain_weight = retain_weight
        # The statistics cost a few passes over the gradients; they only serve Trainer's logs.
        self.with_stats = with_stats
        self.stored: list[torch.Tensor | None] = []
        self.sums: dict[str, torch.Tensor | float] = {}
        self.steps = 0

    def reset(self, num_params: int) -> None:
        self.stored = [None] * num_params

    def swap(self, params: Sequence[torch.Tensor]) -> None:
        """Exchange ``p.grad`` and the stored forget gradient (before and after the forget part's backward)."""
        for i, param in enumerate(params):
            param.grad, self.stored[i] = self.stored[i], param.grad

    def combine(self, params: Sequence[torch.Tensor]) -> None:
        """Write the combined update into ``p.grad`` (which holds the retain gradient) with gamma = forget weight and
        alpha = retain weight (arXiv 2604.14808 §3); zero the forget store for the next window."""
        forget_grads, retain_grads, reduce_sum = local_shards(self.stored, [p.grad for p in params])
        updates, stats = combine_gradients_(
            forget_grads,
            retain_grads,
            self.strategy,
            forget_weight=self.forget_weight,
            retain_weight=self.retain_weight,
            with_stats=self.with_stats,
            reduce_sum=reduce_sum,
        )
        for param, update in zip(params, updates):
            if update is None:
                continue
            if reduce_sum is None:
                param.grad = update
            elif param.grad is None:  # no retain gradient: the update is a new local shard of the parameter's layout
                param.grad = type(param).from_local(
                    update, param.device_mesh, param.placements, shape=param.shape, stride=param.stride()
                )
        # The forget tensors were consumed by the combination; zero them and keep them as the next window's
        # accumulators: a memset is cheaper than a fresh full-size allocation (and its page faults) every step.
        for stored in self.stored:
            if stored is not None:
                stored.zero_()
        for key, value in stats.items():
            self.sums[key] = self.sums.get(key, 0) + value
        self.steps += 1

    def read_means(self) -> dict[str, float]:
        """The statistics' means since the last read (``surgery/<name>`` in Trainer's logs), then cleared."""
        means = {f"surgery/{key}": float(total) / self.steps for key, total in self.sums.items()} if self.steps else {}
        self.sums.clear()
        self.steps = 0
        return means
