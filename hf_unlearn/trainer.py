"""`UnlearnTrainer`: a `transformers.Trainer` whose train dataset is the data to forget.

Glue only: it pairs forget with retain batches, runs each objective's forward, backpropagates the forget and
retain losses, supplies reference logits from one shared mechanism, and hands the stopping rule a probe.
Trainer's own training loop, checkpointing, logging, accelerate and PEFT handling are used unchanged.
"""

from __future__ import annotations

import copy
import math
import os
import re
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, Trainer, TrainerCallback
from transformers.utils import is_peft_available

from .callbacks import ViolationStoppingCallback
from .config import UnlearnConfig
from .data import (
    IGNORE_INDEX,
    ForgetRetainCollator,
    ForgetRetainDataset,
    ensure_pad_token,
    model_inputs,
    split_holdout,
)
from .evaluation import measure_violations
from .margin import exact_reproduction_bound
from .objectives import (
    FORGET_OBJECTIVES,
    RETAIN_OBJECTIVES,
    LossInputs,
    Objective,
    get_objective,
)
from .surgery import combine_gradients_

if is_peft_available():
    from peft import PeftModel, get_peft_model
else:  # pragma: no cover - peft is a dependency, kept optional for users who strip it
    PeftModel = None


def _is_peft_model(model: nn.Module) -> bool:
    return PeftModel is not None and isinstance(model, PeftModel)


def _vocab_size(model: nn.Module) -> int:
    embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "weight"):
        return embeddings.weight.shape[0]
    return model.config.get_text_config().vocab_size


def _check_examples(dataset: Sequence[Mapping[str, Any]], name: str) -> None:
    """Fail before any step on an empty set or examples without answer tokens."""
    if dataset is None or len(dataset) == 0:
        raise ValueError(f"The {name} set is empty: there is nothing to {'forget' if name == 'forget' else 'keep'}.")
    first = dataset[0]
    missing = [key for key in ("input_ids", "labels") if key not in first]
    if missing:
        raise ValueError(
            f"The {name} examples lack {missing}. Tokenize them first, e.g. with "
            "hf_unlearn.build_qa_dataset(dataset, tokenizer), which masks the prompt with -100."
        )
    empty = [i for i in range(len(dataset)) if all(label == IGNORE_INDEX for label in dataset[i]["labels"])]
    if len(empty) == len(dataset):
        raise ValueError(
            f"Every label of the {name} set is -100: no example has answer tokens to "
            f"{'forget' if name == 'forget' else 'keep'}. Check the prompt masking."
        )
    if empty:
        raise ValueError(
            f"{len(empty)} {name} example(s) have no answer tokens (all labels -100), e.g. indices {empty[:5]}. "
            "Drop them or fix the prompt masking."
        )


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


def _select_rmu_parameters(model: nn.Module, args: UnlearnConfig) -> None:
    """RMU trains only the MLP weights of a few layers (arXiv 2403.03218, §5); freeze everything else."""
    if _is_peft_model(model):
        raise ValueError("RMU chooses which MLP weights train itself; pass the base model without a PEFT wrapper.")
    num_layers = model.config.get_text_config().num_hidden_layers
    if args.rmu_layer is None:
        # The last entry of hidden_states is after the final norm in most models, so stay one layer below it.
        args.rmu_layer = max(min(7, num_layers - 2), 0)
    if not 0 <= args.rmu_layer < num_layers:
        raise ValueError(f"rmu_layer={args.rmu_layer} but the model has {num_layers} layers (0..{num_layers - 1}).")
    if args.rmu_trainable_layers is None:
        args.rmu_trainable_layers = [i for i in (args.rmu_layer - 2, args.rmu_layer - 1, args.rmu_layer) if i >= 0]
    pattern = re.compile(r"\.(?:layers|h|blocks)\.(" + "|".join(map(str, args.rmu_trainable_layers)) + r")\.mlp\.")
    selected = 0
    for name, param in model.named_parameters():
        param.requires_grad_(bool(pattern.search(name)))
        selected += int(param.requires_grad)
    if selected == 0:
        raise ValueError(
            f"RMU found no MLP weights of layers {args.rmu_trainable_layers} in {type(model).__name__} "
            "(looked for '.layers.N.mlp.' / '.h.N.mlp.'); set rmu_trainable_layers."
        )


