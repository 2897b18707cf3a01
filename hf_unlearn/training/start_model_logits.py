"""The frozen start model's logits where an objective reads them, computed once per example.

KL retain terms, MASC's rival KL, NPO, UNDIAL and the teacher competitors read the start model's logits only where an
answer token is predicted (``labels != -100`` after the causal shift). The start model never changes during a run,
so :class:`StartModelLogits` computes them as cheaply as that allows (the precedent is TRL's
``precompute_ref_log_probs``, which stores the reference's sequence log-probabilities; a KL over the vocabulary needs
more, and storing logits would cost a vocabulary's floats per token):

* the rows' shared leading tokens (a chat template's system prompt) run once and the LM head runs from the first
  predicted answer token on (:func:`~hf_unlearn.forwards.answer_logits`, the probes' and the measurement's
  forward);
* the LM head's *input* at each read position (one hidden vector per answer token: 576 floats for SmolLM2-135M,
  4,096 for a 7B Llama, against 49k-128k for its logits) is kept per example in host memory, up to a budget; when a
  batch's every row was seen before, only the LM head runs. A forget set is seen once per epoch, so from the second
  epoch on the forget rows' start-model forward costs one LM head over the answer tokens.

The returned tensor has the full ``(B, T, V)`` shape the objectives take and zeros where nothing reads it. The
kept vectors are used only after the first batch showed that the LM head applied to them gives the forward's logits
(a model that transforms its logits after the head, e.g. Gemma 2's soft-capping, keeps none). What is decided from
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
    which positions are read: the start model's logits there depend on nothing else), the read positions as
    (row, position) index arrays, the first read position and the rows' shared prefix up to it."""

    keys: list[bytes]
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
        keys = []
        for row in range(ids.shape[0]):
            attended = mask[row].astype(bool)
            digest = hashlib.blake2b(digest_size=16)
            digest.update(ids[row][attended].tobytes())
            digest.update(int(attended.argmax()).to_bytes(8, "little"))
            digest.update(positions[rows == row].tobytes())
            keys.append(digest.digest())
        first = int(positions.min()) if len(positions) else 0
        return cls(keys, rows, positions, first, shared_prefix_length(host.input_ids, first))


def host_copy(batch: Mapping[str, Any]) -> HostCopy:
    """The batch's host copy from the collator, or one read back from the device (a batch made elsewhere)."""
    host = batch.get("host_copy")
    if isinstance(host, HostCopy) and host.input_ids.shape == batch["input_ids"].shape:
        return host
    return HostCopy(*(batch[key].detach().cpu() for key in ("input_ids", "attention_mask", "labels")))


class StartModelLogits:
    """Callable ``batch -> logits`` of the frozen start model, exact at every position an answer token is
    predicted (to float tolerance: the LM head over fewer rows may round differently), zeros elsewhere.

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
        self.verified: bool | None = None  # None until the first batch compared head(kept) with the forward
        self.forwards = 0
        self.head_only = 0

    def __call__(self, batch: Mapping[str, Any]) -> torch.Tensor:
        input_ids, attention_mask = batch["input_ids"], batch["attention_mask"]
        with torch.no_grad(), self._reference_mode() as reference:
            if not self.may_trim:
                self.forwards += 1
                return reference(input_ids=input_ids, attention_mask=attention_mask).logits
            layout = RowsLayout.of(host_copy(batch))
            if self.verified and all(key in self.kept for key in layout.keys):
                self.head_only += 1
                return self._from_kept(reference, layout, input_ids.shape[1])
            self.forwards += 1
            return self._forward(reference, batch, layout)

    def _forward(self, reference: nn.Module, batch: Mapping[str, Any], layout: RowsLayout) -> torch.Tensor:
        """The start model's forward from the first read position on (the shared prefix once), the LM head's input
        kept for the rows not kept yet."""
        input_ids = batch["input_ids"]
        keep = self.budget_bytes > 0 and self.verified is not False
        captured: list[torch.Tensor] = []
        hook = None
        if keep:
            hook = reference.get_output_embeddings().register_forward_hook(
                lambda _module, args, _output: captured.append(args[0])
            )
        try:
            kept, first = answer_logits(
                reference, input_ids, batch["attention_mask"], batch["labels"], layout.first, layout.prefix
            )
        finally:
            if hook is not None:
                hook.remove()
        logits = kept
        if first:
            logits = kept.new_zeros(input_ids.shape[0], input_ids.shape[1], kept.shape[-1])
            logits[:, first:] = kept
        if keep and captured and captured[-1].shape[:2] == kept.shape[:2]:
            self._keep(reference, layout, first, captured[-1], logits)
        return logits

    def _keep(
        self, reference: nn.Module, layout: RowsLayout, first: int, head_inputs: torch.Tensor, logits: torch.Tensor
    ) -> None:
        """Keep each row's head inputs at its read positions (one copy to the host per batch); on the first batch,
        check that the LM head gives the forward's logits from them."""
        device = head_inputs.device
        rows = torch.as_tensor(layout.rows, device=device)
        positions = torch.as_tensor(layout.positions, device=device)
        vectors = head_inputs[rows, positions - first]
        if self.verified is None:
            again = reference.get_output_embeddings()(vectors).float()
            self.verified = again.shape == logits[rows, positions].shape and torch.allclose(
                again, logits[rows, positions].float(), rtol=_tolerance(logits.dtype), atol=1e-4
            )
            if not self.verified:
                logger.info(
                    "UnlearnTrainer: the model's LM head does not give its logits alone (it transforms them "
                    "after the head); the start model runs on every batch."
                )
                return
        counts = np.bincount(layout.rows, minlength=len(layout.keys)).tolist()
        on_host = vectors.detach().to("cpu", copy=True)
        for key, row_vectors in zip(layout.keys, on_host.split(counts), strict=True):
            if key in self.kept:
                continue
            size = row_vectors.numel() * row_vectors.element_size()
            if self.kept_bytes + size > self.budget_bytes:
                logger.info_once(
                    f"UnlearnTrainer: the start model's kept outputs reached their budget "
                    f"({self.budget_bytes / 2**30:.2f} GiB); rows not seen yet run the start model each time."
                )
                return
            self.kept[key] = row_vectors.clone()  # its own storage, not a view of the batch's
            self.kept_bytes += size

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
