"""The frozen start model's logits where an objective reads them, computed once per example.

KL retain terms, MASC's rival KL, NPO, UNDIAL and the teacher competitors read the start model's logits only where an
answer token is predicted (``labels != -100`` after the causal shift). The start model never changes during a run,
so :class:`StartModelLogits` computes them as cheaply as that allows (the precedent is TRL's
``precompute_ref_log_probs``, which stores the reference's sequence log-probabilities; a KL over the vocabulary needs
more, and storing logits would cost a vocabulary's floats per token):

* the LM head's *input* at each read position (one hidden vector per answer token: 576 floats for SmolLM2-135M,
  4,096 for a 7B Llama, against 49k-128k for its logits) is kept per example in host memory, up to a budget; a
  batch whose every row is kept runs only the LM head. A forget set is seen once per epoch, so from the second
  epoch on the forget rows' start-model forward costs one LM head over the answer tokens;
* a row that is not kept (beyond the budget, or every row when the start model moves) runs in its batch's forward,
  the rows' shared leading tokens (a chat template's system prompt) once and the LM head from the first predicted
  answer token on (:func:`~hf_unlearn.forwards.answer_logits`, the probes' and the measurement's forward).

The returned tensor has the full ``(B, T, V)`` shape the objectives take and zeros where nothing reads it. A row
is kept from a forward of that row alone, so what it is given does not depend on the batch that first brought it
(a resumed run, whose kept inputs start empty, computes the uninterrupted run's values). The kept vectors are used
only after the first row showed that the LM head applied to them gives the forward's logits (a model that
transforms its logits after the head, e.g. Gemma 2's soft-capping, keeps none). What is decided from
the token ids (which rows were seen, where answers start, the shared prefix) is read from the collator's host copy
(:class:`~hf_unlearn.data.pairing.HostCopy`), so a training step reads nothing back from the device for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from transformers.utils import logging

from ..data.examples import IGNORE_INDEX
from ..data.pairing import HostCopy
from ..forwards import answer_logits, shared_prefix_length

logger = logging.get_logger(__name__)


def read_positions(labels: torch.Tensor) -> torch.Tensor:
    """(B, T) bool: the positions whose logits predict an answer token (the causal shift of ``labels != -100``)."""
    read = torch.zeros_like(labels, dtype=torch.bool)
    read[:, :-1] = labels[:, 1:] != IGNORE_INDEX
    return read


@dataclass(frozen=True)
class RowsLayout:
    """What a batch's token ids decide, computed on the host: each row's key (its attended tokens, where they start,
    which positions are read: the start model's logits there depend on nothing else), where each row's attended
    tokens end, the read positions as (row, position) index arrays, the first read position and the rows' shared
    prefix up to it."""

    keys: list[bytes]
    ends: list[int]
    rows: np.ndarray
    positions: np.ndarray
    first: int
    prefix: int

    @classmethod
    def of(cls, host: HostCopy) -> RowsLayout:
        ids, mask, labels = (t.numpy() for t in (host.input_ids, host.attention_mask, host.labels))
        read = np.zeros(labels.shape, dtype=bool)
        read[:, :-1] = labels[:, 1:] != IGNORE_INDEX
        rows, positions = read.nonzero()
        keys, ends = [], []
        for row in range(ids.shape[0]):
            attended = mask[row].astype(bool)
            ends.append(int(attended.nonzero()[0].max()) + 1 if attended.any() else 0)
            digest = hashlib.blake2b(digest_size=16)
            digest.update(ids[row][attended].tobytes())
            digest.update(int(attended.argmax()).to_bytes(8, "little"))
            digest.update(positions[rows == row].tobytes())
            keys.append(digest.digest())
        first = int(positions.min()) if len(positions) else 0
        return cls(keys, ends, rows, positions, first, shared_prefix_length(host.input_ids, first))


def first_read_position(host: HostCopy) -> int:
    """The first position whose logits predict an answer token in any row (0 if none), read from the host copy with
    numpy: no value comes back from the device (:func:`hf_unlearn.forwards.answer_window` on the host)."""
    read = host.labels.numpy()[:, 1:] != IGNORE_INDEX
    columns = read.any(axis=0).nonzero()[0]
    return int(columns[0]) if len(columns) else 0


def host_copy(batch: Mapping[str, Any]) -> HostCopy:
    """The batch's host copy from the collator, or one read back from the device (a batch made elsewhere)."""
    host = batch.get("host_copy")
    if isinstance(host, HostCopy) and host.input_ids.shape == batch["input_ids"].shape:
        return host
    return HostCopy(*(batch[key].detach().cpu() for key in ("input_ids", "attention_mask", "labels")))


class StartModelLogits:
    """Callable ``batch -> logits`` of the frozen start model, exact at every position an answer token is
    predicted (to float tolerance: the LM head over fewer rows may round differently), zeros elsewhere.

    A row's kept head inputs come from a forward of that row alone (its trailing padding cut), so they are the same
    bits whichever batch first brought it: a run resumed from a checkpoint, whose kept inputs start empty, computes
    what the uninterrupted run used. A row beyond the budget runs in the batch's own forward every time (what it
    gives depends on the batch's rows, as a plain forward's does).

    ``reference_mode()``: a context manager that yields the start model (the PEFT model with its adapters off, or
    the separate frozen copy). ``budget_bytes``: host memory for the kept head inputs (0 keeps none).
    ``may_keep``: whether the start model is constant (False for a PEFT model whose trainable parameters include
    base weights the adapters' switch does not turn off). ``may_trim``: whether the forward may differ between
    processes (False for a sharded model, whose processes must run the same forwards; it then runs whole).
    """

    def __init__(
        self,
        reference_mode: Callable[[], AbstractContextManager[nn.Module]],
        budget_bytes: int,
        may_keep: bool = True,
        may_trim: bool = True,
    ) -> None:
        self._reference_mode = reference_mode
        self.budget_bytes = budget_bytes if may_keep and may_trim else 0
        self.may_trim = may_trim
        self.kept: dict[bytes, torch.Tensor] = {}
        self.kept_bytes = 0
        self.verified: bool | None = None  # None until the first row compared head(kept) with its forward
        self.full = False  # the budget was reached: no more rows are kept
        self.forwards = 0  # batches that ran the start model's forward
        self.row_forwards = 0  # single rows that ran it to be kept
        self.head_only = 0  # batches answered from kept head inputs alone

    def __call__(self, batch: Mapping[str, Any]) -> torch.Tensor:
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad(), self._reference_mode() as reference:
            if not self.may_trim:
                self.forwards += 1
                return reference(input_ids=input_ids, attention_mask=attention_mask).logits
            layout = RowsLayout.of(host_copy(batch))
            if self.budget_bytes > 0 and self.verified is not False and not self.full:
                self._keep_new_rows(reference, batch, layout)
            if self.verified and all(key in self.kept for key in layout.keys):
                self.head_only += 1
                return self._from_kept(reference, layout, input_ids.shape[1])
            self.forwards += 1
            logits, first = answer_logits(
                reference, input_ids, attention_mask, batch["labels"], layout.first, layout.prefix
            )
            if not first:
                return logits
            padded = logits.new_zeros(input_ids.shape[0], input_ids.shape[1], logits.shape[-1])
            padded[:, first:] = logits
            return padded

    def _keep_new_rows(self, reference: nn.Module, batch: Mapping[str, Any], layout: RowsLayout) -> None:
        """Run each row not kept yet alone, up to its last attended token, and keep its LM head's inputs at its read
        positions; the first such row checks that the LM head alone gives the forward's logits."""
        head = reference.get_output_embeddings()
        width, item = head.weight.shape[1], head.weight.element_size()
        for row, key in enumerate(layout.keys):
            if key in self.kept:
                continue
            positions = layout.positions[layout.rows == row]
            size = len(positions) * width * item
            if self.kept_bytes + size > self.budget_bytes:
                self.full = True
                logger.info(
                    f"UnlearnTrainer: the start model's kept outputs reached their budget "
                    f"({self.budget_bytes / 2**30:.2f} GiB, reference_cache_gb); rows not kept run the start "
                    "model in each batch."
                )
                return
            vectors = self._row_head_inputs(reference, batch, row, positions, layout.ends[row])
            if vectors is None:
                return
            self.kept[key] = vectors
            self.kept_bytes += size

    def _row_head_inputs(
        self, reference: nn.Module, batch: Mapping[str, Any], row: int, positions: np.ndarray, end: int
    ) -> torch.Tensor | None:
        """One row's LM head inputs at ``positions`` (on the host), or None when the head alone does not give the
        forward's logits (then nothing is kept from here on)."""
        head = reference.get_output_embeddings()
        if not len(positions):
            return head.weight.new_empty(0, head.weight.shape[1], device="cpu")
        captured: list[torch.Tensor] = []
        hook = head.register_forward_hook(lambda _module, args, _output: captured.append(args[0]))
        one = slice(row, row + 1)
        try:
            logits, start = answer_logits(
                reference, batch["input_ids"][one, :end], batch["attention_mask"][one, :end],
                batch["labels"][one, :end], int(positions.min()), 0,
            )  # fmt: skip
        finally:
            hook.remove()
        self.row_forwards += 1
        at = torch.as_tensor(positions - start, device=logits.device)
        vectors = captured[-1][0, at]
        if self.verified is None:
            again = head(vectors).float()
            self.verified = torch.allclose(again, logits[0, at].float(), rtol=_tolerance(logits.dtype), atol=1e-4)
            if not self.verified:
                logger.info(
                    "UnlearnTrainer: the model's LM head does not give its logits alone (it transforms them "
                    "after the head); the start model runs on every batch."
                )
                return None
        return vectors.detach().to("cpu", copy=True)

    def _from_kept(self, reference: nn.Module, layout: RowsLayout, length: int) -> torch.Tensor:
        head = reference.get_output_embeddings()
        device = head.weight.device
        answer_logits = head(torch.cat([self.kept[key] for key in layout.keys]).to(device, non_blocking=True))
        logits = answer_logits.new_zeros(len(layout.keys), length, answer_logits.shape[-1])
        rows = torch.as_tensor(layout.rows, device=device)
        positions = torch.as_tensor(layout.positions, device=device)
        logits[rows, positions] = answer_logits
        return logits


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-4 if dtype in (torch.float32, torch.float64) else 2e-2


def start_model_is_constant(model: nn.Module, separate_reference: bool) -> bool:
    """Whether the start model stays what it was: a separate frozen copy, or a PEFT model whose trainable
    parameters are all its adapters' (``bias="all"`` or a trained base weight would move the model the adapters'
    switch returns to)."""
    if separate_reference:
        return True
    names = tuple(f".{name}." for name in getattr(model, "peft_config", {}) or ())
    trainable: Iterator[str] = (name for name, p in model.named_parameters() if p.requires_grad)
    return bool(names) and all(any(tag in name for tag in names) for name in trainable)


__all__ = ["RowsLayout", "StartModelLogits", "host_copy", "read_positions", "start_model_is_constant"]
