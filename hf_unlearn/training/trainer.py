"""`UnlearnTrainer`: a `transformers.Trainer` whose train dataset is the data to forget.

Glue only: it pairs forget with retain batches, runs the forwards each registered objective declared it needs, and
backpropagates the forget part and the retain part separately through Trainer's own ``training_step`` (so that gradient
surgery gets two gradients). Trainer's training loop, loss scaling, DeepSpeed handling, checkpointing, logging,
accelerate and PEFT handling are used unchanged. What it composes: the data checks (:mod:`hf_unlearn.data.checks`), the
frozen reference (:mod:`.reference`), MASC's probes and stopping rule (:mod:`hf_unlearn.objectives.masc`), the
gradient-surgery buffers (:mod:`hf_unlearn.surgery`) and the run record, built by :func:`.record_builder.build_record`,
which every report reads.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, Trainer, TrainerCallback
from transformers.trainer_utils import EvalLoopOutput
from transformers.utils import logging

from ..data.checks import alternative_answer_examples, check_unlearning_data, warn_if_nothing_is_cut
from ..data.examples import appended_eos, ensure_pad_token
from ..data.pairing import (
    ContinuationScoring,
    ForgetRetainCollator,
    ForgetRetainDataset,
    model_inputs,
    split_holdout,
    window_counts,
)
from ..objectives import Objective
from ..objectives.masc.options import resolved_for_run
from ..objectives.masc.probe import ProbeSets, ProbeState, calibration_sample_size, runs_from_training_forwards
from ..objectives.masc.stopping import ViolationStoppingCallback, warn_budget_ended
from ..objectives.registry import resolve_objectives
from ..surgery import SurgeryBuffers
from .adapters import check_causal_lm, is_peft_model, prepare_model
from .base_model import anchored_base
from .callbacks import ObjectiveStateCallback, RetainPairingCallback, advance_objective_states
from .choices import check_surgery_backend
from .config import UnlearnConfig
from .config_checks import check_outputs
from .ledger import forget_set_fingerprint, load_ledger, loaded_from
from .loss_forwards import LossForwards
from .loss_tracking import LossTracker
from .output_dir import check_writable, prepare_output_dir
from .record import UnlearnRecord, run_datasets
from .reference import ZERO3_COPY, make_reference, prepare_reference, zero_stage
from .run_outputs import RunOutputs
from .sharpness import ForgetSAM
from .start_model_logits import StartModelLogits, start_model_is_constant

logger = logging.get_logger(__name__)

PARTS = ("forget", "retain")
_UNIT_INDEX = {"answer_tokens": 0, "sequences": 1, "attended_tokens": 2}


class UnlearnTrainer(RunOutputs, LossForwards, Trainer):
    """Trainer for LLM unlearning: ``train_dataset`` is forgotten while ``retain_dataset`` is kept.

    Implements MASC (margin self-correction, arXiv 2606.02920) with its online stopping rule, the objectives
    registered in :mod:`hf_unlearn.objectives`, and retention-first gradient surgery (arXiv 2604.14808).

    Args:
        model: a causal LM (``PreTrainedModel``) or a PEFT model.
        args: an :class:`UnlearnConfig` (not modified: the trainer fills in the settings left None on its own copy).
        train_dataset: the forget set, tokenized (``input_ids``, ``attention_mask``, ``labels`` with -100 on
            the prompt); see :func:`~hf_unlearn.data.examples.build_qa_dataset`.
        retain_dataset: the data to keep, same form; required by objectives with a retain term.
        processing_class: the tokenizer (its pad id pads the batches).
        peft_config: a ``peft.LoraConfig`` (or any PEFT config); the model is wrapped with it, as in TRL.
        ref_model: optional frozen reference model. By default: the base with adapters disabled for a PEFT
            model (no copy), else a frozen copy of ``model`` made before training.
        calibration_dataset: data of the same kind the model never trained on: the stopping rule's target.

    After ``train()``, :attr:`record` is the run's :class:`~hf_unlearn.training.record.UnlearnRecord`.
    """

    _tag_names = ["hf_unlearn", "unlearning"]
    # Each objective divides by its unit count over the whole accumulation window (num_items_in_batch).
    loss_is_scaled_for_ga = True

    def __init__(
        self,
        model: PreTrainedModel | nn.Module,
        args: UnlearnConfig | None = None,
        train_dataset: Sequence[Mapping[str, Any]] | None = None,
        retain_dataset: Sequence[Mapping[str, Any]] | None = None,
        processing_class: Any = None,
        data_collator: Any = None,
        peft_config: Any = None,
        ref_model: nn.Module | None = None,
        callbacks: list[TrainerCallback] | None = None,
        calibration_dataset: Sequence[Mapping[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        if args is None:
            args = UnlearnConfig(output_dir="unlearn-output")
        if not isinstance(args, UnlearnConfig):
            raise TypeError(f"args must be an UnlearnConfig, got {type(args).__name__}.")
        check_writable(args.output_dir)  # Trainer makes the folder now; say why it cannot, naming it
        check_outputs(args)  # again: set_push_to_hub() or an attribute set after UnlearnConfig checked it
        check_causal_lm(model)
        # The objectives and their declared hyperparameters, checked before any weight changes.
        self.forget_objective, self.retain_objective, self.objective_kwargs = resolve_objectives(args)
        check_unlearning_data(
            model,
            train_dataset,
            retain_dataset,
            calibration_dataset,
            method=args.method,
            retain_objective=args.objectives[1],
            alternate_column=self.objective_kwargs["forget"].get("alternate_column"),
            forget_objective=args.objectives[0],
        )
        args = resolved_for_run(args, train_dataset, calibration_dataset)
        if processing_class is not None:
            ensure_pad_token(processing_class)
        model = self._prepare_model_and_reference(model, args, peft_config, ref_model)
        # What evaluate() measures: the forget and retain records as given (question/answer columns kept).
        self.forget_records = train_dataset
        self.retain_records = retain_dataset
        paired, probe_sets = self._split_forget_set(
            args, train_dataset, retain_dataset, calibration_dataset, processing_class
        )
        # The request ledger: this forget set's fingerprint, and the requests the model went through before
        # (the ledger of the folder it was loaded from; set it directly to chain runs in memory).
        self.forget_fingerprint = forget_set_fingerprint(train_dataset)
        self.earlier_requests: list[dict[str, Any]] = load_ledger(loaded_from(model, is_peft_model(model)))
        self.pad_token_id = getattr(processing_class, "pad_token_id", None) or 0
        if args.eval_strategy != "no" and kwargs.get("eval_dataset") is None:
            # Trainer insists on an eval_dataset for eval_strategy; evaluate() measures the forget and retain sets.
            kwargs["eval_dataset"] = train_dataset
        super().__init__(
            model=model,
            args=args,
            train_dataset=paired,
            data_collator=ForgetRetainCollator(self.pad_token_id, inner=data_collator),
            processing_class=processing_class,
            callbacks=callbacks,
            **kwargs,
        )
        self._prepare_step_state(args)
        self._add_probes_and_callbacks(args, probe_sets, paired, has_retain=retain_dataset is not None)
        self._train_seconds: float | None = None
        self.record: UnlearnRecord = self._make_record(final=False)
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names + [args.method])

    def _prepare_model_and_reference(
        self, model: nn.Module, args: UnlearnConfig, peft_config: Any, ref_model: nn.Module | None
    ) -> nn.Module:
        """The model to train (a local base named by its absolute path, adapters added) and, where an objective
        compares with one, its frozen reference in ``self.ref_model`` (placed on the devices after Trainer's setup,
        :meth:`_prepare_step_state`)."""
        model = prepare_model(anchored_base(model), args, peft_config, self._objectives())
        # A prepare hook may have chosen hyperparameters for the model (RMU's layers): the values the losses read.
        self.objective_kwargs = resolve_objectives(args)[2]
        if ref_model is None and any(objective.needs_reference(args) for objective in self._objectives()):
            ref_model = make_reference(model, is_peft_model(model), args.reference_dtype)
        if ref_model is not None and ref_model is not ZERO3_COPY:
            ref_model.eval().requires_grad_(False)
        self.ref_model = ref_model
        return model

    def _prepare_step_state(self, args: UnlearnConfig) -> None:
        """What a training step needs once Trainer has set up the accelerator: the gradient surgery (refused by name
        on a backend it cannot run on), SAM, the reference on the model's devices, and the loss sums."""
        fsdp1 = self.is_fsdp_enabled and not self.accelerator.is_fsdp2
        check_surgery_backend(args.gradient_surgery, self.is_deepspeed_enabled, fsdp1)
        self.sam = ForgetSAM(args.sam_rho, deepspeed=self.is_deepspeed_enabled, fsdp=self.is_fsdp_enabled)
        if self.ref_model is not None:
            self.ref_model = prepare_reference(
                self.ref_model,
                self.accelerator.unwrap_model(self.model),
                self.accelerator,
                args.device,
                fsdp2=bool(self.is_fsdp_enabled and self.accelerator.is_fsdp2),
                zero3=self._runs_zero3,
                reference_dtype=args.reference_dtype,
            )
        # The start model's logits where the objectives read them, kept per example while it stays constant.
        sharded = self.weights_are_sharded
        constant = start_model_is_constant(self.accelerator.unwrap_model(self.model), self.ref_model is not None)
        self.start_model_logits = StartModelLogits(
            lambda: self._reference_mode(self.model),
            budget_bytes=int(args.reference_cache_gb * 2**30),
            may_keep=constant and not sharded,
            may_trim=not sharded,
        )
        # Whether the training forward runs its LM head from the first answer token (None: decided at the first batch,
        # by whether the model's forward takes logits_to_keep; False runs it whole).
        self.answer_window_forward: bool | None = None
        # Whether it runs the rows' shared leading tokens once (None: decided at the first batch, see
        # LossForwards._shared_prefix; False runs every row whole).
        self.shared_prefix_forward: bool | None = None
        # The parameters the optimizer steps, bound when training starts (see _trainable).
        self._trainable_params: list[torch.Tensor] | None = None
        self.surgery = SurgeryBuffers(
            args.gradient_surgery, args.forget_weight, args.retain_weight, with_stats=args.logging_strategy != "no"
        )
        # Running sums kept on the device and read only when Trainer logs (no host sync per step).
        self.losses = LossTracker()
        self._items_are_global = False
        self._evaluation_extra: tuple[Any, Any] = (None, None)

    def _split_forget_set(
        self, args: UnlearnConfig, forget: Any, retain: Any, calibration: Any, tokenizer: Any
    ) -> tuple[ForgetRetainDataset, ProbeSets]:
        """The forget set split into trained and held-out examples (held-out ones never enter a training batch), the
        probes' fixed sets, and the training pairs; the split goes into the run record."""
        seed = args.data_seed or args.seed
        trained_idx, holdout_idx = split_holdout(len(forget), args.holdout_fraction, seed)
        forget_train = [forget[i] for i in trained_idx]
        # forget_scoring='continuation': the probes score a fixed continuation per example, the training batches
        # one drawn anew each epoch (ForgetRetainDataset's forget_labels).
        self._score_forget = ContinuationScoring.from_config(args, seed)
        if self._score_forget.enabled:
            warn_if_nothing_is_cut(forget, args)
        held_out = [(i, forget[i]) for i in holdout_idx]
        probe_sets = ProbeSets.sample(
            forget_train,
            held_out,
            retain,
            calibration,
            args.probe_size,
            args.seed,
            score=self._score_forget,
            calibration_size=calibration_sample_size(args),
        )
        self._datasets = run_datasets(forget, retain, calibration, trained_idx, holdout_idx)
        paired = ForgetRetainDataset(
            forget_train,
            retain if self.retain_objective is not None else None,
            seed=args.seed,
            refusal=alternative_answer_examples(
                forget_train, self.forget_objective, self.objective_kwargs["forget"], tokenizer
            ),
            forget_labels=self._score_forget if self._score_forget.enabled else None,
        )
        return paired, probe_sets

    def _add_probes_and_callbacks(
        self, args: UnlearnConfig, probe_sets: ProbeSets, paired: ForgetRetainDataset, has_retain: bool
    ) -> None:
        """The shared probe state, the retain pairing, the objectives' state and the stopping rule's callbacks."""
        self.probes = ProbeState(
            args,
            probe_sets,
            self.pad_token_id,
            self.accelerator,
            model=lambda: self.accelerator.unwrap_model(self.model),
            trainable=self._trainable,
            reference_logits=lambda batch: self.start_model_logits(batch),
            running=runs_from_training_forwards(args, self.forget_objective, self.model),
            calibrated=args.stop_target in ("calibration", "membership"),
            can_snapshot=not self.is_deepspeed_enabled,
            min_k_leaves_out=appended_eos(self.processing_class, getattr(self.model, "config", None)),
            last_step=lambda: bool(self.state.max_steps) and self.state.global_step >= self.state.max_steps,
        )
        self.add_callback(RetainPairingCallback(paired))
        # Objectives with state across steps (PDU's dual variable): kept, updated and checkpointed by one callback.
        self.objective_state_callback = ObjectiveStateCallback(
            {o.name: o.initial_state(args) for o in self._objectives() if o.initial_state is not None}
        )
        if self.objective_state_callback.states:
            self.objective_state_callback.bind(self._update_objective_states)
            self.add_callback(self.objective_state_callback)
        self.stopping_callback = ViolationStoppingCallback.from_config(args, has_retain)
        self._bind_stopping_callback(self.stopping_callback)
        if args.probe_interval > 0:
            self.add_callback(self.stopping_callback)

    def _update_objective_states(self, states: dict[str, dict[str, Any]], step: int) -> None:
        """After an optimizer step: advance each stateful objective, kept equal on every process."""
        advance_objective_states(self._objectives(), states, self.args, step, self.accelerator, self._items_are_global)

    def _objectives(self) -> list[Objective]:
        return [o for o in (self.forget_objective, self.retain_objective) if o is not None]

    def _parts(self) -> list[tuple[str, Objective, float]]:
        parts = [("forget", self.forget_objective, self.args.forget_weight)]
        if self.retain_objective is not None:
            parts.append(("retain", self.retain_objective, self.args.retain_weight))
        return parts

    def _objective_loss(
        self, model: nn.Module, inputs: Mapping[str, Any], part: str, objective: Objective, num_items: Any = None
    ) -> torch.Tensor:
        count = None if num_items is None else num_items[part][_UNIT_INDEX[objective.normalized_by]]
        loss_inputs = self._loss_inputs(model, inputs[part], objective, count)
        loss_inputs.hyperparameters = self.objective_kwargs[part]
        tracked = model.training and not self.sam.perturbed  # SAM's pass at perturbed weights is not measured
        if objective.needs_refusal or objective.needs_alternate:
            loss_inputs.refusal = self._loss_inputs(model, inputs["refusal"], objective, count)
            loss_inputs.refusal.hyperparameters = loss_inputs.hyperparameters
        loss = objective.fn(loss_inputs)
        if self.probes.running and tracked and part == "forget":
            # after the loss, so that the restricted margin MASC's loss computed serves the running read too
            self.probes.accumulate(
                loss_inputs.logits, loss_inputs.labels, loss_inputs.reference_logits, margins=loss_inputs.margins
            )
        if self.probes.running and tracked and part == "retain":
            self.probes.accumulate_retain(loss_inputs.logits, loss_inputs.labels)
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Weighted sum of the objectives whose part (``forget``, ``retain``) is in ``inputs`` (unweighted parts
        while training with gradient surgery, whose combination applies the weights).

        ``num_items_in_batch`` is what :meth:`_get_num_items_in_batch` counted over the accumulation window: each
        objective divides its sum by its unit's count there, so accumulated micro-batches of any lengths give the
        big batch's mean (Trainer's treatment of ``num_items_in_batch``). When the counts were summed over
        processes, the loss is multiplied by the number of processes, since DDP averages gradients, as Trainer
        does under ``average_tokens_across_devices``.
        """
        # With gradient surgery each part's backward carries its unweighted loss and the combination applies the
        # weights (as the SAGO reference code does); the weights then never enter a gradient twice.
        weighted = not (model.training and self.args.gradient_surgery != "sum")
        total = None
        for part, objective, weight in self._parts():
            if part not in inputs:
                continue
            loss = self._objective_loss(model, inputs, part, objective, num_items_in_batch)
            if num_items_in_batch is not None and self._items_are_global:
                loss = loss * self.accelerator.num_processes
            if model.training and not self.sam.perturbed:
                self.losses.track(part, loss.detach())
            if weighted:
                loss = weight * loss
            total = loss if total is None else total + loss
        if total is None:
            raise ValueError(f"compute_loss got none of the parts {PARTS}; inputs have {sorted(inputs)}.")
        return (total, None) if return_outputs else total

    # --- training step ----------------------------------------------------------------------------------

    def _get_num_items_in_batch(self, batch_samples: list, device: torch.device) -> dict[str, torch.Tensor] | None:
        """Per part, ``[answer tokens, sequences, attended tokens]`` over the whole accumulation window, summed over
        processes with ``average_tokens_across_devices`` (one small all-gather per optimizer step, as Trainer)."""
        counts = window_counts(batch_samples, device, PARTS)
        self._items_are_global = bool(self.args.average_tokens_across_devices and self.args.world_size > 1)
        if counts and self._items_are_global:
            stacked = self.accelerator.gather(torch.stack(list(counts.values())).unsqueeze(0)).sum(0)
            counts = dict(zip(counts, stacked))
        return counts

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        """Backward the forget part, then the retain part, each through Trainer's ``training_step``.

        Two backward passes keep one graph alive at a time and give each loss its own gradient. With
        ``gradient_surgery='sum'`` the weighted losses simply accumulate into ``p.grad`` (the gradient of the
        summed loss). Otherwise the forget gradient accumulates in a separate store over the whole window (swapped
        in and out of ``p.grad``, so DDP all-reduces it too) and the two unweighted gradients are combined in place
        with gamma = ``forget_weight`` and alpha = ``retain_weight`` once, at the window's last micro-batch, before
        Trainer clips and steps.
        """
        if num_items_in_batch is None:
            # Called outside Trainer's loop: count this micro-batch and scale it to the window, which gives each
            # micro-batch's mean divided by the accumulation steps (Trainer's own fallback).
            counts = self._get_num_items_in_batch([inputs], self.args.device)
            steps = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
            num_items_in_batch = {part: count * steps for part, count in counts.items()}
        surgery = self.args.gradient_surgery != "sum"
        if surgery and self.is_fsdp_enabled and not self.accelerator.sync_gradients:
            # FSDP2 accumulates unsynchronised gradients in its own unsharded buffers, where the forget and the
            # retain part would mix; reduce-scatter every micro-batch's parts into p.grad instead (as ZeRO-2 does).
            model.set_requires_gradient_sync(True)
        forget_part = {key: value for key, value in inputs.items() if key != "retain"}
        if surgery:
            self.surgery.swap(self._trainable())
        ascent = partial(super().training_step, model, forget_part, num_items_in_batch)  # sam_rho's first pass
        sam = self.sam.perturbed_for(self._trainable, ascent, partial(self.accelerator.no_sync, model))
        with self._no_deepspeed_step_before_the_retain_part("retain" in inputs), sam:
            loss = super().training_step(model, forget_part, num_items_in_batch)
        if surgery:
            self.surgery.swap(self._trainable())
            loss = self.args.forget_weight * loss  # what Trainer logs is the weighted total either way
        if "retain" in inputs:
            retain = super().training_step(model, {"retain": inputs["retain"]}, num_items_in_batch)
            loss = loss + (self.args.retain_weight * retain if surgery else retain)
        if self.accelerator.sync_gradients:
            names = {part: objective.name for part, objective, _ in self._parts()}
            self.losses.end_of_step(names, self.state.global_step + 1)
            if surgery:
                self.surgery.combine(self._trainable())
        return loss

    @contextmanager
    def _no_deepspeed_step_before_the_retain_part(self, retain_follows: bool):
        """DeepSpeed steps its optimizer inside the backward at an accumulation boundary; the forget backward must
        not be that boundary when the retain backward of the same micro-batch is still to come."""
        sync = self.accelerator.sync_gradients
        defer = retain_follows and sync and self.is_deepspeed_enabled
        if defer:
            self.accelerator.gradient_state._set_sync_gradients(False)
        try:
            yield
        finally:
            if defer:
                self.accelerator.gradient_state._set_sync_gradients(sync)

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """Trainer's estimate (6 x tokens x parameters) summed over the forget, retain and refusal batches."""
        parent = super()
        return sum(parent.floating_point_ops(batch) for batch in inputs.values() if isinstance(batch, Mapping))

    def _track_num_input_tokens(self, inputs: dict[str, Any]) -> None:
        """Trainer's count of input tokens seen (``include_num_input_tokens_seen``), over every part of the batch."""
        for batch in inputs.values():
            if isinstance(batch, Mapping):
                super()._track_num_input_tokens(batch)

    def _trainable(self) -> list[torch.Tensor]:
        """The trainable parameters as the optimizer steps them, bound at their first use in a ``train()`` call
        (from the first probe's snapshot on): FSDP2 replaces the module's parameters with sharded ones when the model
        is prepared, and after a forward with ``reshard_after_forward=False`` the module even holds the *unsharded*
        ones, which never get a gradient; the optimizer's are the sharded ones. Binding any earlier would also keep
        the pre-sharding tensors (a whole model per process) alive."""
        if self._trainable_params is None:
            if self.is_fsdp_enabled and self.optimizer is not None:
                params = [p for group in self.optimizer.param_groups for p in group["params"]]
            else:
                params = list(self.model.parameters())
            self._trainable_params = [p for p in params if p.requires_grad]
            self.surgery.reset(len(self._trainable_params))
        return self._trainable_params

    @property
    def _runs_zero3(self) -> bool:
        return bool(self.is_deepspeed_enabled and zero_stage(self.accelerator) == 3)

    @property
    def weights_are_sharded(self) -> bool:
        """Whether no process holds the whole model (FSDP, DeepSpeed ZeRO-3): forwards must then run on every
        process, and whole-model checks (quantization, audit) belong to the saved model."""
        return bool(self.is_fsdp_enabled or self._runs_zero3)

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add, to Trainer's training logs, the mean forget/retain losses and surgery statistics since the last
        log (read from the device here, once per log) and the latest probe numbers."""
        if "loss" in logs:  # training logs only; Trainer calls this on every process
            gather = self.accelerator.gather if self.args.world_size > 1 else (lambda total: total)
            logs.update(self.losses.read_means(gather))
            logs.update(self.surgery.read_means())
            logs.update(self.probes.latest)
            self.probes.latest = {}
        super().log(logs, start_time)

    # --- probing: the shared ProbeState ------------------------------------------------------------------

    def probe(self) -> dict[str, float]:
        """The stopping rule's measurement now (see :meth:`ProbeState.probe`)."""
        return self.probes.probe()

    def exact_reproduction_bound(self, examples: Sequence[Mapping[str, Any]] | None = None) -> dict[str, float]:
        """MASC Proposition 1 on ``examples`` (default: the trained forget examples), at beta = 1."""
        if examples is None:
            examples = [model_inputs(self.train_dataset.forget[i]) for i in range(len(self.train_dataset))]
        return self.probes.exact_reproduction_bound(examples)

    def _bind_stopping_callback(self, callback: ViolationStoppingCallback) -> None:
        guard = callback.utility_floor is not None and bool(self.args.restore_on_failure)
        self.probes.bind(callback, guard=guard)

    # --- evaluation -------------------------------------------------------------------------------------

    def evaluate(
        self,
        eval_dataset: Any = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
        retain_only_truth_ratios: Sequence[float] | None = None,
    ) -> dict[str, float]:
        """Unlearning metrics of the current model through Trainer's ``evaluate`` (its logging, speed metrics,
        ``on_evaluate`` callbacks and memory tracking), whose loop is :meth:`evaluation_loop`: ROUGE-L, Prob, exact
        match and truth ratio on the forget and retain sets, model utility, the exact-reproduction bound and, given
        the retain-only model's forget truth ratios, forget quality (:func:`hf_unlearn.evaluation.evaluate_unlearning`,
        the code path of ``hf-unlearn eval``). ``eval_dataset`` (a retain-like set, or a dict of them) adds sets that
        count towards model utility, rather than being evaluated one by one as in Trainer. Logged as
        ``eval_forget_rouge_l_recall`` etc. ``ignore_keys`` is accepted for Trainer's signature and has no effect: no
        model outputs are gathered."""
        from ..evaluation.suites import require_question_columns

        require_question_columns({"forget": self.forget_records, "retain": self.retain_records})
        if eval_dataset is None and self.eval_dataset is not self.forget_records:
            eval_dataset = self.eval_dataset
        extra = eval_dataset if isinstance(eval_dataset, dict) else {"eval": eval_dataset} if eval_dataset else None
        self._evaluation_extra = (extra, retain_only_truth_ratios)
        try:
            return super().evaluate(self.forget_records, ignore_keys, metric_key_prefix)
        finally:
            self._evaluation_extra = (None, None)

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> EvalLoopOutput:
        """For ``evaluate()``: the unlearning metrics instead of a loss over batches (``predict()`` keeps Trainer's
        loop)."""
        if description != "Evaluation":
            return super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        from ..evaluation.suites import evaluate_unlearning, logged_metrics

        extra, retain_only_truth_ratios = self._evaluation_extra
        result = evaluate_unlearning(
            self.accelerator.unwrap_model(self.model),
            self.processing_class,
            self.forget_records,
            self.retain_records,
            retain_only_truth_ratios=retain_only_truth_ratios,
            extra_retain_sets=extra,
            k=self.args.masc_k,
            rho=self.args.masc_rho,
        )
        metrics = logged_metrics(result, metric_key_prefix)
        return EvalLoopOutput(predictions=None, label_ids=None, metrics=metrics, num_samples=len(self.forget_records))

    # --- the run record ---------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """Trainer's ``train``, after checking the output folder (an earlier run there is refused unless
        ``overwrite_output_dir`` or a resume; it must be writable) so that nothing is trained that cannot be saved."""
        if self.is_world_process_zero():
            prepare_output_dir(
                self.args.output_dir, self.args.overwrite_output_dir, resuming=bool(resume_from_checkpoint)
            )
        start = time.perf_counter()
        self._trainable_params = None
        output = super().train(resume_from_checkpoint, *args, **kwargs)
        self._train_seconds = time.perf_counter() - start
        self.record = self._make_record(final=True)
        if self.record.stop_kind == "budget" and self.record.stopping_rule:
            warn_budget_ended(self.record.stop_reason, self.args.stop_target)
        return output

    def _load_callback_state(self) -> None:
        super()._load_callback_state()
        # Trainer rebuilds stateful callbacks from their exported args; give the rebuilt one its probe back.
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, ObjectiveStateCallback):
                callback.bind(self._update_objective_states)
                self.objective_state_callback = callback
            if isinstance(callback, ViolationStoppingCallback):
                self._bind_stopping_callback(callback)
                self.stopping_callback = callback
                # One process's sums are in the checkpoint; with several, the next probe counts from the resume (the
                # never-seen margins and the screen's start value are the same on every process and carry over).
                self.probes.restore_running(callback.running_sums, sums=self.accelerator.num_processes == 1)
                if self.probes.start_retain_probability is None:  # a checkpoint from before the retain screen
                    self.probes.start_retain_probability = callback.start_retain_probability


__all__ = ["UnlearnTrainer"]
