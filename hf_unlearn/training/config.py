"""`UnlearnConfig`: the training arguments of `UnlearnTrainer` (TRL's `XxxConfig(TrainingArguments)` pattern)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments
from transformers.utils import logging

from ..objectives.masc.options import MascArguments, check_masc, check_retain_guard, check_stopping
from ..surgery.combine import STRATEGIES
from .choices import CUSTOM_METHOD, METHODS
from .config_checks import (
    check_backends,
    check_budget,
    check_forget_scoring,
    check_gradients,
    check_method,
    check_outputs,
    complete_budget,
)
from .sharpness import SAM_RHO_HELP

logger = logging.get_logger(__name__)


def _has_accelerator() -> bool:
    mps = getattr(torch.backends, "mps", None)
    xpu = getattr(torch, "xpu", None)
    return (
        torch.cuda.is_available()
        or bool(mps and mps.is_available())
        or bool(xpu and hasattr(xpu, "is_available") and xpu.is_available())
    )


@dataclass
class UnlearnConfig(MascArguments, TrainingArguments):
    r"""
    Configuration class for [`UnlearnTrainer`].

    Only the unlearning-specific parameters are listed here; everything else is
    [`~transformers.TrainingArguments`]. The MASC defaults follow the TOFU / Qwen2.5 row of the MASC paper
    (Di Gennaro et al., arXiv 2606.02920, Table of reference hyperparameters: lambda_forget 0.1, rho 0.5,
    eta 0.5, k 10 self-competitors, beta 1, KL retain term with weight 1) and were then checked on the
    embedded fictitious-authors benchmark (docs/studies/demo.md).

    > [!NOTE]
    > Defaults that differ from [`~transformers.TrainingArguments`]:
    > - `num_train_epochs`: `None`: 3 epochs, or for a run that stops itself `max_steps = self_stop_max_steps` (1000),
    >   so that the stopping rule, not an epoch count, ends it.
    > - `learning_rate`: `1e-4` instead of `5e-5` (the MASC reference runs).
    > - `lr_scheduler_type`: `"constant"` instead of `"linear"`: the run usually stops itself long before the
    >   budget, so a schedule decaying towards the budget would be arbitrary.
    > - `per_device_train_batch_size`: `4` instead of `8` (each step also forwards 4 retain examples).
    > - `logging_steps`: `10` instead of `500`.
    > - `remove_unused_columns`: `False` instead of `True`: forget and retain batches are nested dicts.
    > - `restore_callback_states_from_checkpoint`: `True` instead of `False`, so that resuming restores the
    >   stopping rule's state (probes done, last violation rate, stop step).

    MASC's own parameters (the margin and hinge, the stopping rule, the retain guard) are those of
    [`~hf_unlearn.objectives.masc.MascArguments`], which this class inherits; its docstring lists them.

    The other parameters, by concern (``hf-unlearn run --help`` prints each one's short help):

    > Parameters that choose the method and its objectives

        method (`str` or `None`, *optional*, defaults to `None`):
            Unlearning method, one of the registered methods (`METHODS`): sets the forget and retain objectives.
            `'custom'`: only `forget_loss` and `retain_loss` (default `'none'`), no stop unless `stop_at_target`.
            `None`: `'masc'`, or `'custom'` when `forget_loss` is given.
        forget_loss (`str` or `None`, *optional*, defaults to `None`):
            Override the method's forget objective by its registered name (e.g. 'npo').
        retain_loss (`str` or `None`, *optional*, defaults to `None`):
            Override the method's retain objective: 'kl', 'nll' or 'none'.
        forget_loss_kwargs (`dict`, `str` or `None`, *optional*, defaults to `None`):
            Values of the hyperparameters the forget objective declared in its registration, a dict or a JSON string
            (e.g. '{"scale": 0.5}'); an undeclared key is an error.
        retain_loss_kwargs (`dict`, `str` or `None`, *optional*, defaults to `None`):
            The same for the retain objective's declared hyperparameters.
        forget_weight (`float` or `None`, *optional*, defaults to `None`):
            Weight of the forget objective (MASC's lambda_forget, gamma in gradient surgery). Default: the forget
            objective's registered weight (masc 0.1, simnpo 0.125), 1 otherwise.
        retain_weight (`float` or `None`, *optional*, defaults to `None`):
            Weight of the retain objective (MASC's lambda_retain, alpha in gradient surgery). Default: the forget
            objective's registered retain weight (satimp 0.1), 1 otherwise (pdu's term also has its dual).
        reference_dtype (`str` or `None`, *optional*, defaults to `None`):
            dtype of the frozen reference copy that KL, NPO, UNDIAL, AltPO, IdkDPO and RMU compare with in full
            fine-tuning: None (the model's own) or 'bfloat16' / 'float16' (half the memory; the objectives upcast its
            logits). A PEFT model's reference is its base with the adapters off and costs nothing.
        reference_cache_gb (`float`, *optional*, defaults to `2.0`):
            Host memory, in GiB, for the frozen start model's LM-head inputs kept per example (one hidden vector
            per answer token), so that a row seen again runs only the LM head instead of the start model (a forget
            set is seen once per epoch). 0 runs the start model on every batch. Not used under FSDP or ZeRO-3.

    > Parameters that combine the forget and retain gradients

        gradient_surgery (`str`, *optional*, defaults to `"sum"`):
            How the forget and retain gradients are combined at each optimizer step, one of `STRATEGIES`: `'sum'` is
            the plain weighted sum; `'pcgrad'`, `'pcgrad_global'`, `'sago'` and `'sago_prefer_retain'` never let the
            forget gradient oppose the retain gradient (arXiv 2604.14808); `'blur'` is SAGO's forget-first baseline
            (one global projection of the retain gradient), `'blur_per_tensor'` its per-tensor variant. `forget_weight`
            is gamma, `retain_weight` is alpha.
        sam_rho (`float`, *optional*, defaults to `0.0`):
            Sharpness-aware unlearning (Unlearn-Smooth, arXiv 2502.05374): the forget gradient is taken at the weights
            moved by rho * g / ||g|| along the forget gradient g (one more forward/backward on each forget batch),
            making the forgetting harder to undo by relearning. 0 (default): off; the paper uses 0.1.

    > Parameters that choose which forget tokens are scored (MASC's MUSE setting)

        forget_scoring (`str`, *optional*, defaults to `"answer"`):
            Which forget tokens the forget loss and the stopping probe score: 'answer' (every answer or text token) or
            'continuation' (a prefix of each forget text is context and only its continuation is scored, as the MASC
            reference code's MUSE runs do with --forget_penalty_mode continuation; the cut is drawn per example and
            epoch between forget_scoring_kwargs' cut_min_ratio and cut_max_ratio of the scored tokens, at a fixed
            place per example for the probes).
        forget_scoring_kwargs (`dict`, `str` or `None`, *optional*, defaults to `None`):
            forget_scoring='continuation': the cut's options, a dict or JSON object, the reference code's flags
            without their `continuation_` prefix: `cut_min_ratio` (0.2) and `cut_max_ratio` (0.6), the smallest and
            largest fraction of a text's scored tokens given as prefix; `min_prefix_tokens` (32), the prefix's
            least length; `min_suffix_tokens` (32), the scored continuation's least length (a text shorter than the
            two minimums is scored whole).

    > Parameters that control the outputs

        quantization_check (`bool`, *optional*, defaults to `False`):
            After training, reload the model in NF4, FP4 and 8-bit (bitsandbytes), measure the forget and retain
            metrics again and put the change in the report (hf-unlearn jobs).
        overwrite_output_dir (`bool`, *optional*, defaults to `False`):
            Allow output_dir to hold an earlier run (its checkpoints and record are then removed first). Without it, a
            folder holding a run is refused unless you resume it (resume_from_checkpoint).
        push_unverified (`bool`, *optional*, defaults to `False`):
            Let `push_to_hub` publish a run whose own record does not say the forget set was forgotten (no membership
            verdict, one that did not land, a failed quantization verdict, a failed run), as `hf-unlearn push
            --push_unverified true` does; the card then says so. Without it such a push is refused before anything is
            uploaded, and `push_to_hub=True` needs `hub_strategy='end'`: the other strategies upload checkpoints
            during the run, before anything has judged them.
    """

    _VALID_DICT_FIELDS = TrainingArguments._VALID_DICT_FIELDS + [
        "forget_loss_kwargs",
        "retain_loss_kwargs",
        "forget_scoring_kwargs",
    ]

    # Parameters that choose the method and its objectives
    method: str | None = field(
        default=None,
        metadata={
            "help": f"Unlearning method, one of {sorted(METHODS)}: sets the forget and retain objectives. "
            f"'{CUSTOM_METHOD}': only forget_loss and retain_loss (default 'none'), no stop unless stop_at_target. "
            f"Default: 'masc', or '{CUSTOM_METHOD}' when forget_loss is given."
        },
    )
    forget_loss: str | None = field(
        default=None,
        metadata={"help": "Override the method's forget objective by its registered name (e.g. 'npo')."},
    )
    retain_loss: str | None = field(
        default=None,
        metadata={"help": "Override the method's retain objective: 'kl', 'nll' or 'none'."},
    )
    forget_loss_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": """The forget objective's declared hyperparameters: dict or JSON ('{"scale": 0.5}')."""},
    )
    retain_loss_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "The same for the retain objective's declared hyperparameters."},
    )
    forget_weight: float | None = field(
        default=None,
        metadata={"help": "Weight of the forget objective (lambda_forget, gamma); default: the registered one."},
    )
    retain_weight: float | None = field(
        default=None,
        metadata={"help": "Weight of the retain objective (lambda_retain, alpha); default: the registered one, or 1."},
    )
    reference_dtype: str | None = field(
        default=None,
        metadata={"help": "dtype of the frozen reference copy: None (the model's), 'bfloat16' or 'float16'."},
    )
    reference_cache_gb: float = field(
        default=2.0,
        metadata={"help": "Host GiB for the start model's LM-head inputs kept per example (0: run it every batch)."},
    )

    # Parameters that combine the forget and retain gradients
    gradient_surgery: str = field(
        default="sum",
        metadata={"help": f"How the forget and retain gradients combine: {STRATEGIES}."},
    )
    sam_rho: float = field(default=0.0, metadata={"help": SAM_RHO_HELP})

    # Parameters that choose which forget tokens are scored (MASC's MUSE setting)
    forget_scoring: str = field(
        default="answer",
        metadata={"help": "Which forget tokens are scored: 'answer' (all) or 'continuation' (after a drawn prefix)."},
    )
    forget_scoring_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "forget_scoring='continuation': the cut's options (cut_min_ratio 0.2, cut_max_ratio 0.6, "
            "min_prefix_tokens 32, min_suffix_tokens 32), a dict or JSON object."
        },
    )

    # Parameters that control the outputs
    quantization_check: bool = field(
        default=False, metadata={"help": "After training, re-measure forget and retain in NF4, FP4 and 8-bit."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Allow output_dir to hold an earlier run (removed first); else refused unless resuming."},
    )
    push_unverified: bool = field(
        default=False,
        metadata={
            "help": "Let push_to_hub publish a run whose record does not say the forget set was forgotten (the card "
            "says so); else refused, and push_to_hub=True needs hub_strategy='end'."
        },
    )

    # Defaults that differ from TrainingArguments (listed in the docstring note).
    num_train_epochs: float | None = field(
        default=None,
        metadata={
            "help": "Total number of training epochs. Default: 3, except for a run that stops itself "
            "(stop_at_target) without max_steps, whose budget is self_stop_max_steps optimizer steps."
        },
    )
    learning_rate: float = field(default=1e-4, metadata={"help": "The initial learning rate for AdamW."})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "The scheduler type to use."})
    per_device_train_batch_size: int = field(
        default=4, metadata={"help": "Forget examples per device per step (as many retain examples are paired)."}
    )
    logging_steps: float = field(default=10, metadata={"help": "Log every X update steps."})
    remove_unused_columns: bool = field(
        default=False, metadata={"help": "Kept False: forget and retain batches are nested dictionaries."}
    )
    restore_callback_states_from_checkpoint: bool = field(
        default=True, metadata={"help": "Restore the stopping rule's state when resuming from a checkpoint."}
    )

    def __post_init__(self) -> None:
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not self.use_cpu and not _has_accelerator():
            # Under torchrun on a machine without an accelerator, TrainingArguments would otherwise start every
            # process as its own single-process run (each training alone, each writing the report).
            self.use_cpu = True
            logger.warning(
                "UnlearnConfig: several processes and no accelerator, so use_cpu=True (DDP on the CPU with gloo); "
                "pass --use_cpu yourself to silence this."
            )
        # One check per group of the docstring (training/config_checks.py); the budgets and the backends before
        # TrainingArguments reads them.
        check_backends(self)
        check_budget(self)
        super().__post_init__()
        if self.dataloader_pin_memory and (self.use_cpu or not _has_accelerator()):
            # Pinned memory only speeds up copies to an accelerator; without one torch's DataLoader warns at every
            # epoch that it is set but unused.
            self.dataloader_pin_memory = False
            logger.info("UnlearnConfig: no accelerator, so dataloader_pin_memory=False.")
        check_method(self)
        check_gradients(self)
        check_masc(self)
        check_stopping(self)
        check_retain_guard(self)
        check_forget_scoring(self)
        check_outputs(self)
        complete_budget(self)

    @property
    def objectives(self) -> tuple[str, str]:
        """(forget objective, retain objective) after applying the overrides."""
        forget, retain = METHODS.get(self.method, (self.forget_loss, "none"))  # 'custom': forget_loss, retain 'none'
        return self.forget_loss or forget, self.retain_loss or retain
