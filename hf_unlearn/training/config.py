"""`UnlearnConfig`: the training arguments of `UnlearnTrainer` (TRL's `XxxConfig(TrainingArguments)` pattern)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments
from transformers.utils import logging

from ..deprecated import alias_field, scoring_alias_field, warn_retired
from ..objectives.masc.options import MascArguments, check_masc, check_retain_guard, check_stopping
from ..surgery.combine import STRATEGIES
from .choices import CUSTOM_METHOD, METHODS
from .config_checks import (
    check_backends,
    check_budget,
    check_forget_scoring,
    check_gradients,
    check_method,
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
            `'custom'`: only `forget_loss` and `retain_loss` (default `'none'`), no stop unless `stop_on_violation`.
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

    > Parameters that are deprecated (removed in 0.3; hf_unlearn.deprecated)

    Each still works and warns with a FutureWarning naming its replacement. First the options only a study used
    (docs/studies/masc_landing.md, "What was tried and failed"), then the baselines' former flags, deprecated aliases
    of the hyperparameters their objectives declare: each is moved into `forget_loss_kwargs` (`retain_loss_kwargs`
    for PDU's) when the run's objective declares it; for another method it is unused, as before.

        calibration_reference (`str`, *optional*, defaults to `"start"`):
            Deprecated (removed in 0.3): leave it at 'start'. Which never-seen (calibration) margins the calibrated
            target and threshold compare the forget margins with: 'start' (every calibration answer, up to 16 x
            probe_size, measured once under the model before unlearning) or 'current' (a probe_size sample re-measured
            under the model being trained; the stop chases the damage unlearning does to never-seen data).
        calibration_refresh_margin (`float` or `None`, *optional*, defaults to `1.0`):
            Deprecated (removed in 0.3), read only with calibration_reference='current': re-measure the never-seen
            margins when the gap against the last ones is within this many logits of calibration_slack (None: always).
        calibration_refresh_every (`int`, *optional*, defaults to `4`):
            Deprecated (removed in 0.3), read only with calibration_reference='current': re-measure the never-seen
            margins at least this often.
        keep_best_state (`bool`, *optional*, defaults to `False`):
            Deprecated (removed in 0.3): use stop_on_violation=True. For a run that goes on past the stop target: at
            the end, restore the weights of the first probe that met it (kept in host memory).
        score_answer_end (`bool`, *optional*, defaults to `True`):
            Deprecated (removed in 0.3): leave it True. Whether the forget objective and the forget and never-seen
            probes score an answer's closing tokens (EOS, a chat template's end-of-turn and the whitespace after it).
        running_probe (`bool`, *optional*, defaults to `True`):
            Deprecated (removed in 0.3): leave it True. Measure the 'train' probe from the forget batches' own
            forward passes since the last probe, not an extra forward over a fixed sample (that one is used when the
            model has dropout, whatever this says).
        retain_probe (`str`, *optional*, defaults to `"screen"`):
            Deprecated (removed in 0.3): leave it at 'screen'. How the utility floor reads retain at a probe:
            'screen' (the retain batches' own forwards since the last probe; the fixed retain sample is measured at
            the start and when that reading is under twice the floor, so a failure is always decided on it) or
            'every_probe' (the fixed sample at every probe).
        continuation_cut_min_ratio (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_scoring_kwargs={"cut_min_ratio": ...}.
        continuation_cut_max_ratio (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_scoring_kwargs={"cut_max_ratio": ...}.
        continuation_min_prefix_tokens (`int` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_scoring_kwargs={"min_prefix_tokens": ...}.
        continuation_min_suffix_tokens (`int` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_scoring_kwargs={"min_suffix_tokens": ...}.
        npo_beta (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"beta": ...} (method npo, npo_klr). NPO's inverse
            temperature beta (0.1).
        simnpo_beta (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"beta": ...} (method simnpo). SimNPO's inverse
            temperature beta (4.5).
        simnpo_delta (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"delta": ...} (method simnpo). SimNPO's reward margin
            delta (0).
        dpo_beta (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"beta": ...} (method idk_dpo). IdkDPO's (DPO) inverse
            temperature beta (0.1).
        undial_beta (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"beta": ...} (method undial). UNDIAL: how far the
            target token's logit is lowered (10).
        wga_beta (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"beta": ...} (method wga). WGA: exponent of the
            token-probability weight p^beta (1).
        satimp_beta1 (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"beta1": ...} (method satimp). SatImp: exponent of the
            saturation weight p^beta1 (5).
        satimp_beta2 (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"beta2": ...} (method satimp). SatImp: exponent of the
            importance weight (1 - p)^beta2 (1).
        ceu_ignore_first_n_answer_tokens (`int` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"ignore_first_n_answer_tokens": ...} (method ce_u).
            CE-U: answer tokens at the start of each answer that are not unlearned (1).
        altpo_beta (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"beta": ...} (method altpo). AltPO's (DPO) inverse
            temperature beta (0.1).
        pdu_epsilon (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use retain_loss_kwargs={"epsilon": ...} (method pdu). PDU: the bound on the
            retain loss (None: (1 + epsilon_slack) x the first step's).
        pdu_epsilon_slack (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use retain_loss_kwargs={"epsilon_slack": ...} (method pdu). PDU: relative
            slack of the default epsilon over the starting retain loss (0.1).
        pdu_dual_init (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use retain_loss_kwargs={"dual_init": ...} (method pdu). PDU: initial value of
            the dual variable lambda (1).
        pdu_dual_step (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use retain_loss_kwargs={"dual_step": ...} (method pdu). PDU: step size of the
            dual ascent on lambda (1).
        pdu_dual_warmup_steps (`int` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use retain_loss_kwargs={"dual_warmup_steps": ...} (method pdu). PDU: optimizer
            steps before lambda starts to move (0).
        rmu_layer (`int` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"layer": ...} (method rmu). RMU: decoder layer whose
            output is steered (None: 7, or the second-to-last layer; also the retain term's).
        rmu_trainable_layers (`list[int]` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"trainable_layers": ...} (method rmu). RMU: layers
            whose MLP weights train (None: the steered layer and the two before it).
        rmu_steering_coefficient (`float` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"steering_coefficient": ...} (method rmu). RMU: norm c
            of the random target direction c * u (6.5).
        refusal_answers (`list[str]` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"refusal_answers": [...]} (method idk_dpo). IdkDPO:
            the refusals preferred over forget answers (default: a few 'I don't know' forms).
        alternate_column (`str` or `None`, *optional*, defaults to `None`):
            Deprecated (removed in 0.3): use forget_loss_kwargs={"alternate_column": ...} (method altpo). AltPO: the
            forget records' column of plausible alternative answers (default perturbed_answer).
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
            f"'{CUSTOM_METHOD}': only forget_loss and retain_loss (default 'none'), no stop unless stop_on_violation. "
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

    # Parameters that are deprecated (removed in 0.3): hf_unlearn.deprecated. The study options, then the
    # baselines' former flags (deprecated aliases of their objectives' declared hyperparameters).
    calibration_reference: str = field(
        default="start",
        metadata={"help": "Deprecated (removed in 0.3): leave it 'start'. Never-seen margins: 'start' or 'current'."},
    )
    calibration_refresh_margin: float | None = field(
        default=1.0,
        metadata={"help": "Deprecated (removed in 0.3). With calibration_reference='current': re-measure margin."},
    )
    calibration_refresh_every: int = field(
        default=4,
        metadata={"help": "Deprecated (removed in 0.3). With calibration_reference='current': re-measure this often."},
    )
    keep_best_state: bool = field(
        default=False,
        metadata={
            "help": "Deprecated (removed in 0.3): use stop_on_violation. Restore the first state at the target."
        },
    )
    score_answer_end: bool = field(
        default=True,
        metadata={
            "help": "Deprecated (removed in 0.3): leave it True. Whether an answer's closing tokens are scored."
        },
    )
    running_probe: bool = field(
        default=True,
        metadata={"help": "Deprecated (removed in 0.3): leave it True. The 'train' probe from the training forwards."},
    )
    retain_probe: str = field(
        default="screen",
        metadata={
            "help": "Deprecated (removed in 0.3): leave it 'screen'. Retain at a probe: 'screen' or 'every_probe'."
        },
    )
    continuation_cut_min_ratio: float | None = scoring_alias_field("continuation_cut_min_ratio")
    continuation_cut_max_ratio: float | None = scoring_alias_field("continuation_cut_max_ratio")
    continuation_min_prefix_tokens: int | None = scoring_alias_field("continuation_min_prefix_tokens")
    continuation_min_suffix_tokens: int | None = scoring_alias_field("continuation_min_suffix_tokens")
    npo_beta: float | None = alias_field("npo_beta")
    simnpo_beta: float | None = alias_field("simnpo_beta")
    simnpo_delta: float | None = alias_field("simnpo_delta")
    dpo_beta: float | None = alias_field("dpo_beta")
    undial_beta: float | None = alias_field("undial_beta")
    wga_beta: float | None = alias_field("wga_beta")
    satimp_beta1: float | None = alias_field("satimp_beta1")
    satimp_beta2: float | None = alias_field("satimp_beta2")
    ceu_ignore_first_n_answer_tokens: int | None = alias_field("ceu_ignore_first_n_answer_tokens")
    altpo_beta: float | None = alias_field("altpo_beta")
    pdu_epsilon: float | None = alias_field("pdu_epsilon")
    pdu_epsilon_slack: float | None = alias_field("pdu_epsilon_slack")
    pdu_dual_init: float | None = alias_field("pdu_dual_init")
    pdu_dual_step: float | None = alias_field("pdu_dual_step")
    pdu_dual_warmup_steps: int | None = alias_field("pdu_dual_warmup_steps")
    rmu_layer: int | None = alias_field("rmu_layer")
    rmu_trainable_layers: list[int] | None = alias_field("rmu_trainable_layers")
    rmu_steering_coefficient: float | None = alias_field("rmu_steering_coefficient")
    refusal_answers: list[str] | None = alias_field("refusal_answers")
    alternate_column: str | None = alias_field("alternate_column")

    # Defaults that differ from TrainingArguments (listed in the docstring note).
    num_train_epochs: float | None = field(
        default=None,
        metadata={
            "help": "Total number of training epochs. Default: 3, except for a run that stops itself "
            "(stop_on_violation) without max_steps, whose budget is self_stop_max_steps optimizer steps."
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
        complete_budget(self)
        warn_retired(self)  # the study options on their way out (hf_unlearn/deprecated.py)

    @property
    def objectives(self) -> tuple[str, str]:
        """(forget objective, retain objective) after applying the overrides."""
        forget, retain = METHODS.get(self.method, (self.forget_loss, "none"))  # 'custom': forget_loss, retain 'none'
        return self.forget_loss or forget, self.retain_loss or retain
