"""The forwards an objective declared it needs, for :class:`~hf_unlearn.training.trainer.UnlearnTrainer`: the
model's (its LM head from the batch's first predicted answer token on), the frozen start model's logits where they are
read (:class:`~hf_unlearn.training.start_model_logits.StartModelLogits`) or its whole outputs where hidden states are,
gathered into one :class:`~hf_unlearn.objectives.LossInputs`. A mixin of the trainer (before ``Trainer`` in its bases);
it reads the trainer's ``args``, ``accelerator``, ``ref_model``, ``probes``, ``start_model_logits``,
``objective_state_callback`` and ``answer_window_forward``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from ..forwards import accepts_logits_to_keep
from ..objectives import LossInputs, Objective
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
        # An objective that reads hidden states or every attended token gets the whole sequence.
        whole = hidden or objective.normalized_by == "attended_tokens"
        start = 0 if whole else self._answer_window(model, batch)
        extra = {"logits_to_keep": batch["input_ids"].shape[1] - start} if start else {}
        outputs = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=hidden, **extra
        )
        window = slice(start, None)  # what the logits cover: the losses read only there
        return LossInputs(
            logits=outputs.logits,
            labels=batch["labels"][:, window],
            config=self.args,
            reference_logits=None if reference_logits is None else reference_logits[:, window],
            attention_mask=batch["attention_mask"][:, window],
            hidden_states=outputs.hidden_states if hidden else None,
            reference_hidden_states=reference_hidden_states,
            num_items=num_items,
            calibration_margins=calibration,
            calibration_levels=self.probes.calibration_levels,
            input_ids=batch["input_ids"][:, window],
            state=self.objective_state_callback.view(objective.name, writable=model.training),
        )

    def _answer_window(self, model: nn.Module, batch: Mapping[str, Any]) -> int:
        """The first position whose logits predict an answer token in any row of ``batch``: the training forward runs
        its LM head from there on (``logits_to_keep``), since no loss, probe or stop reads a logit before it. 0 (the
        whole sequence) where the model's forward does not take ``logits_to_keep`` or where the deprecated
        ``calibration_match='prompt'`` reads the prompt's tokens beside the logits."""
        if self.answer_window_forward is None:
            self.answer_window_forward = accepts_logits_to_keep(self.accelerator.unwrap_model(model))
        if not self.answer_window_forward or self.args.calibration_match == "prompt":
            return 0
        return first_read_position(host_copy(batch))
