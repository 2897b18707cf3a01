"""The callbacks every run gets: objectives' state across steps and checkpoints (PDU's dual variable), progress bars,
and the retain pairing per epoch. MASC's stopping rule is :mod:`hf_unlearn.objectives.masc.stopping`."""

from __future__ import annotations

import math
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState, PrinterCallback, ProgressCallback
from transformers.utils import logging

logger = logging.get_logger(__name__)


class ObjectiveStateCallback(TrainerCallback, ExportableState):
    """State that objectives keep across optimizer steps (PDU's dual variable), saved with every checkpoint and
    restored on resume. ``states`` maps an objective's name to its state dict; after each optimizer step the
    trainer-bound update of every stateful objective runs (:meth:`bind`)."""

    def __init__(self, states: dict[str, dict[str, Any]] | None = None) -> None:
        self.states = states or {}
        self._update: Any = None

    def bind(self, update: Any) -> None:
        """``update(states, step)``: the trainer's function that advances every objective's state."""
        self._update = update

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self._update is not None:
            self._update(self.states, state.global_step)
        return control

    def view(self, name: str, writable: bool) -> dict[str, Any] | None:
        """The objective ``name``'s state as its loss reads it: the state itself while training (the loss adds what
        the next update consumes), else (evaluate()) a copy without the work in progress."""
        state = self.states.get(name)
        if state is None or writable:
            return state
        return {key: value for key, value in state.items() if not key.startswith("_")}

    def state(self) -> dict[str, Any]:
        # Keys starting with "_" hold work in progress (tensors), not state.
        saved = {
            name: {key: value for key, value in values.items() if not key.startswith("_")}
            for name, values in self.states.items()
        }
        return {"args": {}, "attributes": {"states": saved}}


class QuietProgressCallback(ProgressCallback):
    """Trainer's progress bar without a printed line per log (the logs still reach ``state.log_history`` and every
    reporting integration): for the learn stages of the benchmarks, whose bar is the stage's one bar, named by
    ``description``."""

    def __init__(self, description: str | None = None, max_str_len: int = 100) -> None:
        super().__init__(max_str_len=max_str_len)
        self.description = description

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.description:
            return super().on_train_begin(args, state, control, **kwargs)
        # ProgressCallback's bar, named from its first drawn line on (a name set after tqdm drew it would leave a
        # nameless first line)
        if state.is_world_process_zero:
            self.training_bar = tqdm(total=state.max_steps, dynamic_ncols=True, desc=self.description)
        self.current_step = 0

    def on_log(self, args, state, control, logs=None, **kwargs):
        return None


class StageProgressCallback(TrainerCallback):
    """Training progress shown in the postfix of the run's own progress bar (``bar``, a tqdm) rather than in a bar
    of Trainer's nested inside it: ``"<label>: step 20/500"``."""

    def __init__(self, bar: Any, label: str) -> None:
        self.bar = bar
        self.label = label

    def on_step_end(self, args, state, control, **kwargs):
        if state.is_local_process_zero:
            self.bar.set_postfix_str(f"{self.label}: step {state.global_step}/{state.max_steps}")


def report_progress_in(trainer: Any, bar: Any, label: str) -> None:
    """Let ``trainer`` show its progress in ``bar`` only: Trainer's own bar (or, with ``disable_tqdm``, its printed
    line per log) is removed."""
    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    trainer.add_callback(StageProgressCallback(bar, label))


def advance_objective_states(
    objectives: Any, states: dict[str, dict[str, Any]], args: Any, step: int, accelerator: Any, items_are_global: bool
) -> None:
    """Each stateful objective's ``update_state`` after an optimizer step (PDU's dual ascent), with its measured value
    combined over processes: summed when the item counts were summed over processes (each process's value is then its
    share of the global mean, ``average_tokens_across_devices``), else averaged."""

    def across_processes(value: Any) -> float:
        if accelerator.num_processes > 1:
            value = accelerator.reduce(value.to(args.device), reduction="sum" if items_are_global else "mean")
        return float(value)

    for objective in objectives:
        if objective.update_state is not None and objective.name in states:
            objective.update_state(states[objective.name], args, step, across_processes)


class RetainPairingCallback(TrainerCallback):
    """Tell the paired forget/retain dataset which epoch it is in, so retain pairs rotate deterministically."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.set_epoch(math.floor(state.epoch + 1e-9) if state.epoch else 0)
