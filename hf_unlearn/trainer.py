"""`UnlearnTrainer`: a `transformers.Trainer` whose train dataset is the data to forget.

Glue only: it pairs forget with retain batches, runs the forwards each registered objective declared it needs,
and backpropagates the forget part and the retain part separately through Trainer's own ``training_step`` (so
that gradient surgery gets two gradients). Trainer's training loop, loss scaling, DeepSpeed handling,
checkpointing, logging, accelerate and PEFT handling are used unchanged. At the end of training it produces the
run's :class:`~hf_unlearn.record.UnlearnRecord`, which every report reads.
"""

from __future__ import annotations

import copy
import math
import os
import time
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

import torch
from torch import nn
from transformers import PreTrainedModel, Trainer, TrainerCallback
from transformers.utils import is_peft_available, logging

from .callbacks import ObjectiveStateCallback, ViolationStoppingCallback
from .config import UnlearnConfig, sharded_surgery_error
from .data import (
    IGNORE_INDEX,
    ContinuationScoring,
    ForgetRetainCollator,
    ForgetRetainDataset,
    ensure_pad_token,
    model_inputs,
    split_holdout,
)
from .ledger import forget_set_fingerprint, full_ledger, load_ledger, save_ledger
from .margin import (
    calibration_gap,
    exact_reproduction_bound,
    measure_violations,
    restricted_margin,
    shift_for_causal_lm,
    token_log_probs,
    violation_fractions,
)
from .objectives import FORGET_OBJECTIVES, RETAIN_OBJECTIVES, LossInputs, Objective, get_objective
from .output_dir import check_writable, prepare_output_dir
from .record import UnlearnRecord
from .surgery import SURGERY_PAPER, combine_gradients_, local_shards

if is_peft_available():
    from peft import PeftModel, get_peft_model
else:  # pragma: no cover - peft is a dependency, kept optional for users who strip it
    PeftModel = None

logger = logging.get_logger(__name__)

# Training settings that shape every run, recorded next to each objective's own hyperparameters.
TRAINING_HYPERPARAMETERS = (
    "learning_rate",
    "lr_scheduler_type",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "max_grad_norm",
    "optim",
    "weight_decay",
    "seed",
    "bf16",
    "forget_weight",
    "retain_weight",
    "gradient_surgery",
)
STOPPING_HYPERPARAMETERS = (
    "stop_target",
    "stop_alpha",
    "calibration_slack",
    "probe_interval",
    "stop_probe",
    "holdout_fraction",
    "probe_size",
    "hoeffding",
    "hoeffding_delta",
    "running_probe",
)
GUARD_HYPERPARAMETERS = ("utility_floor", "restore_on_failure", "keep_best_state")
CONTINUATION_HYPERPARAMETERS = (
    "forget_scoring",
    "continuation_cut_min_ratio",
    "continuation_cut_max_ratio",
    "continuation_min_prefix_tokens",
    "continuation_min_suffix_tokens",
)
PARTS = ("forget", "retain")


def _is_peft_model(model: nn.Module) -> bool:
    return PeftModel is not None and isinstance(model, PeftModel)


def _loaded_from(model: nn.Module) -> str | None:
    """The local folder the (base) model was loaded from, if it was loaded from one."""
    base = model.get_base_model() if _is_peft_model(model) else model
    path = getattr(getattr(base, "config", None), "_name_or_path", None) or None
    return path if path and os.path.isdir(path) else None


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


def check_unlearning_data(
    model: nn.Module,
    args: UnlearnConfig,
    forget: Sequence[Mapping[str, Any]],
    retain: Sequence[Mapping[str, Any]] | None,
    calibration: Sequence[Mapping[str, Any]] | None = None,
    forget_name: str = "forget",
    retain_hint: str = "retain_dataset=...",
) -> None:
    """Everything :class:`UnlearnTrainer` refuses in its data before a weight changes: empty sets, examples without
    answer tokens or longer than the model's context, a retain set missing for a retain term, forget examples that
    are also retain or calibration examples, missing alternative answers (AltPO). ``retain_hint`` says how to pass
    a retain set where the caller is not the trainer (e.g. a CLI flag)."""
    forget_objective, retain_objective = args.objectives
    _check_examples(forget, forget_name)
    if retain_objective != "none":
        if retain is None:
            raise ValueError(
                f"Method {args.method!r} has the retain term {retain_objective!r} and needs a retain_dataset. "
                f"Pass {retain_hint}, or retain_loss='none' to unlearn without one."
            )
        _check_examples(retain, "retain")
    _check_context_length(model, forget, forget_name)
    if retain is not None:
        _check_context_length(model, retain, "retain")
        _check_overlap(forget, retain, "retain")
    if calibration is not None:
        _check_overlap(forget, calibration, "calibration")
        _check_examples(calibration, "calibration")
        _check_context_length(model, calibration, "calibration")
    if get_objective(FORGET_OBJECTIVES, forget_objective, "forget").needs_alternate:
        _alternate_answers(forget, args.alternate_column, forget_objective)


def _warn_if_nothing_is_cut(dataset: Sequence[Mapping[str, Any]], args: UnlearnConfig) -> None:
    """forget_scoring='continuation' on examples too short to split scores them whole: say so rather than let a
    user believe the prefix is context (typical of short QA answers under the reference's 32 + 32 tokens)."""
    needed = args.continuation_min_prefix_tokens + args.continuation_min_suffix_tokens
    long_enough = sum(
        1 for i in range(len(dataset)) if sum(label != IGNORE_INDEX for label in dataset[i]["labels"][1:]) >= needed
    )
    if long_enough < len(dataset):
        logger.warning(
            f"forget_scoring='continuation': {len(dataset) - long_enough} of {len(dataset)} forget examples have "
            f"fewer than {needed} scored tokens (continuation_min_prefix_tokens + continuation_min_suffix_tokens), "
            "so they are scored whole, as with forget_scoring='answer'. Lower the two minimums for short texts."
        )