def _frozen_copy(model: nn.Module) -> nn.Module:
    """A deep copy for the reference model that really runs on its own weights.

    A model that went through another Trainer (e.g. SFTTrainer) can carry a ``forward`` patched onto the
    instance and bound to the original object; deep-copying keeps that binding, so the "copy" would silently
    compute with the weights being trained. Dropping instance-level forwards restores the class's forward.
    """
    reference = copy.deepcopy(model)
    for module in reference.modules():
        module.__dict__.pop("forward", None)
    return reference


def _check_context_length(model: nn.Module, dataset: Sequence[Mapping[str, Any]], name: str) -> None:
    """Positions past the model's context would fail mid-run (or silently wrap); refuse them up front."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    limit = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if not limit:
        return
    lengths = [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
    too_long = [i for i, n in enumerate(lengths) if n > limit]
    if too_long:
        raise ValueError(
            f"{len(too_long)} {name} example(s) are longer than the model's context of {limit} tokens (longest: "
            f"{max(lengths)} tokens, e.g. index {too_long[0]}). Truncate or drop them, e.g. "
            "build_qa_dataset(..., max_length=...)."
        )


class _RetainPairingCallback(TrainerCallback):
    """Tell the paired dataset which epoch it is in, so retain pairs rotate deterministically."""

    def __init__(self, dataset: ForgetRetainDataset) -> None:
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.set_epoch(math.floor(state.epoch + 1e-9) if state.epoch else 0)


class UnlearnTrainer(Trainer):
    """Trainer for LLM unlearning: ``train_dataset`` is forgotten while ``retain_dataset`` is kept.

    Implements MASC (margin self-correction, arXiv 2606.02920) with its online stopping rule, and the
    objectives registered in :mod:`hf_unlearn.objectives`.

    Args:
        model: a causal LM (``PreTrainedModel``) or a PEFT model.
        args: an :class:`UnlearnConfig`.
        train_dataset: the forget set, tokenized (``input_ids``, ``attention_mask``, ``labels`` with -100 on
            the prompt); see :func:`hf_unlearn.build_qa_dataset`.
        retain_dataset: the data to keep, same form; required by objectives with a retain term.
        processing_class: the tokenizer (its pad id pads the batches).
        peft_config: a ``peft.LoraConfig`` (or any PEFT config); the model is wrapped with it, as in TRL.
        ref_model: optional frozen reference model. By default: the base with adapters disabled for a PEFT
            model (no copy), else a frozen copy of ``model`` made before training.
    """

    _tag_names = ["hf_unlearn", "unlearning"]

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
        **kwargs: Any,
    ) -> None:
        if args is None:
            args = UnlearnConfig(output_dir="unlearn-output")
        if not isinstance(args, UnlearnConfig):
            raise TypeError(f"args must be an UnlearnConfig, got {type(args).__name__}.")
        if isinstance(model, str):
            raise TypeError("Pass a loaded model; load it with AutoModelForCausalLM.from_pretrained(...) first.")
        if not hasattr(model, "get_output_embeddings") or model.get_output_embeddings() is None:
            raise ValueError(
                f"{type(model).__name__} has no language-modelling head: unlearning needs a causal LM "
                "(AutoModelForCausalLM)."
            )

        forget_name, retain_name = args.objectives
        self.forget_objective: Objective = get_objective(FORGET_OBJECTIVES, forget_name, "forget")
        self.retain_objective: Objective | None = (
            None if retain_name == "none" else get_objective(RETAIN_OBJECTIVES, retain_name, "retain")
        )
        _check_examples(train_dataset, "forget")
        if self.retain_objective is not None:
            if retain_dataset is None:
                raise ValueError(
                    f"Method {args.method!r} has the retain term {retain_name!r} and needs a retain_dataset. "
                    "Pass retain_dataset=..., or retain_loss='none' to unlearn without one."
                )
            _check_examples(retain_dataset, "retain")
        _check_context_length(model, train_dataset, "forget")
        if retain_dataset is not None:
            _check_context_length(model, retain_dataset, "retain")
        vocab_size = _vocab_size(model)
        if forget_name == "masc" and args.masc_k >= vocab_size:
            raise ValueError(
                f"masc_k={args.masc_k} is not smaller than the vocabulary size {vocab_size}: the k competitors are "
                "other tokens than the target. Lower masc_k."
            )
        if processing_class is not None:
            ensure_pad_token(processing_class)
        if forget_name == "rmu":
            _select_rmu_parameters(model, args)
        if peft_config is not None:
            if _is_peft_model(model):
                raise ValueError("The model is already a PEFT model; pass peft_config=None or the base model.")
            model = get_peft_model(model, peft_config)
        if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_quantized", False):
            from .quantize import keep_4bit_layers_trainable

            keep_4bit_layers_trainable(model)
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError("The model has no trainable parameters (all requires_grad=False): nothing can change.")

        needs_reference = self.forget_objective.needs_reference(args) or (
            self.retain_objective is not None and self.retain_objective.needs_reference(args)
        )
        if needs_reference and ref_model is None and not _is_peft_model(model):
            ref_model = _frozen_copy(model)
        if ref_model is not None:
            ref_model.eval().requires_grad_(False)
        self.ref_model = ref_model

        # Held-out forget examples never enter a training batch; both probes are fixed for the whole run.
        trained_idx, holdout_idx = split_holdout(
            len(train_dataset), args.holdout_fraction, args.data_seed or args.seed
        )
        forget_train = [train_dataset[i] for i in trained_idx]
        self.holdout_examples = [model_inputs(train_dataset[i]) for i in holdout_idx]
        self.probe_examples = self._sample(forget_train, args.probe_size, args.seed)
        self.retain_probe_examples = (
            self._sample(retain_dataset, args.probe_size, args.seed + 1) if retain_dataset is not None else []
        )
        refusals = None
        if self.forget_objective.needs_refusal:
            if processing_class is None:
                raise ValueError(
                    f"{forget_name!r} writes refusal answers and needs the tokenizer: pass processing_class=tokenizer."
                )
            refusals = [
                refusal_example(processing_class, example, args.refusal_answers[i % len(args.refusal_answers)])
                for i, example in enumerate(forget_train)
            ]
        # What evaluate() measures: the forget and retain records as given (question/answer columns kept).
        self.forget_records = train_dataset
        self.retain_records = retain_dataset
        paired = ForgetRetainDataset(
            forget_train,
            retain_dataset if self.retain_objective is not None else None,
            seed=args.seed,
            refusal=refusals,
        )
        pad_id = (
            0 if processing_class is None or processing_class.pad_token_id is None else processing_class.pad_token_id
        )
        self.pad_token_id = pad_id
        collator = ForgetRetainCollator(pad_id, inner=data_collator)

        if args.eval_strategy != "no" and kwargs.get("eval_dataset") is None:
            # Trainer insists on an eval_dataset for eval_strategy; evaluate() measures the forget and retain sets.
            kwargs["eval_dataset"] = train_dataset
        super().__init__(
            model=model,
            args=args,
            train_dataset=paired,
            data_collator=collator,
            processing_class=processing_class,
            callbacks=callbacks,
            **kwargs,
        )
        if self.ref_model is not None:
            self.ref_model.to(self.args.device)
        if args.gradient_surgery != "sum" and (self.is_deepspeed_enabled or self.is_fsdp_enabled):
            raise ValueError(
                f"gradient_surgery={args.gradient_surgery!r} needs each parameter's full forget and retain gradient "
                "on every process, but DeepSpeed/FSDP shard gradients. Use DDP (plain `accelerate launch` or "
                "torchrun), or gradient_surgery='sum'."
            )
        # Gradient surgery: the forget gradient accumulated over the window lives here while p.grad holds g_r.
        self._trainable_params = [p for p in self.model.parameters() if p.requires_grad]
        self._stored_forget_grads: list[torch.Tensor | None] = [None] * len(self._trainable_params)

        self._metrics: dict[str, list[float]] = defaultdict(list)
        self.add_callback(_RetainPairingCallback(paired))
        self.stopping_callback = ViolationStoppingCallback(
            alpha=args.stop_alpha,
            probe_interval=args.probe_interval,
            stop=bool(args.stop_on_violation),
            hoeffding=args.hoeffding,
            hoeffding_delta=args.hoeffding_delta,
        )
        self.stopping_callback.bind(self.probe)
        if args.probe_interval > 0:
            self.add_callback(self.stopping_callback)
        self.train_wall_seconds: float | None = None
        # Measurements made outside training (before/after metrics, quantization check) for the model card.
        self.evaluation: dict[str, Any] = {}
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names + [args.method])

    @staticmethod
    def _sample(dataset: Sequence[Mapping[str, Any]], size: int, seed: int) -> list[dict[str, list[int]]]:
        order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
        return [model_inputs(dataset[i]) for i in sorted(order[:size])]

    # --- forwards ---------------------------------------------------------------------------------------

    @contextmanager
    def _reference_mode(self, model: nn.Module):
        """The frozen start model: the separate copy, or the PEFT model with its adapters disabled."""
        if self.ref_model is not None:
            yield self.ref_model
            return
        unwrapped = self.accelerator.unwrap_model(model)
        was_training = unwrapped.training
        unwrapped.eval()
        try:
            with unwrapped.disable_adapter():
                yield unwrapped
        finally:
            unwrapped.train(was_training)

    def reference_logits(self, model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Logits of the frozen start model on ``batch`` (no gradient)."""
        return self._reference_outputs(model, batch, hidden_states=False).logits

    def _reference_outputs(self, model: nn.Module, batch: Mapping[str, torch.Tensor], hidden_states: bool) -> Any:
        with torch.no_grad(), self._reference_mode(model) as reference:
            return reference(
                input_ids=batch["input_ids"],
                attention_mask=batch["attention_mask"],
                output_hidden_states=hidden_states,
            )

    def _loss_inputs(self, model: nn.Module, batch: Mapping[str, torch.Tensor], objective: Objective) -> LossInputs:
        """Run the forwards an objective declared it needs: the model's, and the reference model's if asked."""
        hidden = objective.needs_hidden_states
        reference = self._reference_outputs(model, batch, hidden) if objective.needs_reference(self.args) else None
        outputs = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=hidden
        )
        return LossInputs(
            logits=outputs.logits,
            labels=batch["labels"],
            config=self.args,
            reference_logits=None if reference is None else reference.logits,
            attention_mask=batch["attention_mask"],
            hidden_states=outputs.hidden_states if hidden else None,
            reference_hidden_states=reference.hidden_states if hidden and reference is not None else None,
        )

    def _objective_loss(
        self, model: nn.Module, inputs: Mapping[str, Any], part: str, objective: Objective
    ) -> torch.Tensor:
        loss_inputs = self._loss_inputs(model, inputs[part], objective)
        if objective.needs_refusal:
            loss_inputs.refusal = self._loss_inputs(model, inputs["refusal"], objective)
        return objective.fn(loss_inputs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """Weighted sum of the forget and retain objectives (used by evaluation; training backpropagates each)."""
        loss = self.args.forget_weight * self._objective_loss(model, inputs, "forget", self.forget_objective)
        if self.retain_objective is not None and "retain" in inputs:
            retain = self._objective_loss(model, inputs, "retain", self.retain_objective)
            loss = loss + self.args.retain_weight * retain
        return (loss, None) if return_outputs else loss

    def training_step(self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None) -> torch.Tensor:
        """Forward and backward the forget batch, then the retain batch, each on its own graph.

        Two backward passes keep only one graph alive at a time and give each loss its own gradient. With
        ``gradient_surgery='sum'`` the weighted losses simply accumulate into ``p.grad`` (the gradient of the
        summed loss). Otherwise the forget gradient is accumulated in a separate store over the whole
        gradient-accumulation window (swapped in and out of ``p.grad``, so DDP all-reduces it too) and the two
        are combined in place once, at the window's last micro-batch, before Trainer clips and steps.
        """
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        surgery = self.args.gradient_surgery != "sum"
        scale = 1.0 / getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        total = torch.zeros((), device=self.args.device)
        parts = [("forget", self.forget_objective, self.args.forget_weight)]
        if self.retain_objective is not None:
            parts.append(("retain", self.retain_objective, self.args.retain_weight))
        for name, objective, weight in parts:
            with self.compute_loss_context_manager():
                loss = self._objective_loss(model, inputs, name, objective)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"The {name} loss ({objective.name}) is {loss.item()} at step {self.state.global_step + 1}; "
                    "training stopped before this update, so the last saved checkpoint is intact. Lower the "
                    "learning rate or check the data."
                )
            separate = surgery and name == "forget"
            if separate:
                self._swap_forget_gradients()
            # With surgery the weights are applied by the combination, not here.
            self.accelerator.backward((1.0 if surgery else weight) * loss * scale)
            if separate:
                self._swap_forget_gradients()
            self._metrics[f"{name}_loss"].append(loss.detach().item())
            total = total + weight * loss.detach()
        if surgery and self.accelerator.sync_gradients:
            self._combine_gradients()
        return total * scale

    def _is_logging_step(self) -> bool:
        """Whether the optimizer step being prepared will be logged (surgery statistics cost extra passes)."""
        if self.args.logging_strategy != "steps":
            return False
        every = max(int(self.state.logging_steps or self.args.logging_steps or 1), 1)
        return (self.state.global_step + 1) % every == 0 or (
            self.state.global_step == 0 and self.args.logging_first_step
        )

    def _swap_forget_gradients(self) -> None:
        for i, param in enumerate(self._trainable_params):
            param.grad, self._stored_forget_grads[i] = self._stored_forget_grads[i], param.grad

    def _combine_gradients(self) -> None:
        retain_grads = [p.grad for p in self._trainable_params]
        updates, stats = combine_gradients_(
            self._stored_forget_grads,
            retain_grads,
            self.args.gradient_surgery,
            forget_weight=self.args.forget_weight,
            retain_weight=self.args.retain_weight,
            with_stats=self._is_logging_step(),
        )
        for param, update in zip(self._trainable_params, updates):
            if update is not None:
                param.grad = update
        # The forget tensors were consumed by the combination; zero them and keep them as the next window's
        # accumulators: a memset is cheaper than a fresh full-size allocation (and its page faults) every step.
        for stored in self._stored_forget_grads:
            if stored is not None:
                stored.zero_()
        for key, value in stats.items():
            self._metrics[f"surgery/{key}"].append(value)

    # --- probing ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def measure_margins(
        self, examples: Sequence[Mapping[str, Any]], beta: float | None = None, batch_size: int | None = None
    ) -> dict[str, Any]:
        """Violation fractions, answer lengths and answer probabilities of ``examples`` under the current model.

        Uses the one margin implementation with the run's k, competitor source and rho, so the stopping rule,
        the report's exact-reproduction bound and the loss agree on what a violation is.
        """
        reference = None
        if self.args.competitor_source == "teacher":

            def reference(batch: dict[str, torch.Tensor]) -> torch.Tensor:
                return self.reference_logits(self.model, batch)

        return measure_violations(
            self.accelerator.unwrap_model(self.model),
            examples,
            self.pad_token_id,
            k=self.args.masc_k,
            tau=self.args.masc_tau,
            beta=self.args.masc_beta if beta is None else beta,
            delta=self.args.competitor_delta,
            reference_logits=reference,
            batch_size=batch_size or max(self.args.per_device_eval_batch_size, 8),
        )

    def probe(self) -> dict[str, float]:
        """The stopping rule's measurement: violation rate of the stopping probe, plus the other probes' rates."""
        measured: dict[str, float] = {}
        probes = {"train": self.probe_examples, "holdout": self.holdout_examples}
        for name, examples in probes.items():
            if not examples:
                continue
            margins = self.measure_margins(examples)
            measured[f"violation_rate_{name}"] = margins["fractions"].mean().item()
            measured[f"forget_probability_{name}"] = margins["probabilities"].mean().item()
            if name == self.args.stop_probe:
                measured["violation_rate"] = measured[f"violation_rate_{name}"]
                measured["num_examples"] = len(margins["fractions"])
        if self.retain_probe_examples:
            retain = self.measure_margins(self.retain_probe_examples)
            measured["retain_probability"] = retain["probabilities"].mean().item()
        measured = self._agree_across_processes(measured)
        for key, value in measured.items():
            if key != "num_examples":
                self._metrics[key].append(value)
        return measured

    def _agree_across_processes(self, measured: dict[str, float]) -> dict[str, float]:
        """Every process probes the same examples; take rank 0's numbers so all stop at the same step."""
        if self.accelerator.num_processes == 1:
            return measured
        from accelerate.utils import broadcast_object_list

        holder = [measured]
        broadcast_object_list(holder, from_process=0)
        return holder[0]

    def evaluate(
        self,
        eval_dataset: Any = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
        retain_only_truth_ratios: Sequence[float] | None = None,
    ) -> dict[str, float]:
        """Unlearning metrics of the current model, through :func:`hf_unlearn.evaluation.evaluate_unlearning` (the
        code path of ``hf-unlearn eval`` and the demo): ROUGE-L, Prob, exact match and truth ratio on the forget
        and retain sets, model utility, the exact-reproduction bound and, given the retain-only model's forget
        truth ratios, forget quality. ``eval_dataset`` (a retain-like set, or a dict of them) adds sets that count
        towards model utility. Called by Trainer for ``eval_strategy``; logged as ``eval_forget_rouge_l_recall`` etc.
        """
        from .evaluation import evaluate_unlearning

        for name, records in (("forget", self.forget_records), ("retain", self.retain_records)):
            if records is not None and "question" not in getattr(records, "column_names", records[0]):
                raise ValueError(
                    f"evaluate() reads the {name} set's question and answer columns, which it does not have; "
                    "build it with hf_unlearn.build_qa_dataset, which keeps them."
                )
        if eval_dataset is None and self.eval_dataset is not self.forget_records:
            eval_dataset = self.eval_dataset
        extra = eval_dataset if isinstance(eval_dataset, dict) else {"eval": eval_dataset} if eval_dataset else None
        result = evaluate_unlearning(
            self.model,
            self.processing_class,
            self.forget_records,
            self.retain_records,
            retain_only_truth_ratios=retain_only_truth_ratios,
            extra_retain_sets=extra,
            k=self.args.masc_k,
            rho=self.args.masc_rho,
        )
        metrics: dict[str, float] = {}
        for name, value in result.items():
            if isinstance(value, dict):
                metrics.update({f"{metric_key_prefix}_{name}_{k}": v for k, v in value.items() if v is not None})
            elif isinstance(value, (int, float)):
                metrics[f"{metric_key_prefix}_{name}"] = value
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics)
        return metrics

    def exact_reproduction_bound(self, examples: Sequence[Mapping[str, Any]] | None = None) -> dict[str, float]:
        """MASC Proposition 1 on ``examples`` (default: the trained forget examples), at beta = 1."""
        if examples is None:
            examples = [model_inputs(self.train_dataset.forget[i]) for i in range(len(self.train_dataset))]
        margins = self.measure_margins(examples, beta=1.0)
        bounds = exact_reproduction_bound(margins["fractions"], margins["lengths"], self.args.masc_rho)
        return {
            "mean": bounds.mean().item(),
            "max": bounds.max().item(),
            "violation_rate": margins["fractions"].mean().item(),
        }

    # --- Trainer hooks ----------------------------------------------------------------------------------

    # --- model card and Hub ----------------------------------------------------------------------------

    def unlearning_record(self) -> dict[str, Any]:
        """What the model card records: method, objectives, hyperparameters, stop, bound, and any measurements
        stored in ``self.evaluation`` (``before`` / ``after`` / ``quantization``, filled by the hf-unlearn jobs)."""
        from .report import build_report

        record = build_report(self, self.evaluation.get("before", {}), self.evaluation.get("after", {}))
        record.pop("history", None)
        record.pop("surgery_history", None)
        model = self.accelerator.unwrap_model(self.model)
        base = model.get_base_model() if _is_peft_model(model) else model
        name = getattr(base.config, "_name_or_path", None) or None
        record.update(
            base_model=name if name and not os.path.isdir(name) else None,
            model_name=self.args.hub_model_id or os.path.basename(os.path.abspath(self.args.output_dir)),
            forget_dataset=self.evaluation.get("forget_dataset"),
            retain_dataset=self.evaluation.get("retain_dataset"),
            quantization=self.evaluation.get("quantization"),
            tags=list(getattr(self.model, "model_tags", None) or []),
        )
        return record

    def create_model_card(self, model_name: str | None = None, tags: Any = None, **kwargs: Any) -> None:
        """Write README.md (the unlearning model card) into ``output_dir``; replaces Trainer's generic draft."""
        if not self.is_world_process_zero():
            return
        from .model_card import write_model_card

        record = self.unlearning_record()
        if model_name:
            record["model_name"] = model_name
        if tags:
            record["tags"] = sorted(set(record["tags"]) | set([tags] if isinstance(tags, str) else tags))
        write_model_card(record, self.args.output_dir, repo_id=self.args.hub_model_id)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as Trainer does, plus the model card, so every checkpoint and final save says what was done."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            from .model_card import write_model_card

            write_model_card(self.unlearning_record(), output_dir or self.args.output_dir, self.args.hub_model_id)

    def push_to_hub(self, *args: Any, **kwargs: Any) -> Any:
        """Push as Trainer does, but first make sure the Hub is reachable, so that without a network nothing is
        written or changed on disk before the failure."""
        from .hub import ensure_hub_reachable

        ensure_hub_reachable(self.args.output_dir)
        return super().push_to_hub(*args, **kwargs)

    def _load_callback_state(self) -> None:
        super()._load_callback_state()
        # Trainer rebuilds stateful callbacks from their exported args; give the rebuilt one its probe back.
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, ViolationStoppingCallback):
                callback.bind(self.probe)
                self.stopping_callback = callback

    def train(self, *args: Any, **kwargs: Any):
        start = time.perf_counter()
        output = super().train(*args, **kwargs)
        self.train_wall_seconds = time.perf_counter() - start
        return output

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add the mean forget/retain losses and the latest probe numbers since the last log."""
        if "loss" in logs:  # training logs only
            for key, values in self._metrics.items():
                if values:
                    averaged = key.endswith("_loss") or key.startswith("surgery/")
                    logs[key] = sum(values) / len(values) if averaged else values[-1]
            self._metrics.clear()
        super().log(logs, start_time)
