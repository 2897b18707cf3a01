"""Loading what a job runs on (a causal LM and its tokenizer by path or Hub id, the request ledger it came with) and
building the trainer: one LoRA adapter builder and one :func:`build_trainer` for every command and study."""

from __future__ import annotations

import os
from typing import Any

from transformers.utils import logging

from ..data.examples import ensure_pad_token
from ..data.loaders import TOKENIZER_FILES, looks_like_path, missing_path_error, offline_hint
from ..training.adapters import load_adapter
from ..training.base_model import changed_weights, local_folder
from ..training.callbacks import report_progress_in
from ..training.config import UnlearnConfig
from ..training.record import RECORD_FILE, UnlearnRecord
from ..training.trainer import UnlearnTrainer

logger = logging.get_logger(__name__)


def load_model_and_tokenizer(
    name: str,
    trust_remote_code: bool = False,
    dtype: str = "auto",
    load_in_4bit: bool = False,
    tokenizer_name: str | None = None,
    base_model: str | None = None,
    tokenizer_option: str | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM and its tokenizer by local path or Hub id (no remote code unless asked).

    A name that looks like a local path must exist, and a local model folder must hold a model (``config.json`` or
    a PEFT ``adapter_config.json``) and, unless ``tokenizer_name`` says where it is, a tokenizer: each is named in
    the error (with ``tokenizer_option``, the command's option for a tokenizer elsewhere); a LoRA adapter folder
    without a tokenizer takes its base model's. ``load_in_4bit`` loads the base
    in NF4 through bitsandbytes, for QLoRA (pass a LoRA ``peft_config``).
    A LoRA adapter folder is merged into its base (:func:`adapter_base`): ``base_model`` when given, else the one its
    ``adapter_config.json`` names.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    adapter = os.path.isfile(os.path.join(name, "adapter_config.json")) and not load_in_4bit
    base = adapter_base(name, base_model) if adapter else None
    if base is not None and tokenizer_name is None and not holds_tokenizer(name):
        # PEFT's save_pretrained writes the adapter alone: its tokenizer is its base model's.
        tokenizer_name = base
        logger.info(f"{name} holds a LoRA adapter without a tokenizer: using its base model's, {base}.")
    check_model_location(name, tokenizer_name, tokenizer_option=tokenizer_option)
    if tokenizer_name is not None:
        check_model_location(tokenizer_name, None, need_model=False)
    if base_model is not None and not adapter:
        raise ValueError(
            f"--base_model {base_model!r} is the base of a LoRA adapter folder, but {name!r} holds no adapter "
            "(no adapter_config.json): leave --base_model out."
        )
    extra: dict[str, Any] = {}
    if load_in_4bit:
        from ..robustness.quantize import quantization_config

        extra["quantization_config"] = quantization_config("nf4")
    try:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name or name, trust_remote_code=trust_remote_code)
        if base is not None:
            # A LoRA output (an earlier unlearning run): merged into its base, so that it trains like any model
            # (loaded as an adapter its weights would all be frozen) and a new adapter, if asked, starts from it.
            model = AutoModelForCausalLM.from_pretrained(base, trust_remote_code=trust_remote_code, dtype=dtype)
            model = load_adapter(model, name).merge_and_unload()
            model.requires_grad_(True)  # PEFT froze the base weights
            logger.info(f"{name} holds a LoRA adapter: merged into its base model {base} for this run.")
        else:
            model = AutoModelForCausalLM.from_pretrained(
                name, trust_remote_code=trust_remote_code, dtype=dtype, **extra
            )
    except OSError as error:
        on_base = (
            f" (a LoRA adapter on the base model {base!r}; if the base is elsewhere, pass its folder with "
            "--base_model PATH)"
            if base is not None
            else ""
        )
        raise RuntimeError(offline_hint(f"Could not load model {name!r}{on_base}", error)) from error
    except ValueError as error:
        raise ValueError(
            f"{name!r} cannot be loaded as a causal language model (AutoModelForCausalLM): {error}"
        ) from error
    if load_in_4bit:
        from ..training.adapters import keep_4bit_layers_trainable

        # Before any measurement: on CPUs with AVX-512 BF16 bitsandbytes would repack the weights for inference at the
        # first eval-mode forward (and assert on layers whose out features are not a multiple of 32).
        keep_4bit_layers_trainable(model)
    ensure_pad_token(tokenizer)
    return model, tokenizer


def adapter_base(name: str, base_model: str | None = None) -> str:
    """The base model the LoRA adapter folder ``name`` is loaded on: ``base_model`` when given (the base moved),
    else the one its ``adapter_config.json`` names. A local base that is not there is an error naming it and
    ``--base_model``; when the base is a local folder and the adapter's run record holds the SHA-256 of the weights it
    was trained on, a base whose weights differ is warned about, naming the files."""
    from peft import PeftConfig

    recorded = PeftConfig.from_pretrained(name).base_model_name_or_path
    base = base_model or recorded
    if not base:
        raise ValueError(
            f"{name!r}'s adapter_config.json names no base model; pass its folder with --base_model PATH."
        )
    if looks_like_path(base) and not os.path.exists(os.path.expanduser(base)):
        if base_model is not None:
            raise missing_path_error(base_model, "The base model folder (--base_model)")
        raise FileNotFoundError(
            f"{name!r} is a LoRA adapter of the base model {recorded!r} (its adapter_config.json), which is not "
            "there any more. Pass the folder it is in now with --base_model PATH (eval, quant-check, relearn-check, "
            "audit), or put it back."
        )
    folder = local_folder(base)
    recorded_weights = (
        UnlearnRecord.load(name).base_model_weights if os.path.isfile(os.path.join(name, RECORD_FILE)) else None
    )
    if folder is not None and recorded_weights:
        changed = changed_weights(recorded_weights, folder)
        if changed:
            logger.warning(
                f"The base model {folder} does not hold the weights the adapter {name!r} was trained on: the SHA-256 "
                f"of {', '.join(changed)} differs from the one in its {RECORD_FILE} (base_model_weights). What is "
                "measured is that adapter on other weights; pass the original base with --base_model PATH."
            )
    return folder or base


def earlier_requests_of(name: str) -> list[dict[str, Any]] | None:
    """The request ledger that came with the model ``name``: its folder's (also a LoRA adapter folder, whose
    loaded model names only its base), or the Hub repository's; ``None`` when it cannot be read (offline, none
    there), which leaves it to the trainer (the ledger of the folder the model's weights came from)."""
    from ..training.ledger import LEDGER_FILE, load_ledger

    if os.path.isdir(name):
        return load_ledger(name)
    try:
        from huggingface_hub import hf_hub_download

        return load_ledger(hf_hub_download(name, LEDGER_FILE))
    except Exception as error:  # no such file, no network, not a repository: nothing to carry over
        logger.info(f"No request ledger read for {name!r} ({type(error).__name__}).")
        return None


def holds_tokenizer(folder: str) -> bool:
    """Whether the local folder holds a tokenizer's files (:data:`TOKENIZER_FILES`)."""
    return bool(set(os.listdir(folder)) & set(TOKENIZER_FILES))


def check_model_location(
    name: str, tokenizer_name: str | None, need_model: bool = True, tokenizer_option: str | None = None
) -> None:
    """Tell a missing local folder, a folder without a model and one without a tokenizer apart from a Hub id.
    ``tokenizer_option``: the command's option that names a tokenizer elsewhere, offered in the error (only
    ``run`` has one)."""
    path = os.path.expanduser(name)
    if looks_like_path(name) and not os.path.exists(path):
        raise missing_path_error(name, "The model folder" if need_model else "The tokenizer folder")
    if not os.path.isdir(path):
        return
    files = set(os.listdir(path))
    if need_model and not files & {"config.json", "adapter_config.json"}:
        raise FileNotFoundError(
            f"{name!r} is a folder but holds no model (no config.json or adapter_config.json). Save one there with "
            "model.save_pretrained(folder), or point at the folder that holds it."
        )
    if tokenizer_name is None and not holds_tokenizer(path):
        raise FileNotFoundError(
            f"{name!r} holds {'a model but ' if need_model else ''}no tokenizer "
            f"(none of {', '.join(TOKENIZER_FILES)}). "
            f"Save it beside the weights with tokenizer.save_pretrained({name!r})"
            + (f", or name where it is ({tokenizer_option} PATH)." if tokenizer_option else ".")
        )


def build_trainer(
    model: Any,
    tokenizer: Any,
    config: UnlearnConfig,
    forget: Any,
    retain: Any = None,
    calibration: Any = None,
    peft_config: Any = None,
    callbacks: list | None = None,
    progress: tuple[Any, str] | None = None,
    earlier_requests: list[dict[str, Any]] | None = None,
) -> UnlearnTrainer:
    """The one place the jobs build an :class:`UnlearnTrainer`: ``forget``/``retain``/``calibration`` tokenized,
    ``peft_config`` a LoRA adapter (:func:`lora_config`) or ``None``; ``progress`` ``(bar, label)`` shows training in
    the run's own progress bar instead of Trainer's; ``earlier_requests`` is the request ledger the model came with
    (default: what the trainer finds, the ledger of the folder the weights came from)."""
    trainer = UnlearnTrainer(
        model=model,
        args=config,
        train_dataset=forget,
        retain_dataset=retain,
        processing_class=tokenizer,
        peft_config=peft_config,
        calibration_dataset=calibration,
        callbacks=callbacks,
    )
    if progress is not None:
        report_progress_in(trainer, *progress)
    if earlier_requests is not None:
        trainer.earlier_requests = list(earlier_requests)
    return trainer
