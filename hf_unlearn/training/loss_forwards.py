"""The forwards an objective declared it needs, for :class:`~hf_unlearn.training.trainer.UnlearnTrainer`: the
model's (its LM head from the batch's first predicted answer token on), the frozen start model's logits where they are
read (:class:`~hf_unlearn.training.start_model_logits.StartModelLogits`) or its whole outputs where hidden states are,
gathered into one :class:`~hf_unlearn.objectives.LossInputs`. A mixin of the trainer (before ``Trainer`` in its bases);
it reads the trainer's ``args``, ``accelerator``, ``ref_model``, ``probes``, ``start_model_logits``,
``objective_state_callback``, ``answer_window_forward`` and ``shared_prefix_forward``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from accelerate.utils import is_compiled_module
from torch import nn

from ..data import prompt_copies
from ..forwards import accepts_logits_to_keep, forward_after_shared_prefix, prompt_cache_keyword, shared_prefix_length
from ..objectives import LossInputs, Objective
from ..objectives.masc.probe import has_dropout
from .reference import adapters_disabled
from .start_model_logits import first_read_position, host_copy


class LossForwards:
    """The model's and the start model's forwards of :class:`~hf_unlearn.training.trainer.UnlearnTrainer`."""

    @contextmanager
    def _reference_mode(self, model: nn.Module) -> Iterator[nn.Module]:
        """The frozen start model: the separate copy, or the PEFT model with its adapters disabled."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        with adapters_disabled(self.accelerator.unwrap_model(model)) as reference:
            yield reference

    def reference_logits(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits of the frozen start model on ``batch`` (no gradient), at every position. (The objectives and the
        probes read them only where an answer token is predicted, from ``self.start_model_logits``.)"""
        return self._reference_outputs(model, batch, hidden_states=False).logits

    def _reference_outputs(self, model: nn.Module, batch: Mapping[str, torch.Tensor], hidden_states: bool) -> Any:
        with torch.no_grad(), self._reference_mode(model) as reference:
            return reference(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                output_hidden_states=hidden_states,
            )

    def _loss_inputs(
        self, model: nn.Module, batch: Mapping[str, torch.Tensor], objective: Objective, num_items: Any
    ) -> LossInputs:
        """Run the forwards an objective declared it needs: the model's, and the reference model's if asked."""
        hidden = objective.needs_hidden_states
        reference_logits = reference_hidden_states = None
        if objective.needs_reference(self.args) and hidden:  # hidden states are read at every position
            reference = self._reference_outputs(model, batch, hidden_states=True)
            reference_logits, reference_hidden_states = reference.logits, reference.hidden_states
        elif objective.needs_reference(self.args):
            reference_logits = self.start_model_logits(batch)
        calibration = self.probes.calibration_thresholds() if objective.needs_calibration(self.args) else None
        copies = copy_margins = None
        if objective.needs_prompt_copies(self.args):  # read over the whole row: the prompt is before the window
            copies = prompt_copies(batch["input_ids"], batch["labels"], batch["attention_mask"])
            copy_margins = self.probes.calibration_copy_margins
        # An objective that reads hidden states or every attended token gets the whole sequence.
        whole = hidden or objective.normalized_by == "attended_tokens"
        start = 0 if whole else self._answer_window(model, batch)
        extra = {"logits_to_keep": batch["input_ids"].shape[1] - start} if start else {}
        prefix = self._shared_prefix(model, batch, start)
        hidden_states = None  # an objective that reads them runs the whole sequence: no shared prefix then
        if prefix:
            keyword = prompt_cache_keyword(self.accelerator.unwrap_model(model))
            logits = forward_after_shared_prefix(
                model, keyword, batch["input_ids"], batch["attention_mask"], prefix, **extra
            )
        else:
            outputs = model(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=hidden,
                **extra,
            )  # fmt: skip
            logits, hidden_states = outputs.logits, outputs.hidden_states if hidden else None
        window = slice(start, None)  # what the logits cover: the losses read only there
        return LossInputs(
            logits=logits,
            labels=batch["labels"][:, window],
            config=self.args,
            reference_logits=None if reference_logits is None else reference_logits[:, window],
            attention_mask=batch["attention_mask"][:, window],
            hidden_states=hidden_states,
            reference_hidden_states=reference_hidden_states,
            num_items=num_items,
            calibration_margins=calibration,
            calibration_levels=self.probes.calibration_levels,
            input_ids=batch["input_ids"][:, window],
            prompt_copies=None if copies is None else copies[:, window],
            calibration_copy_margins=copy_margins,
            state=self.objective_state_callback.view(objective.name, writable=model.training),
        )

    def _answer_window(self, model: nn.Module, batch: Mapping[str, Any]) -> int:
        """The first position whose logits predict an answer token in any row of ``batch``: the training forward runs
        its LM head from there on (``logits_to_keep``), since no loss, probe or stop reads a logit before it. 0 (the
        whole sequence) where the model's forward does not take ``logits_to_keep``."""
        if self.answer_window_forward is None:
            self.answer_window_forward = accepts_logits_to_keep(self.accelerator.unwrap_model(model))
        if not self.answer_window_forward:
            return 0
        return first_read_position(host_copy(batch))

    def _shared_prefix(self, model: nn.Module, batch: Mapping[str, Any], start: int) -> int:
        """How many leading tokens every row of ``batch`` shares before ``start`` (the answer window's first
        position), for the training forward to run once and repeat over the rows as a KV cache
        (:func:`~hf_unlearn.forwards.forward_after_shared_prefix`; a chat template's system prompt, ~25 of SmolLM2's
        ~80 tokens a TOFU row): the gradient flows through the repeated keys and values, so the loss and gradients
        are the whole forward's to float tolerance. 0 (the plain forward) without an answer window, where the model's
        cache cannot be repeated (:func:`~hf_unlearn.forwards.prompt_cache_keyword`), under a wrapper or sharding
        that expects one forward per backward (DDP, DeepSpeed, FSDP), for a compiled model, with dropout or NEFTune
        (one random draw for the shared tokens of every row would not be the whole forward's), with rotary scaling
        that depends on the sequence's length, and at each call with gradient checkpointing on (it drops the cache
        in training) or rows longer than a sliding attention window."""
        if not start:
            return 0
        unwrapped = self.accelerator.unwrap_model(model)
        if self.shared_prefix_forward is None:
            self.shared_prefix_forward = self._may_share_prefix(model, unwrapped)
        if not self.shared_prefix_forward or _checkpointing(unwrapped):
            return 0
        window = getattr(getattr(unwrapped, "config", None), "sliding_window", None)
        if isinstance(window, int) and window < batch["input_ids"].shape[1]:
            return 0
        host = host_copy(batch)
        prefix = shared_prefix_length(host.input_ids, start)
        return prefix if bool(host.attention_mask[:, :prefix].all()) else 0  # the prefix must be attended in every row

    def _may_share_prefix(self, model: nn.Module, unwrapped: nn.Module) -> bool:
        """What of :meth:`_shared_prefix`'s conditions holds for the whole run, decided at the first batch."""
        config = getattr(unwrapped, "config", None)
        rope = getattr(config, "rope_scaling", None) or getattr(config, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", rope.get("type")) if isinstance(rope, dict) else None
        return (
            unwrapped is model
            and self.accelerator.num_processes == 1
            and not (self.is_deepspeed_enabled or self.is_fsdp_enabled)
            and not is_compiled_module(model)
            and getattr(self, "neftune_noise_alpha", None) is None
            and rope_type not in ("dynamic", "longrope")
            and prompt_cache_keyword(unwrapped) is not None
            and not has_dropout(unwrapped)
        )


def _checkpointing(model: nn.Module) -> bool:
    """Whether gradient checkpointing is on in any of ``model``'s modules (read at each call: Trainer turns it on
    inside ``train()``)."""
    return any(getattr(module, "gradient_checkpointing", False) for module in model.modules())
