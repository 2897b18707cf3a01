"""Pairing forget with retain batches for the trainer: padding, the paired dataset and its collator, the held-out
split, the refusal or alternative answers of preference objectives, continuation scoring (MASC's MUSE setting) and
the unit counts objectives are averaged over."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .examples import IGNORE_INDEX


def continuation_labels(
    labels: Sequence[int], cut_ratio: float, min_prefix_tokens: int, min_suffix_tokens: int
) -> list[int]:
    """Labels that score only the continuation of a forget text: the first ``cut`` scored tokens become ``-100``.

    ``cut = floor(cut_ratio * n)`` for the ``n`` scored tokens, clamped to ``[min_prefix_tokens, n -
    min_suffix_tokens]``; a text with fewer than ``min_prefix_tokens + min_suffix_tokens`` scored tokens keeps
    every one. This is the continuation mode of the MASC reference code's MUSE runs (Di Gennaro et al., arXiv
    2606.02920; reference flag ``--forget_penalty_mode continuation`` with ``--continuation_cut_min_ratio``,
    ``--continuation_cut_max_ratio``, ``--continuation_min_prefix_tokens``, ``--continuation_min_suffix_tokens``):
    the prefix is context, only the continuation enters the hinge and the violation rate.
    """
    # Position 0 is never predicted (causal shift), whatever its label: count only tokens the model scores, as the
    # reference counts shifted target positions.
    scored = [i for i, label in enumerate(labels) if label != IGNORE_INDEX and i > 0]
    if len(scored) < min_prefix_tokens + min_suffix_tokens:
        return list(labels)
    cut = max(min_prefix_tokens, min(math.floor(cut_ratio * len(scored)), len(scored) - min_suffix_tokens))
    masked = list(labels)
    for position in scored[:cut]:
        masked[position] = IGNORE_INDEX
    return masked


#: ``forget_scoring_kwargs`` of ``forget_scoring='continuation'`` and their defaults: the MASC reference code's
#: ``--continuation_cut_min_ratio``, ``--continuation_cut_max_ratio``, ``--continuation_min_prefix_tokens`` and
#: ``--continuation_min_suffix_tokens`` (arXiv 2606.02920).
CONTINUATION_DEFAULTS: dict[str, float | int] = {
    "cut_min_ratio": 0.2,
    "cut_max_ratio": 0.6,
    "min_prefix_tokens": 32,
    "min_suffix_tokens": 32,
}


def continuation_options(given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The continuation cut's options: :data:`CONTINUATION_DEFAULTS` updated with ``given`` (a config's
    ``forget_scoring_kwargs``); an unknown key or a value out of range is refused by name."""
    unknown = sorted(set(given or {}) - set(CONTINUATION_DEFAULTS))
    if unknown:
        raise ValueError(
            f"forget_scoring_kwargs has {unknown}, which continuation scoring does not take; its options are "
            f"{CONTINUATION_DEFAULTS} (the defaults)."
        )
    options = {**CONTINUATION_DEFAULTS, **(given or {})}
    if not 0.0 <= options["cut_min_ratio"] <= options["cut_max_ratio"] <= 1.0:
        raise ValueError(
            "forget_scoring_kwargs: cut_min_ratio and cut_max_ratio must satisfy 0 <= min <= max <= 1, got "
            f"{options['cut_min_ratio']} and {options['cut_max_ratio']}."
        )
    if options["min_prefix_tokens"] < 0 or options["min_suffix_tokens"] < 1:
        raise ValueError(
            "forget_scoring_kwargs: min_prefix_tokens must be >= 0 and min_suffix_tokens >= 1, got "
            f"{options['min_prefix_tokens']} and {options['min_suffix_tokens']}."
        )
    return options


