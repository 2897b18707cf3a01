"""UNDO: distil the unlearned model into a noised copy of itself, so that what unlearning only suppressed stays behind.

Lee et al., "Distillation Robustifies Unlearning" (arXiv 2506.06278, NeurIPS 2025) find that output-based unlearning
leaves the forgotten capability latent in the weights (a few fine-tuning steps bring it back), and that a student
trained from scratch to imitate the unlearned model's outputs inherits its behaviour without the latent capability.
Their UNDO (Unlearn-Noise-Distill-on-Outputs) makes this affordable: the student starts from the unlearned weights
moved part of the way toward noise and is distilled to the unlearned model (the teacher) for a while.

:func:`perturb_toward_noise` is their noising, per parameter tensor
``theta <- (1 - alpha) * theta + alpha * beta * eps`` with ``alpha`` the perturbation strength (0: the unlearned
weights, 1: noise only), ``beta`` the noise scale (0.1 in their code) and ``eps`` a Xavier-uniform draw for a weight
matrix (embeddings included) and zero for a vector (norm weights and biases are only shrunk), as in their code's
noising step. :func:`distill_into_perturbed` then trains the student on the forward KL ``KL(teacher || student)`` of
the next-token distributions at every non-padding position, through a small :class:`~transformers.Trainer` subclass
(:class:`DistillationTrainer`). The paper distils on general pretraining text; here the distillation data is the
retain set the user already has (question/answer pairs, prompt and answer tokens alike), which is what an
unlearning user holds. It is never the forget set.

The model passed in is the teacher and is never modified; a PEFT (LoRA) model is merged into a copy first, and the
student is a full model.
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PrinterCallback, Trainer, TrainingArguments
from transformers.utils import logging

from ..data.examples import tokenize_qa
from ..data.pairing import model_inputs, pad_examples
from ..training.reference import frozen_copy

logger = logging.get_logger(__name__)

#: The paper the distillation stage follows, as the run record cites papers.
UNDO_PAPER = {
    "title": "Distillation Robustifies Unlearning",
    "url": "https://arxiv.org/abs/2506.06278",
    "authors": "Bruce W. Lee, Addie Foote, Alex Infanger, Leni Shor, Harish Kamath, Jacob Goldman-Wetzler, Bryce "
    "Woodworth, Alex Cloud, Alexander Matt Turner",
}
#: The noise scale beta of the paper's code (its default; its sweeps also try 0.05 and 0.01).
DEFAULT_BETA = 0.1


def check_noise(alpha: float, beta: float) -> None:
    """Refuse, by name, a perturbation strength outside [0, 1] or a negative noise scale."""
    if not 0.0 <= alpha <= 1.0:  # also refuses NaN
        raise ValueError(
            f"alpha (UNDO's perturbation strength) must be in [0, 1], got {alpha}: 0 keeps the unlearned weights, 1 "
            "starts the student from noise alone; the paper uses 0.1-0.7."
        )
    if not beta >= 0.0:
        raise ValueError(f"beta (UNDO's noise scale) must be >= 0, got {beta}; the paper's default is 0.1.")


def check_distillation_settings(alpha: float, beta: float, steps: int, learning_rate: float, batch_size: int) -> None:
    """Refuse, by name and before any weight changes, settings under which UNDO cannot run."""
    check_noise(alpha, beta)
    if steps < 1:
        raise ValueError(f"steps (distillation optimizer steps) must be positive, got {steps}.")
    if not learning_rate > 0.0:
        raise ValueError(f"learning_rate must be positive, got {learning_rate}.")
    if batch_size < 1:
        raise ValueError(f"batch_size must be positive, got {batch_size}.")


def check_retain_data(retain_records: Any) -> None:
    """Refuse, by name, distillation without retain data (``None`` or empty)."""
    if retain_records is None or len(retain_records) == 0:
        raise ValueError(
            "UNDO distils on retain data, and none was given: pass the retain set (question/answer pairs the model "
            "should keep, e.g. --retain_data FILE). The forget set is never distilled on."
        )


def perturb_toward_noise(model: torch.nn.Module, alpha: float, beta: float = DEFAULT_BETA, seed: int = 0) -> int:
    """UNDO's noising, in place on every trainable parameter of ``model``: ``theta <- (1 - alpha) * theta + alpha *
    beta * eps``, ``eps`` Xavier-uniform for a tensor of two or more dimensions and 0 for a vector or scalar (Lee et
    al. 2025). The draws come from a CPU generator seeded with ``seed``, in parameter order, so the student is the
    same on any device. Returns the number of parameters changed."""
    check_noise(alpha, beta)
    generator = torch.Generator().manual_seed(seed)
    changed = 0
    with torch.no_grad():
        for parameter in model.parameters():
            if not parameter.requires_grad:
                continue
            parameter.mul_(1.0 - alpha)
            if parameter.dim() >= 2:
                noise = torch.nn.init.xavier_uniform_(torch.empty(parameter.shape), generator=generator)
                parameter.add_(noise.to(parameter.device, parameter.dtype), alpha=alpha * beta)
            changed += parameter.numel()
    return changed


def forward_kl(teacher_logits: torch.Tensor, student_logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the positions where ``mask`` is 1 of ``KL(teacher || student)`` between the next-token
    distributions, in float32 at least (half-precision log-softmax loses the small probabilities the KL weighs)."""
    dtype = torch.promote_types(student_logits.dtype, torch.float32)
    student = F.log_softmax(student_logits.to(dtype), dim=-1)
    teacher = F.log_softmax(teacher_logits.to(dtype), dim=-1)
    per_position = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    weights = mask.to(per_position.dtype)
    return (per_position * weights).sum() / weights.sum().clamp(min=1.0)