def _alternate_answers(examples: Sequence[Mapping[str, Any]], column: str, objective: str) -> list[str]:
    """Example i's alternative answer from ``column``: the text, or the (i mod n)-th of a list (AltPO)."""
    answers = []
    for i, example in enumerate(examples):
        value = example.get(column)
        if isinstance(value, list | tuple):
            value = value[i % len(value)] if value else None
        if not isinstance(value, str) or not value.strip():
            raise ValueError(
                f"{objective!r} needs a plausible alternative answer for every forget example in column {column!r} "
                f"(alternate_column); forget example {i} has {value!r}. Add the column (e.g. TOFU's perturbed_answer) "
                "or set alternate_column."
            )
        answers.append(value)
    return answers


def _zero_stage(accelerator: Any) -> int | None:
    plugin = getattr(accelerator.state, "deepspeed_plugin", None)
    return None if plugin is None else int(plugin.deepspeed_config.get("zero_optimization", {}).get("stage", 0))


# Placeholder for a reference copy of a ZeRO-3-partitioned model, made once DeepSpeed is set up.
_ZERO3_COPY = nn.Identity()


def zero3_partitioned(model: nn.Module) -> bool:
    """Whether DeepSpeed ZeRO-3 partitioned the model's weights (loaded under zero.Init, or prepared)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _zero3_copy(model: nn.Module, accelerator: Any, reference_dtype: str | None = None) -> nn.Module:
    """A copy of a model whose weights ZeRO-3 partitioned at load time: the same class built under ``zero.Init``
    (partitioned from the start) and filled one gathered parameter at a time, so no process ever holds two whole
    models. (A deep copy would copy the empty placeholders.)"""
    import deepspeed
    from transformers.integrations import is_deepspeed_zero3_enabled

    dtype = getattr(torch, reference_dtype) if reference_dtype else next(model.parameters()).dtype
    if is_deepspeed_zero3_enabled():  # transformers builds it under zero.Init itself (and skips the random init)
        reference = model.__class__._from_config(model.config, dtype=dtype)
    else:
        with deepspeed.zero.Init(config_dict_or_path=accelerator.state.deepspeed_plugin.deepspeed_config):
            reference = model.__class__._from_config(model.config, dtype=dtype)
    with torch.no_grad():
        for source, target in zip(model.parameters(), reference.parameters(), strict=True):
            with deepspeed.zero.GatheredParameters([source, target], modifier_rank=0):
                target.data.copy_(source.data)
    return reference


def _deepspeed_reference(reference: nn.Module, accelerator: Any) -> nn.Module:
    """A frozen reference partitioned by ZeRO-3 like the trained model, through an inference-only DeepSpeed engine
    (the way TRL prepares reference models): the training configuration without optimizer or scheduler, and the
    size-dependent settings left 'auto' set from the model's hidden size (DeepSpeed rejects 'auto')."""
    import deepspeed

    config = copy.deepcopy(accelerator.state.deepspeed_plugin.deepspeed_config)
    for section in ("optimizer", "scheduler"):
        config.pop(section, None)
    zero = config.setdefault("zero_optimization", {})
    hidden = getattr(getattr(reference, "config", None), "hidden_size", None) or 1024
    sizes = {
        "reduce_bucket_size": hidden * hidden,
        "stage3_param_persistence_threshold": 10 * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
    }
    for key, value in sizes.items():
        if zero.get(key, "auto") == "auto":
            zero[key] = value
    zero.pop("offload_optimizer", None)
    config = {key: value for key, value in config.items() if value != "auto"}
    config.setdefault("train_micro_batch_size_per_gpu", 1)
    engine, *_ = deepspeed.initialize(model=reference, config=config)
    return engine


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


def _check_overlap(forget: Sequence[Mapping[str, Any]], other: Sequence[Mapping[str, Any]], name: str) -> None:
    """A forget example that is also in the retain (or calibration) set is trained both ways; all of them is a
    mistake, some of them worth a warning."""
    other_examples = {tuple(other[i]["input_ids"]) for i in range(len(other))}
    shared = [i for i in range(len(forget)) if tuple(forget[i]["input_ids"]) in other_examples]
    if shared and len(shared) == len(forget):
        raise ValueError(
            f"Every forget example is also in the {name} set, so the run would forget and "
            f"{'keep' if name == 'retain' else 'calibrate on'} the same text. Pass the {name} data you meant."
        )
    if shared:
        logger.warning(
            f"{len(shared)} of {len(forget)} forget examples are also in the {name} set (forget indices "
            f"{shared[:5]}); they are pushed away and {'kept' if name == 'retain' else 'used as never-seen data'} "
            f"at once. Remove them from the {name} set unless that is intended."
        )


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


def _has_dropout(model: nn.Module) -> bool:
    """Whether training-mode forwards are random (dropout modules, or attention/residual dropout in the config)."""
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    values = config.to_dict().items() if config is not None and hasattr(config, "to_dict") else []
    return any(
        ("dropout" in key or "pdrop" in key) and isinstance(value, (int, float)) and value > 0
        for key, value in values
        if not key.startswith("classifier")
    )


def _dataset_description(dataset: Any, num_examples: int | None = None) -> dict[str, Any]:
    """Name (when the dataset knows it: a Hub dataset's name and config) and size, for the run record."""
    info = getattr(dataset, "info", None)
    name = getattr(info, "dataset_name", None) if info is not None else None
    config_name = getattr(info, "config_name", None) if info is not None else None
    if name and config_name and config_name != "default":
        name = f"{name} / {config_name}"
    return {"name": name, "num_examples": len(dataset) if num_examples is None else num_examples}