@dataclass(frozen=True)
class ContinuationScoring:
    """Where each forget example is cut under ``forget_scoring="continuation"`` (see :func:`continuation_labels`).

    The MASC reference draws the cut ratio uniformly in ``[min_ratio, max_ratio]`` each time a batch is scored and
    uses a fixed, hashed one for its probes; here the draw is seeded by (seed, example, epoch), so a resumed run
    sees the same cuts, and a probe (``epoch=None``) cuts each example at one place for the whole run. Disabled, it
    returns examples unchanged.
    """

    enabled: bool = False
    min_ratio: float = 0.2
    max_ratio: float = 0.6
    min_prefix_tokens: int = 32
    min_suffix_tokens: int = 32
    seed: int = 0

    @classmethod
    def from_config(cls, config: Any, seed: int = 0) -> ContinuationScoring:
        """The cut of ``config.forget_scoring_kwargs`` (:func:`continuation_options`)."""
        options = continuation_options(config.forget_scoring_kwargs)
        return cls(
            enabled=config.forget_scoring == "continuation",
            min_ratio=options["cut_min_ratio"],
            max_ratio=options["cut_max_ratio"],
            min_prefix_tokens=options["min_prefix_tokens"],
            min_suffix_tokens=options["min_suffix_tokens"],
            seed=seed,
        )

    def cut_ratio(self, index: int, epoch: int | None = None) -> float:
        return random.Random(f"{self.seed}:{index}:{epoch}").uniform(self.min_ratio, self.max_ratio)

    def __call__(self, example: Mapping[str, Any], index: int, epoch: int | None = None) -> dict[str, Any]:
        if not self.enabled:
            return dict(example)
        labels = continuation_labels(
            example["labels"], self.cut_ratio(index, epoch), self.min_prefix_tokens, self.min_suffix_tokens
        )
        return {**example, "labels": labels}


def pad_examples(examples: Sequence[Mapping[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``input_ids`` (with the pad id), ``attention_mask`` (0) and ``labels`` (-100) to one length."""
    length = max(len(e["input_ids"]) for e in examples)
    batch: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        ids = list(e["input_ids"])
        mask = list(e.get("attention_mask") or [1] * len(ids))
        labels = list(e["labels"]) if "labels" in e else list(ids)
        gap = length - len(ids)
        batch["input_ids"].append(ids + [pad_token_id] * gap)
        batch["attention_mask"].append(mask + [0] * gap)
        batch["labels"].append(labels + [IGNORE_INDEX] * gap)
    return {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}


@dataclass(frozen=True)
class HostCopy:
    """A padded batch's token ids, attention mask and labels as the collator made them, on the host. Trainer and
    accelerate move a batch's tensors to the device but leave this object as it is, so what is decided from the
    token ids (which rows were seen before, where the answers start) costs no read back from the device."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    labels: torch.Tensor


class ForgetRetainCollator:
    """Collate items of :class:`ForgetRetainDataset` into ``{"forget": batch, "retain": batch}``.

    Each side is padded with :func:`pad_examples`, or with ``inner`` (any Trainer data collator) when given, and
    carries its :class:`HostCopy` under ``"host_copy"``.
    """

    def __init__(self, pad_token_id: int, inner: Any = None) -> None:
        self.pad_token_id = pad_token_id
        self.inner = inner

    def _collate(self, examples: list[Mapping[str, Any]]) -> dict[str, Any]:
        batch: dict[str, Any] = (
            dict(self.inner(examples)) if self.inner is not None else pad_examples(examples, self.pad_token_id)
        )
        tensors = [batch.get(key) for key in MODEL_INPUT_KEYS]
        if all(isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.dim() == 2 for t in tensors):
            batch["host_copy"] = HostCopy(*tensors)
        return batch

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, torch.Tensor]]:
        batch = {"forget": self._collate([e["forget"] for e in examples])}
        for side in ("retain", "refusal"):
            if examples[0].get(side) is not None:
                batch[side] = self._collate([e[side] for e in examples])
        return batch


MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "labels")


def model_inputs(example: Mapping[str, Any]) -> dict[str, list[int]]:
    """Keep only what the model reads, dropping text columns such as ``question``."""
    return {k: example[k] for k in MODEL_INPUT_KEYS if k in example}