class DistillationCollator:
    """Right-pad ``input_ids`` / ``attention_mask`` (:func:`~hf_unlearn.data.pairing.pad_examples`); no labels, since
    the targets are the teacher's distributions."""

    def __init__(self, pad_token_id: int) -> None:
        self.pad_token_id = pad_token_id

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        batch = pad_examples(examples, self.pad_token_id)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


class DistillationTrainer(Trainer):
    """:class:`~transformers.Trainer` whose loss is the forward KL of the model being trained (the student) to a
    frozen ``teacher`` on the batch (:func:`forward_kl`). The loss is a per-batch mean, which Trainer divides by
    the gradient accumulation steps."""

    loss_is_scaled_for_ga = False

    def __init__(self, teacher: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.is_deepspeed_enabled or self.is_fsdp_enabled:
            raise ValueError(
                "UNDO's distillation runs the teacher beside the student on each process; DeepSpeed and FSDP are not "
                "supported. Run it without them."
            )
        self.teacher = teacher.to(self.args.device).eval().requires_grad_(False)

    def compute_loss(
        self,
        model: torch.nn.Module,
        inputs: dict[str, torch.Tensor],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ) -> Any:
        with torch.no_grad():
            teacher_logits = self.teacher(**inputs).logits
        outputs = model(**inputs)
        loss = forward_kl(teacher_logits, outputs.logits, inputs["attention_mask"])
        return (loss, outputs) if return_outputs else loss


def distillation_examples(tokenizer: Any, records: Any, prompt_template: str | None = None) -> list[dict]:
    """The distillation data: question/answer records tokenized as for unlearning (prompt and answer), or examples
    that are tokenized already (``input_ids``), as they are."""
    examples = []
    for record in records:
        if "input_ids" in record:
            examples.append(model_inputs(record))
        else:
            examples.append(
                tokenize_qa(tokenizer, str(record["question"]), str(record["answer"]), prompt_template=prompt_template)
            )
    return [{key: e[key] for key in ("input_ids", "attention_mask")} for e in examples]


def mean_kl_to_teacher(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    examples: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    batch_size: int = 32,
) -> float:
    """``KL(teacher || student)`` per non-padding position, averaged over every position of ``examples`` (each
    position weighs the same, whatever its batch)."""
    total, count = 0.0, 0
    device = next(student.parameters()).device
    with _eval_mode(student), _eval_mode(teacher), torch.no_grad():
        for start in range(0, len(examples), batch_size):
            batch = pad_examples(examples[start : start + batch_size], pad_token_id)
            inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask")}
            positions = int(inputs["attention_mask"].sum())
            kl = forward_kl(teacher(**inputs).logits, student(**inputs).logits, inputs["attention_mask"])
            total += kl.item() * positions
            count += positions
    return total / max(count, 1)


@contextlib.contextmanager
def _eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` running on its own weights; a PEFT model's copy has its adapters merged into the base."""
    duplicate = frozen_copy(model)
    if hasattr(duplicate, "merge_and_unload"):
        duplicate = duplicate.merge_and_unload()
    return duplicate


def distill_into_perturbed(
    model: torch.nn.Module,
    tokenizer: Any,
    retain_records: Any,
    alpha: float = 0.5,
    beta: float = DEFAULT_BETA,
    steps: int = 200,
    learning_rate: float = 5e-4,
    batch_size: int = 8,
    seed: int = 0,
    prompt_template: str | None = None,
    warmup_ratio: float = 0.1,
    output_dir: str | None = None,
    **training_arguments: Any,
) -> tuple[torch.nn.Module, dict[str, Any]]:
    """UNDO after unlearning: a student made from ``model`` (the teacher, never modified; LoRA merged first) by
    :func:`perturb_toward_noise` is distilled to the teacher (:class:`DistillationTrainer`, AdamW, ``steps`` optimizer
    steps of ``batch_size`` retain examples, constant learning rate after a linear warm-up over ``warmup_ratio`` of
    the steps, gradient norm clipped at 1 as in the paper's runs) on ``retain_records``.

    ``training_arguments`` go to :class:`~transformers.TrainingArguments` (e.g. ``use_cpu``, ``bf16``,
    ``gradient_accumulation_steps``); ``output_dir`` is Trainer's scratch folder (a temporary one by default; nothing
    is saved there). Returns ``(student, result)``: the student in eval mode, and ``result`` with the settings, the
    number of parameters noised, the mean KL to the teacher on the retain data right after the noising
    (``kl_perturbed``) and after the distillation (``kl_distilled``), and the wall time.
    """
    check_distillation_settings(alpha, beta, steps, learning_rate, batch_size)
    check_retain_data(retain_records)
    examples = distillation_examples(tokenizer, retain_records, prompt_template)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    start = time.perf_counter()
    teacher = merged_copy(model).eval().requires_grad_(False)
    student = merged_copy(model).requires_grad_(True)
    noised = perturb_toward_noise(student, alpha, beta, seed)
    kl_perturbed = mean_kl_to_teacher(student, teacher, examples, pad_id)
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(
            **{
                "output_dir": output_dir or scratch,
                "max_steps": steps,
                "per_device_train_batch_size": batch_size,
                "learning_rate": learning_rate,
                "lr_scheduler_type": "constant_with_warmup",
                "warmup_steps": math.ceil(warmup_ratio * steps),
                "weight_decay": 0.0,
                "max_grad_norm": 1.0,
                "seed": seed,
                "data_seed": seed,
                "save_strategy": "no",
                "report_to": "none",
                "logging_strategy": "no",
                "disable_tqdm": True,
                "remove_unused_columns": False,
                "dataloader_pin_memory": torch.cuda.is_available(),
                **training_arguments,
            }
        )
        trainer = DistillationTrainer(
            teacher, model=student, args=args, train_dataset=examples, data_collator=DistillationCollator(pad_id)
        )
        # Without a progress bar Trainer prints its logs (the end-of-training summary); the library logs instead.
        trainer.remove_callback(PrinterCallback)
        trainer.train()
    student = trainer.model.eval()
    kl_distilled = mean_kl_to_teacher(student, trainer.teacher, examples, pad_id)
    logger.info(
        f"UNDO: alpha {alpha:g}, beta {beta:g}, {steps} steps on {len(examples)} retain examples: KL to the teacher "
        f"{kl_perturbed:.4g} after the noising, {kl_distilled:.4g} after the distillation."
    )
    result = {
        "method": "undo",
        "alpha": alpha,
        "beta": beta,
        "steps": steps,
        "learning_rate": learning_rate,
        "batch_size": batch_size,
        "seed": seed,
        "retain_examples": len(examples),
        "noised_parameters": noised,
        "kl_perturbed": kl_perturbed,
        "kl_distilled": kl_distilled,
        "seconds": time.perf_counter() - start,
        "paper": UNDO_PAPER["url"],
    }
    return student, result


__all__ = [
    "DEFAULT_BETA",
    "UNDO_PAPER",
    "DistillationCollator",
    "DistillationTrainer",
    "check_distillation_settings",
    "check_noise",
    "check_retain_data",
    "distill_into_perturbed",
    "distillation_examples",
    "forward_kl",
    "mean_kl_to_teacher",
    "merged_copy",
    "perturb_toward_noise",
]