def count_items(batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``[answer tokens, sequences, attended tokens]`` of one padded batch (the units objectives are averaged
    over, see :data:`hf_unlearn.objectives.NORMALIZATIONS`); answer tokens counted after the causal shift."""
    labels = batch["labels"]
    answer_tokens = (labels[..., 1:] != IGNORE_INDEX).sum()
    attended = batch["attention_mask"].sum() if "attention_mask" in batch else torch.tensor(labels.numel())
    return torch.stack(
        [answer_tokens, torch.tensor(labels.shape[0], device=labels.device), attended.to(labels.device)]
    )


_UNIT_INDEX = {"answer_tokens": 0, "sequences": 1, "attended_tokens": 2}


class _RetainPairingCallback(TrainerCallback):
    """Tell the paired dataset which epoch it is in, so retain pairs rotate deterministically."""

    def __init__(self, dataset: ForgetRetainDataset) -> None:
        self.dataset = dataset

    def on_epoch_begin(self, args, state, control, **kwargs):
        self.dataset.set_epoch(math.floor(state.epoch + 1e-9) if state.epoch else 0)


class UnlearnTrainer(Trainer):
    """Trainer for LLM unlearning: ``train_dataset`` is forgotten while ``retain_dataset`` is kept.

    Implements MASC (margin self-correction, arXiv 2606.02920) with its online stopping rule, the objectives
    registered in :mod:`hf_unlearn.objectives`, and retention-first gradient surgery (arXiv 2604.14808).

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

    After ``train()``, :attr:`record` is the run's :class:`~hf_unlearn.record.UnlearnRecord`.
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
        check_unlearning_data(model, args, train_dataset, retain_dataset, calibration_dataset)
        if args.stop_target == "auto":
            args.stop_target = "calibration" if calibration_dataset is not None else "alpha"
            logger.info(f"UnlearnTrainer: stop_target='auto' resolved to {args.stop_target!r}.")
        elif args.stop_target == "calibration" and calibration_dataset is None:
            raise ValueError(
                "stop_target='calibration' compares the forget set with data the model never trained on: pass "
                "calibration_dataset=... (same kind of examples, tokenized the same way), or stop_target='alpha'."
            )
        if args.masc_threshold == "auto":
            args.masc_threshold = "calibration" if calibration_dataset is not None else "rho"
        elif args.masc_threshold == "calibration" and calibration_dataset is None:
            raise ValueError(
                "masc_threshold='calibration' takes each token's threshold from data the model never trained on: "
                "pass calibration_dataset=..., or masc_threshold='rho'."
            )
        if processing_class is not None:
            ensure_pad_token(processing_class)
        for objective in self._objectives():
            if objective.prepare is not None:
                objective.prepare(model, args)
        if peft_config is not None:
            if _is_peft_model(model):
                raise ValueError("The model is already a PEFT model; pass peft_config=None or the base model.")
            model = get_peft_model(model, peft_config)
        if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_quantized", False):
            from .quantize import keep_4bit_layers_trainable

            keep_4bit_layers_trainable(model)
        if not any(p.requires_grad for p in model.parameters()):
            raise ValueError("The model has no trainable parameters (all requires_grad=False): nothing can change.")

        if any(objective.needs_reference(args) for objective in self._objectives()):
            if ref_model is None and not _is_peft_model(model):
                # Weights ZeRO-3 partitioned at load time cannot be deep-copied; they are copied partition-wise into
                # a model built under zero.Init once DeepSpeed is set up (in _prepare_reference).
                ref_model = _ZERO3_COPY if zero3_partitioned(model) else _frozen_copy(model)
                if args.reference_dtype is not None and ref_model is not _ZERO3_COPY:
                    # A cheaper reference for full fine-tuning: half the memory, logits upcast by the objectives.
                    ref_model.to(getattr(torch, args.reference_dtype))
            elif args.reference_dtype is not None and _is_peft_model(model):
                logger.warning(
                    "UnlearnTrainer: reference_dtype is ignored for a PEFT model, whose reference is its own base "
                    "with the adapters off (no copy is made)."
                )
        if ref_model is not None and ref_model is not _ZERO3_COPY:
            ref_model.eval().requires_grad_(False)
        self.ref_model = ref_model

        # Held-out forget examples never enter a training batch; both probes are fixed for the whole run.
        trained_idx, holdout_idx = split_holdout(
            len(train_dataset), args.holdout_fraction, args.data_seed or args.seed
        )
        forget_train = [train_dataset[i] for i in trained_idx]
        # forget_scoring='continuation': the probes score a fixed continuation per example, the training batches
        # one drawn anew each epoch (ForgetRetainDataset's forget_labels).
        self._score_forget = ContinuationScoring.from_config(args, args.data_seed or args.seed)
        if self._score_forget.enabled:
            _warn_if_nothing_is_cut(train_dataset, args)
        self.holdout_examples = [self._score_forget(model_inputs(train_dataset[i]), i) for i in holdout_idx]
        self.probe_examples = [
            self._score_forget(example, i)
            for i, example in enumerate(self._sample(forget_train, args.probe_size, args.seed))
        ]
        self.retain_probe_examples = (
            self._sample(retain_dataset, args.probe_size, args.seed + 1) if retain_dataset is not None else []
        )
        self.calibration_examples = (
            [
                self._score_forget(example, i)
                for i, example in enumerate(self._sample(calibration_dataset, args.probe_size, args.seed + 2))
            ]
            if calibration_dataset is not None
            else []
        )
        refusals = None
        if self.forget_objective.needs_refusal or self.forget_objective.needs_alternate:
            what = "refusal" if self.forget_objective.needs_refusal else "alternate"
            if processing_class is None:
                raise ValueError(
                    f"{forget_name!r} writes {what} answers and needs the tokenizer: pass processing_class=tokenizer."
                )
            answers = (
                [args.refusal_answers[i % len(args.refusal_answers)] for i in range(len(forget_train))]
                if what == "refusal"
                else _alternate_answers(forget_train, args.alternate_column, forget_name)
            )
            refusals = [
                refusal_example(processing_class, example, answer)
                for example, answer in zip(forget_train, answers, strict=True)
            ]
        # What evaluate() measures: the forget and retain records as given (question/answer columns kept).
        self.forget_records = train_dataset
        # The request ledger: this forget set's fingerprint, and the requests the model went through before
        # (the ledger of the folder it was loaded from; set it directly to chain runs in memory).
        self.forget_fingerprint = forget_set_fingerprint(train_dataset)
        self.earlier_requests: list[dict[str, Any]] = load_ledger(_loaded_from(model))
        self.retain_records = retain_dataset
        self._datasets = {
            "forget_dataset": {
                **_dataset_description(train_dataset),
                "num_trained": len(trained_idx),
                "num_held_out": len(holdout_idx),
            },
            "retain_dataset": _dataset_description(retain_dataset) if retain_dataset is not None else None,
            "calibration_dataset": (
                _dataset_description(calibration_dataset) if calibration_dataset is not None else None
            ),
        }
        paired = ForgetRetainDataset(
            forget_train,
            retain_dataset if self.retain_objective is not None else None,
            seed=args.seed,
            refusal=refusals,
            forget_labels=self._score_forget if args.forget_scoring == "continuation" else None,
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
        if args.gradient_surgery != "sum" and self.is_deepspeed_enabled:
            # FSDP/DeepSpeed may come from an accelerate config rather than from args (checked in UnlearnConfig).
            raise sharded_surgery_error(args.gradient_surgery, "DeepSpeed")
        if args.gradient_surgery != "sum" and self.is_fsdp_enabled and not self.accelerator.is_fsdp2:
            raise sharded_surgery_error(args.gradient_surgery, "FSDP1")
        if self.ref_model is not None:
            self.ref_model = self._prepare_reference(self.ref_model)
        # The parameters the optimizer steps, bound when training starts (see _trainable), and, for gradient surgery,
        # the forget gradient accumulated over the window while p.grad holds g_r.
        self._trainable_params: list[torch.Tensor] | None = None
        self._stored_forget_grads: list[torch.Tensor | None] = []
        # Running sums kept on the device and read only when Trainer logs (no host sync per step).
        self._loss_sums: dict[str, torch.Tensor] = {}
        self._surgery_sums: dict[str, torch.Tensor] = {}
        self._surgery_steps = 0
        self._steps_since_log = 0
        self._nonfinite: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._probe_metrics: dict[str, float] = {}
        self._items_are_global = False

        # The 'train' probe from the forget batches' own forwards, where that equals an eval-mode probe: no dropout,
        # and teacher competitors only when the objective brings the teacher's logits.
        self._running = (
            bool(args.running_probe)
            and args.probe_interval > 0
            and (args.competitor_source == "self" or self.forget_objective.needs_reference(args))
        )
        if self._running and _has_dropout(self.model):
            self._running = False
            logger.info("UnlearnTrainer: the model has dropout, so the probes run extra eval-mode forwards.")
        self._running_sums: dict[str, torch.Tensor] = {}
        self._running_margins: list[torch.Tensor] = []  # forget margins since the last probe (calibrated target)
        self._calibration_margins: torch.Tensor | None = None
        self._snapshots: dict[str, tuple[int, list[torch.Tensor]]] = {}
        self._restored_step: int | None = None
        self._probe_seconds = 0.0

        self.add_callback(_RetainPairingCallback(paired))
        # Objectives with state across steps (PDU's dual variable): kept, updated and checkpointed by one callback.
        self.objective_state_callback = ObjectiveStateCallback(
            {o.name: o.initial_state(args) for o in self._objectives() if o.initial_state is not None}
        )
        if self.objective_state_callback.states:
            self.objective_state_callback.bind(self._update_objective_states)
            self.add_callback(self.objective_state_callback)
        floor = args.utility_floor or None
        if floor and retain_dataset is None:
            logger.warning("UnlearnTrainer: no retain set, so the utility floor cannot be watched; it is off.")
            floor = None
        self.stopping_callback = ViolationStoppingCallback(
            alpha=args.stop_alpha,
            probe_interval=args.probe_interval,
            stop=bool(args.stop_on_violation),
            hoeffding=args.hoeffding,
            hoeffding_delta=args.hoeffding_delta,
            target=args.stop_target,
            calibration_slack=args.calibration_slack,
            utility_floor=floor,
        )
        self._bind_stopping_callback(self.stopping_callback)
        if args.probe_interval > 0:
            self.add_callback(self.stopping_callback)
        self._train_seconds: float | None = None
        self.record: UnlearnRecord = self._make_record(final=False)
        if hasattr(self.model, "add_model_tags"):
            self.model.add_model_tags(self._tag_names + [args.method])

    def _update_objective_states(self, states: dict[str, dict[str, Any]], step: int) -> None:
        """After an optimizer step: advance each stateful objective, with a mean over processes to keep them equal."""

        def across_processes(value: torch.Tensor) -> float:
            # Each process's value is its share of the global mean when the item counts were summed over processes
            # (average_tokens_across_devices), else its own mean.
            if self.accelerator.num_processes > 1:
                reduction = "sum" if self._items_are_global else "mean"
                value = self.accelerator.reduce(value.to(self.args.device), reduction=reduction)
            return float(value)

        for objective in self._objectives():
            if objective.update_state is not None and objective.name in states:
                objective.update_state(states[objective.name], self.args, step, across_processes)

    def _objective_state(self, objective: Objective, training: bool) -> dict[str, Any] | None:
        state = self.objective_state_callback.states.get(objective.name)
        if state is None or training:
            return state
        # Outside training (evaluate()), read the state without adding to what the next update consumes.
        return {key: value for key, value in state.items() if not key.startswith("_")}

    def _objectives(self) -> list[Objective]:
        return [o for o in (self.forget_objective, self.retain_objective) if o is not None]

    def _parts(self) -> list[tuple[str, Objective, float]]:
        parts = [("forget", self.forget_objective, self.args.forget_weight)]
        if self.retain_objective is not None:
            parts.append(("retain", self.retain_objective, self.args.retain_weight))
        return parts

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

    def _loss_inputs(
        self, model: nn.Module, batch: Mapping[str, torch.Tensor], objective: Objective, num_items: Any
    ) -> LossInputs:
        """Run the forwards an objective declared it needs: the model's, and the reference model's if asked."""
        hidden = objective.needs_hidden_states
        reference = self._reference_outputs(model, batch, hidden) if objective.needs_reference(self.args) else None
        calibration = None
        if objective.needs_calibration(self.args):
            if self._calibration_margins is None:  # before the first probe
                self._calibration_margins = self._measure_calibration()["margins"].sort().values.to(self.args.device)
            calibration = self._calibration_margins
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
            num_items=num_items,
            calibration_margins=calibration,
            state=self._objective_state(objective, model.training),
        )

    def _objective_loss(
        self, model: nn.Module, inputs: Mapping[str, Any], part: str, objective: Objective, num_items: Any = None
    ) -> torch.Tensor:
        count = None if num_items is None else num_items[part][_UNIT_INDEX[objective.normalized_by]]
        loss_inputs = self._loss_inputs(model, inputs[part], objective, count)
        if self._running and model.training:
            self._accumulate_running(part, loss_inputs)
        if objective.needs_refusal or objective.needs_alternate:
            loss_inputs.refusal = self._loss_inputs(model, inputs["refusal"], objective, count)
        return objective.fn(loss_inputs)

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
            if model.training:
                self._track(part, loss.detach())
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
        if not batch_samples:
            return None
        counts = {}
        for part in PARTS:
            if part in batch_samples[0]:
                counts[part] = sum(count_items(batch[part]).to(device) for batch in batch_samples)
        self._items_are_global = bool(self.args.average_tokens_across_devices and self.args.world_size > 1)
        if self._items_are_global:
            stacked = torch.stack([counts[part] for part in counts])
            stacked = self.accelerator.gather(stacked.unsqueeze(0)).sum(0)
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
            self._swap_forget_gradients()
        with self._no_deepspeed_step_before_the_retain_part("retain" in inputs):
            loss = super().training_step(model, forget_part, num_items_in_batch)
        if surgery:
            self._swap_forget_gradients()
            loss = self.args.forget_weight * loss  # what Trainer logs is the weighted total either way
        if "retain" in inputs:
            retain = super().training_step(model, {"retain": inputs["retain"]}, num_items_in_batch)
            loss = loss + (self.args.retain_weight * retain if surgery else retain)
        if self.accelerator.sync_gradients:
            self._raise_on_nonfinite_loss()
            if surgery:
                self._combine_gradients()
            self._steps_since_log += 1
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

    def _track(self, part: str, loss: torch.Tensor) -> None:
        """Accumulate the part's loss for logging and remember a non-finite one, on the device."""
        self._loss_sums[part] = self._loss_sums.get(part, torch.zeros((), device=loss.device)) + loss.float()
        bad = ~torch.isfinite(loss)
        if part in self._nonfinite:
            seen, first = self._nonfinite[part]
            self._nonfinite[part] = (seen | bad, torch.where(seen, first, loss.float()))
        else:
            self._nonfinite[part] = (bad, loss.float())

    def _raise_on_nonfinite_loss(self) -> None:
        """Before the optimizer step: a NaN/inf loss anywhere in the window stops the run (one host read per step)."""
        if not self._nonfinite:
            return
        flags = {part: seen for part, (seen, _) in self._nonfinite.items()}
        if bool(torch.stack(list(flags.values())).any()):
            part = next(p for p, seen in flags.items() if bool(seen))
            objective = self.forget_objective if part == "forget" else self.retain_objective
            value = self._nonfinite[part][1].item()
            raise FloatingPointError(
                f"The {part} loss ({objective.name}) is {value} at step {self.state.global_step + 1}; training "
                "stopped before this update, so the last saved checkpoint is intact. Lower the learning rate or "
                "check the data."
            )
        self._nonfinite.clear()

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
            self._stored_forget_grads = [None] * len(self._trainable_params)
        return self._trainable_params

    @property
    def _runs_zero3(self) -> bool:
        return bool(self.is_deepspeed_enabled and _zero_stage(self.accelerator) == 3)

    @property
    def weights_are_sharded(self) -> bool:
        """Whether no process holds the whole model (FSDP, DeepSpeed ZeRO-3): forwards must then run on every
        process, and whole-model checks (quantization, audit) belong to the saved model."""
        return bool(self.is_fsdp_enabled or self._runs_zero3)

    def _prepare_reference(self, reference: nn.Module) -> nn.Module:
        """The separate frozen reference, placed like the trained model: under FSDP2 sharded with the same plan
        (every process holds its shards and gathers a layer at a time, as TRL prepares its reference models);
        under DeepSpeed ZeRO-3 partitioned by an inference-only DeepSpeed engine; otherwise whole on the device."""
        if self.is_fsdp_enabled and self.accelerator.is_fsdp2 and reference is not _ZERO3_COPY:
            from accelerate.utils.fsdp_utils import fsdp2_prepare_model

            # No .to(device) first: fully_shard moves each process's shards itself (and with
            # cpu_ram_efficient_loading the weights of ranks > 0 are on the meta device until rank 0's are broadcast).
            reference = fsdp2_prepare_model(self.accelerator, reference)
        elif self._runs_zero3:
            if reference is _ZERO3_COPY:
                reference = _zero3_copy(
                    self.accelerator.unwrap_model(self.model), self.accelerator, self.args.reference_dtype
                )
            reference = _deepspeed_reference(reference, self.accelerator)
        elif reference is _ZERO3_COPY:
            raise ValueError(
                "The model's weights are partitioned by DeepSpeed ZeRO-3 (loaded under zero.Init), but this Trainer "
                "does not run ZeRO-3: pass the same DeepSpeed configuration (deepspeed=... or the accelerate config) "
                "that was active when the model was loaded."
            )
        else:
            reference = reference.to(self.args.device)
        reference.eval()  # (DeepSpeed's engine returns None here)
        reference.requires_grad_(False)
        return reference

    def _swap_forget_gradients(self) -> None:
        for i, param in enumerate(self._trainable()):
            param.grad, self._stored_forget_grads[i] = self._stored_forget_grads[i], param.grad

    def _combine_gradients(self) -> None:
        # Sharded (FSDP2 DTensor) gradients are combined shard by shard, the dot products summed across processes;
        # the update is written into the retain shards, i.e. into the parameters' DTensor gradients.
        forget_grads, retain_grads, reduce_sum = local_shards(
            self._stored_forget_grads, [p.grad for p in self._trainable()]
        )
        updates, stats = combine_gradients_(
            forget_grads,
            retain_grads,
            self.args.gradient_surgery,
            forget_weight=self.args.forget_weight,
            retain_weight=self.args.retain_weight,
            # The statistics cost a few passes over the gradients; they only serve Trainer's logs.
            with_stats=self.args.logging_strategy != "no",
            reduce_sum=reduce_sum,
        )
        for param, update in zip(self._trainable(), updates):
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
        for stored in self._stored_forget_grads:
            if stored is not None:
                stored.zero_()
        for key, value in stats.items():
            self._surgery_sums[key] = self._surgery_sums.get(key, 0) + value
        self._surgery_steps += 1

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Add, to Trainer's training logs, the mean forget/retain losses and surgery statistics since the last
        log (read from the device here, once per log) and the latest probe numbers."""
        if "loss" in logs:  # training logs only; Trainer calls this on every process
            steps = max(self._steps_since_log, 1)
            for part, total in self._loss_sums.items():
                gathered = self.accelerator.gather(total.reshape(1)) if self.args.world_size > 1 else total
                logs[f"{part}_loss"] = gathered.mean().item() / steps
            if self._surgery_steps:
                for key, total in self._surgery_sums.items():
                    logs[f"surgery/{key}"] = float(total) / self._surgery_steps
            logs.update(self._probe_metrics)
            self._loss_sums.clear()
            self._surgery_sums.clear()
            self._surgery_steps = self._steps_since_log = 0
            self._probe_metrics = {}
        super().log(logs, start_time)

    # --- probing ----------------------------------------------------------------------------------------

    @torch.no_grad()
    def _accumulate_running(self, part: str, inputs: LossInputs) -> None:
        """Per-example statistics of a forget batch from its own logits, summed on the device until the next probe:
        [violation fraction, answer probability, examples] (and the token margins, for the calibrated target). They
        are what a probe would measure on these examples in eval mode (no dropout: checked at construction), at the
        weights of the step that trained on them. The retain side is not measured this way: the utility floor needs
        the current weights and more than one batch (measured: the running retain probability lags an update behind
        and swings 0.41-0.88 between 4-example windows where a fixed 64-example sample reads 0.48-0.82)."""
        if part != "forget":
            return
        logits = inputs.logits.detach()
        log_probs, mask = token_log_probs(logits, inputs.labels)
        lengths = mask.sum(-1)
        scored = (lengths > 0).float()
        probabilities = torch.exp(log_probs.sum(-1) / lengths.clamp(min=1)) * scored
        shifted, labels = shift_for_causal_lm(logits, inputs.labels)
        teacher = None
        if self.args.competitor_source == "teacher":
            teacher, _ = shift_for_causal_lm(inputs.reference_logits.detach(), inputs.labels)
        margins = restricted_margin(
            shifted,
            labels,
            k=self.args.masc_k,
            beta=self.args.masc_beta,
            teacher_logits=teacher,
            delta=self.args.competitor_delta,
        )
        fractions, _ = violation_fractions(margins, self.args.masc_tau)
        stats = torch.stack([(fractions * scored).sum(), probabilities.sum(), scored.sum()]).double()
        self._running_sums[part] = self._running_sums[part] + stats if part in self._running_sums else stats
        if self.stopping_callback.target == "calibration":
            self._running_margins.append(margins.margins[margins.mask].float())

    def _read_running(self) -> dict[str, torch.Tensor]:
        """The running sums since the last probe, summed over processes, then cleared."""
        sums: dict[str, torch.Tensor] = {}
        if self._running_margins:
            margins = torch.cat(self._running_margins)
            if self.accelerator.num_processes > 1:
                margins = self.accelerator.pad_across_processes(margins, pad_index=float("nan"))
                margins = self.accelerator.gather(margins)
                margins = margins[~torch.isnan(margins)]
            sums["forget_margins"] = margins.cpu()
            self._running_margins = []
        total = self._running_sums.get("forget")
        if total is None:
            total = torch.zeros(3, dtype=torch.float64, device=self.args.device)
        if self.accelerator.num_processes > 1:
            total = self.accelerator.reduce(total, reduction="sum")
        sums["forget"] = total.cpu()
        self._running_sums.clear()
        return sums

    @torch.no_grad()
    def measure_margins(
        self, examples: Sequence[Mapping[str, Any]], beta: float | None = None, batch_size: int | None = None
    ) -> dict[str, Any]:
        """Violation fractions, answer lengths and answer probabilities of ``examples`` under the current model.

        Uses the one margin implementation with the run's k, competitor source and rho, so the stopping rule,
        the record's exact-reproduction bound and the loss agree on what a violation is.
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
        """The stopping rule's measurement: violation rate of the stopping probe, plus the other probes' rates, the
        calibration set's rate and the retain answer probability the utility floor watches.

        With ``running_probe`` the 'train' rate comes from the forget batches trained on since the last probe (no
        forward pass here); the retain sample, the held-out and the calibration sets are measured with a forward
        pass. Runs on every process (a sharded model's forward needs all of them); all processes use
        the same numbers, so all stop at the same step.
        """
        start = time.perf_counter()
        measured: dict[str, float] = {}
        running = self._read_running() if self._running else {}
        forget_running = running.get("forget")
        forget_margins = {}
        if forget_running is not None and forget_running[2] > 0:
            measured["violation_rate_train"] = float(forget_running[0] / forget_running[2])
            measured["forget_probability_train"] = float(forget_running[1] / forget_running[2])
            train_examples = int(forget_running[2])
            if "forget_margins" in running:
                forget_margins["train"] = running["forget_margins"]
        else:
            train_examples = 0
        probes = {"train": self.probe_examples, "holdout": self.holdout_examples}
        for name, examples in probes.items():
            if not examples or f"violation_rate_{name}" in measured:
                continue
            margins = self.measure_margins(examples)
            measured[f"violation_rate_{name}"] = margins["fractions"].mean().item()
            measured[f"forget_probability_{name}"] = margins["probabilities"].mean().item()
            forget_margins[name] = margins["margins"]
            if name == "train":
                train_examples = len(margins["fractions"])
        if self.calibration_examples:
            calibration = self._measure_calibration()
            self._calibration_margins = calibration["margins"].sort().values.to(self.args.device)
            measured["violation_rate_calibration"] = calibration["fractions"].mean().item()
            measured["calibration_probability"] = calibration["probabilities"].mean().item()
            if self.args.stop_probe in forget_margins:
                measured["calibration_gap"] = calibration_gap(
                    forget_margins[self.args.stop_probe], calibration["margins"]
                )
        stop_probe = self.args.stop_probe
        measured["violation_rate"] = measured[f"violation_rate_{stop_probe}"]
        measured["num_examples"] = train_examples if stop_probe == "train" else len(self.holdout_examples)
        if self.retain_probe_examples:
            retain = self.measure_margins(self.retain_probe_examples)
            measured["retain_probability"] = retain["probabilities"].mean().item()
        measured = self._agree_across_processes(measured)
        self._probe_metrics.update({key: value for key, value in measured.items() if key != "num_examples"})
        self._probe_seconds += time.perf_counter() - start
        return measured

    def _measure_calibration(self) -> dict[str, torch.Tensor]:
        """Margins of the calibration set (never trained on) under the current model."""
        return self.measure_margins(self.calibration_examples)

    # --- kept states: the last one above the utility floor, the first that met the target -----------------

    def _bind_stopping_callback(self, callback: ViolationStoppingCallback) -> None:
        guard = callback.utility_floor is not None and self.args.restore_on_failure
        callback.bind(
            self.probe,
            on_good_state=(lambda step: self._snapshot("last_good", step)) if guard else None,
            on_target=(lambda step: self._snapshot("best", step)) if self.args.keep_best_state else None,
            on_failure=(lambda step: self._restore("last_good")) if guard else None,
            export_running=lambda: {part: total.tolist() for part, total in self._running_sums.items()},
        )

    def _snapshot(self, name: str, step: int) -> None:
        """Copy the trainable parameters to host memory (not possible when DeepSpeed partitions them)."""
        if self.is_deepspeed_enabled:
            return
        self._snapshots[name] = (step, [p.detach().to("cpu", copy=True) for p in self._trainable()])

    def _restore(self, name: str) -> None:
        if name not in self._snapshots:
            logger.warning(f"UnlearnTrainer: no '{name}' state was kept, so the weights stay as they are.")
            return
        step, saved = self._snapshots[name]
        with torch.no_grad():
            for param, value in zip(self._trainable(), saved):
                param.copy_(value.to(param.device))
        self._restored_step = step
        logger.warning(f"UnlearnTrainer: restored the weights of step {step} ({name.replace('_', ' ')} state).")

    def _agree_across_processes(self, measured: dict[str, float]) -> dict[str, float]:
        """Every process probes the same examples; take rank 0's numbers so all stop at the same step."""
        if self.accelerator.num_processes == 1:
            return measured
        from accelerate.utils import broadcast_object_list

        holder = [measured]
        broadcast_object_list(holder, from_process=0)
        return holder[0]

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
            "rho": self.args.masc_rho,
            "k": self.args.masc_k,
        }

    def evaluate(
        self,
        eval_dataset: Any = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
        retain_only_truth_ratios: Sequence[float] | None = None,
    ) -> dict[str, float]:
        """Unlearning metrics of the current model, through :func:`hf_unlearn.metrics.evaluate_unlearning` (the
        code path of ``hf-unlearn eval`` and the demo): ROUGE-L, Prob, exact match and truth ratio on the forget
        and retain sets, model utility, the exact-reproduction bound and, given the retain-only model's forget
        truth ratios, forget quality. ``eval_dataset`` (a retain-like set, or a dict of them) adds sets that count
        towards model utility. Called by Trainer for ``eval_strategy``; logged as ``eval_forget_rouge_l_recall`` etc.
        """
        from .metrics import evaluate_unlearning

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

    # --- the run record ---------------------------------------------------------------------------------

    def _make_record(self, final: bool) -> UnlearnRecord:
        """The run record from the config, the objectives' registrations, Trainer's state and the stopping rule.

        ``final`` (once, at the end of ``train()``, on every process) adds the exact-reproduction bound, which needs
        forward passes; the record saved with a checkpoint is built without running the model.
        """
        args = self.args
        names = list(TRAINING_HYPERPARAMETERS)
        for objective in self._objectives():
            names += objective.hyperparameters
        if args.stop_on_violation:
            names += STOPPING_HYPERPARAMETERS
        if args.probe_interval > 0:
            names += GUARD_HYPERPARAMETERS
        if args.forget_scoring != "answer":
            names += CONTINUATION_HYPERPARAMETERS
        # Enum settings (scheduler, optimizer) are recorded by their value, as written in a config.
        hyperparameters = {name: getattr(getattr(args, name), "value", getattr(args, name)) for name in names}
        papers = [objective.paper for objective in self._objectives() if objective.paper is not None]
        papers = [{"title": p.title, "url": p.url, "authors": p.authors} for p in dict.fromkeys(papers)]
        if args.gradient_surgery != "sum":
            papers.append(dict(zip(("title", "url", "authors"), SURGERY_PAPER)))
        stopping = self.stopping_callback
        state = self.state
        surgery_history = [
            {"step": log["step"], **{k: v for k, v in log.items() if k.startswith("surgery/")}}
            for log in state.log_history
            if any(k.startswith("surgery/") for k in log)
        ]
        model = self.accelerator.unwrap_model(self.model)
        adapter = None
        if _is_peft_model(model):
            adapter = str(model.peft_config[model.active_adapter].peft_type.value).lower()
            model = model.get_base_model()
        previous = getattr(self, "record", None)
        record = UnlearnRecord(
            method=args.method,
            forget_objective=self.forget_objective.name,
            retain_objective=self.retain_objective.name if self.retain_objective is not None else "none",
            gradient_surgery=args.gradient_surgery,
            hyperparameters=hyperparameters,
            papers=papers,
            base_model=getattr(model.config, "_name_or_path", None) or None,
            adapter=adapter,
            stopping_rule=bool(args.stop_on_violation and args.probe_interval > 0),
            stopped_early=stopping.stopped_early,
            stop_kind=self._stop_kind(),
            stop_reason=self._stop_reason(),
            stop_step=stopping.stop_step,
            restored_step=self._restored_step,
            probe_seconds=self._probe_seconds,
            global_step=state.global_step,
            max_steps=state.max_steps,
            violation_rate=stopping.last_violation_rate,
            probe_history=list(stopping.history),
            surgery_history=surgery_history,
            exact_reproduction_bound=self.exact_reproduction_bound() if final else None,
            wall_seconds=self._train_seconds,
            complete=final,
            forget_fingerprint=self.forget_fingerprint,
            finished_at=datetime.now(timezone.utc).isoformat(timespec="seconds") if final else None,
            earlier_requests=list(self.earlier_requests),
            objective_state=self.objective_state_callback.state()["attributes"]["states"],
            **self._datasets,
        )
        if previous is not None:  # measurements added from outside (before/after, quantization) stay
            record.update(
                before=previous.before,
                after=previous.after,
                evaluation=previous.evaluation,
                quantization=previous.quantization,
                extra=previous.extra,
            )
        return record

    def _stop_kind(self) -> str | None:
        """'target', 'utility_floor', 'budget' (all steps ran), 'other' (another callback, an interruption), or None
        before training."""
        stopping, state = self.stopping_callback, self.state
        if stopping.stop_kind is not None:
            return stopping.stop_kind
        if state.max_steps and state.global_step >= state.max_steps:
            return "budget"
        return None if state.global_step == 0 else "other"

    def _stop_reason(self) -> str:
        stopping, state, args = self.stopping_callback, self.state, self.args
        kind = self._stop_kind()
        restored = (
            f"; the weights of step {self._restored_step} were restored" if self._restored_step is not None else ""
        )
        last = stopping.history[-1] if stopping.history else {}
        if kind == "target":
            if stopping.target == "calibration":
                return (
                    f"target reached: at step {stopping.stop_step} the {args.stop_probe} probe's answers looked no "
                    f"more familiar than never-seen data (calibration gap "
                    f"{last.get('calibration_gap', float('nan')):.3f} <= {stopping.calibration_slack:g} logits; "
                    f"violation rate {stopping.last_violation_rate:.3f}, never-seen "
                    f"{last.get('violation_rate_calibration', float('nan')):.3f})"
                )
            measure = "upper confidence bound of the violation rate" if args.hoeffding else "violation rate"
            return (
                f"target reached: the {measure} of the {args.stop_probe} probe fell to alpha = {stopping.alpha:g} at "
                f"step {stopping.stop_step} (rate {stopping.last_violation_rate:.3f})"
            )
        if kind == "utility_floor":
            return (
                f"stopped: utility floor. At step {stopping.stop_step} the retain answer probability fell to "
                f"{last.get('retain_probability', float('nan')):.4g}, under {stopping.utility_floor:g} x its start "
                f"value {stopping.start_retain_probability:.4g}{restored}"
            )
        if kind == "budget":
            if args.stop_on_violation and args.probe_interval > 0:
                rate = stopping.last_violation_rate
                measured = "never probed" if rate is None else f"last violation rate {rate:.3f}"
                threshold = last.get("stop_threshold")
                target = "" if threshold is None else f", target {threshold:.3f}"
                return (
                    f"budget exhausted: all {state.max_steps} steps ran without meeting the stopping rule "
                    f"({measured}{target}){restored}"
                )
            return f"budget exhausted: all {state.max_steps} steps ran (no stopping rule){restored}"
        if kind is None:
            return "not trained yet"
        return (
            f"stopped at step {state.global_step} of {state.max_steps} by another callback or an interruption"
            f"{restored}"
        )

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any):
        """Trainer's ``train``, after checking the output folder (an earlier run there is refused unless
        ``overwrite_output_dir`` or a resume; it must be writable) so that nothing is trained that cannot be saved."""
        if self.is_world_process_zero():
            prepare_output_dir(
                self.args.output_dir, self.args.overwrite_output_dir, resuming=bool(resume_from_checkpoint)
            )
        start = time.perf_counter()
        self._trainable_params, self._stored_forget_grads = None, []
        output = super().train(resume_from_checkpoint, *args, **kwargs)
        stopping = self.stopping_callback
        if self.args.keep_best_state and stopping.stop_kind is None and "best" in self._snapshots:
            self._restore("best")
        self._train_seconds = time.perf_counter() - start
        self.record = self._make_record(final=True)
        if self.record.stop_kind == "budget" and self.record.stopping_rule:
            logger.warning(
                f"Unlearning ended without meeting its stopping rule: {self.record.stop_reason}. To let it stop "
                "itself, give it more steps (max_steps), a larger learning_rate or forget_weight, or a looser "
                "target (stop_alpha, or a calibration_dataset with stop_target='calibration')."
            )
        return output

    # --- saving, model card and Hub -----------------------------------------------------------------------

    def _write_record_and_card(self, output_dir: str) -> None:
        from .model_card import write_model_card

        record = self.record if self.record.complete else self._make_record(final=False)
        record.save(output_dir)
        save_ledger(full_ledger(record), output_dir)
        write_model_card(record, output_dir, repo_id=self.args.hub_model_id)
        model = self.accelerator.unwrap_model(self.model)
        if _is_peft_model(model):
            # PEFT's own card metadata (library_name: peft, base_model, adapter tags) on top of the unlearning card.
            model.create_or_update_model_card(output_dir)

    def create_model_card(self, model_name: str | None = None, tags: Any = None, **kwargs: Any) -> None:
        """Write README.md (the unlearning model card, from the run record) into ``output_dir``; replaces
        Trainer's generic draft."""
        if not self.is_world_process_zero():
            return
        if model_name or tags:
            extra = dict(self.record.extra)
            if model_name:
                extra["model_name"] = model_name
            if tags:
                extra["tags"] = sorted(set([tags] if isinstance(tags, str) else tags))
            self.record.update(extra=extra)
        self._write_record_and_card(self.args.output_dir)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Save as Trainer does, plus ``unlearn_record.json`` and the model card it writes, so every checkpoint
        and final save says what was done. Nothing is measured here: the record is read, not recomputed."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            self._write_record_and_card(output_dir or self.args.output_dir)

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
            if isinstance(callback, ObjectiveStateCallback):
                callback.bind(self._update_objective_states)
                self.objective_state_callback = callback
            if isinstance(callback, ViolationStoppingCallback):
                self._bind_stopping_callback(callback)
                self.stopping_callback = callback
                # One process's sums are in the checkpoint; with several, the next probe counts from the resume.
                saved = callback.running_sums if self.accelerator.num_processes == 1 else None
                self._running_sums = {
                    part: torch.tensor(values, dtype=torch.float64, device=self.args.device)
                    for part, values in (saved or {}).items()
                }


__all__ = ["UnlearnTrainer", "count_items", "refusal_example"]