class ForgetRetainDataset(torch.utils.data.Dataset):
    """Each item is one forget example paired with one retain example.

    The epoch runs over the forget examples (what Trainer would have trained on). Retain examples are paired
    through a seeded permutation, offset by ``epoch * len(forget)`` (see :meth:`set_epoch`), so the pairing is
    deterministic (a resumed run sees the same pairs) and still walks through a retain set larger than the
    forget set over the epochs.
    """

    def __init__(
        self,
        forget: Sequence[Mapping[str, Any]],
        retain: Sequence[Mapping[str, Any]] | None,
        seed: int = 0,
        refusal: Sequence[Mapping[str, Any]] | None = None,
        forget_labels: Callable[[dict[str, Any], int, int], dict[str, Any]] | None = None,
    ):
        self.forget = forget
        self.retain = retain
        self.refusal = refusal
        self.forget_labels = forget_labels
        if retain is not None and len(retain) > 0:
            generator = torch.Generator().manual_seed(seed)
            self._retain_order = torch.randperm(len(retain), generator=generator).tolist()
        else:
            self._retain_order = []
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.forget)

    def __getitem__(self, index: int) -> dict[str, Any]:
        forget = model_inputs(self.forget[index])
        if self.forget_labels is not None:
            forget = self.forget_labels(forget, index, self.epoch)
        item: dict[str, Any] = {"forget": forget, "retain": None}
        if self.refusal is not None:
            item["refusal"] = model_inputs(self.refusal[index])
        if self._retain_order:
            item["retain"] = model_inputs(
                self.retain[self._retain_order[(index + self.epoch * len(self.forget)) % len(self._retain_order)]]
            )
        return item


def split_holdout(num_examples: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Split forget indices into (trained, held out); the held-out part is never put in a training batch.

    The split depends only on ``seed``, so every process of a distributed run holds the same one.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {fraction}.")
    num_holdout = round(num_examples * fraction)
    if fraction > 0 and num_holdout == 0:
        num_holdout = 1
    if num_holdout >= num_examples:
        raise ValueError(
            f"The forget set has {num_examples} examples, too few to hold out {fraction:.0%} for the stopping "
            "probe and still train on the rest. Add forget examples, lower holdout_fraction or use stop_probe='train'."
        )
    order = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[num_holdout:]), sorted(order[:num_holdout])


def refusal_example(tokenizer: Any, example: Mapping[str, Any], refusal: str) -> dict[str, list[int]]:
    """The forget example's prompt followed by a refusal instead of its answer (IdkDPO's chosen answer)."""
    labels = list(example["labels"])
    answer_start = next(i for i, label in enumerate(labels) if label != IGNORE_INDEX)
    prompt = list(example["input_ids"][:answer_start])
    answer = list(tokenizer(" " + refusal, add_special_tokens=False)["input_ids"])
    if tokenizer.eos_token_id is not None:
        answer.append(tokenizer.eos_token_id)
    return {
        "input_ids": prompt + answer,
        "attention_mask": [1] * (len(prompt) + len(answer)),
        "labels": [IGNORE_INDEX] * len(prompt) + answer,
    }


def count_items(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``[answer tokens, sequences, attended tokens]`` of one padded batch (the units objectives are averaged
    over, see :data:`hf_unlearn.objectives.NORMALIZATIONS`); answer tokens counted after the causal shift."""
    labels = batch["labels"]
    answer_tokens = (labels[..., 1:] != IGNORE_INDEX).sum()
    attended = batch["attention_mask"].sum() if "attention_mask" in batch else torch.tensor(labels.numel())
    return torch.stack(
        [answer_tokens, torch.tensor(labels.shape[0], device=labels.device), attended.to(labels.device)]
    )


def window_counts(
    batch_samples: Sequence[Mapping[str, Any]], device: Any, parts: Sequence[str] = ("forget", "retain")
) -> dict[str, torch.Tensor] | None:
    """:func:`count_items` of each part summed over one accumulation window's micro-batches (``None`` for none)."""
    if not batch_samples:
        return None
    return {
        part: sum(count_items(batch[part]).to(device) for batch in batch_samples)
        for part in parts
        if part in batch_samples[0]
    }
