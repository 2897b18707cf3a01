"""The learn stage of the embedded benchmark: a model that has memorised the fictitious authors (the target to
unlearn from), or only the retain authors (the retain-only reference that forget quality and PrivLeak compare
with), learned with TRL's ``SFTTrainer`` and cached on disk. The records come from
:mod:`hf_unlearn.benchmarks.fictitious_authors`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import torch
import transformers
from datasets import Dataset
from filelock import FileLock
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    PrinterCallback,
    ProgressCallback,
    Qwen2Config,
    TrainerCallback,
)

from ..data.examples import ensure_pad_token, tokenize_qa
from ..evaluation.metrics import default_max_new_tokens, exact_match, generate_answers
from ..training.adapters import lora_config, with_adapter
from ..training.callbacks import QuietProgressCallback
from .fictitious_authors import (
    BENCHMARK_VERSION,
    build_tokenizer,
    generate_benchmark,
    load_split,
    retain_split_for,
    tokenizer_corpus,
)

__all__ = [
    "PRETRAINED_BASES",
    "default_cache_dir",
    "learn_retain_only_model",
    "learn_target_model",
    "tiny_model",
    "tiny_model_config",
]


def tiny_model_config(
    tokenizer: Any,
    architecture: str = "llama",
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 128,
) -> PretrainedConfig:
    """Config of a small randomly initialised causal LM (``"llama"``, ``"qwen2"`` or ``"gpt2"``) for ``tokenizer``.

    ``intermediate_size`` defaults to ``4 * hidden_size``. Input and output embeddings are tied; GPT-2 gets no
    dropout (Llama and Qwen2 have none by default), so learning is deterministic.
    """
    intermediate_size = intermediate_size or 4 * hidden_size
    special = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": True,
    }
    if architecture in ("llama", "qwen2"):
        config_class = LlamaConfig if architecture == "llama" else Qwen2Config
        return config_class(
            hidden_size=hidden_size,
            num_hidden_layers=num_layers,
            num_attention_heads=num_heads,
            num_key_value_heads=num_heads,
            intermediate_size=intermediate_size,
            max_position_embeddings=max_position_embeddings,
            **special,
        )
    if architecture == "gpt2":
        return GPT2Config(
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=num_heads,
            n_inner=intermediate_size,
            n_positions=max_position_embeddings,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **special,
        )
    raise ValueError(f"Unknown architecture {architecture!r}; use 'llama', 'qwen2' or 'gpt2'.")


def tiny_model(tokenizer: Any, architecture: str = "llama", seed: int = 0, **config_kwargs: Any) -> PreTrainedModel:
    """A randomly initialised (``torch.manual_seed(seed)``) causal LM built from :func:`tiny_model_config`."""
    config = tiny_model_config(tokenizer, architecture, **config_kwargs)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    generation_config = model.generation_config
    generation_config.bos_token_id = tokenizer.bos_token_id
    generation_config.eos_token_id = tokenizer.eos_token_id
    generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def default_cache_dir() -> Path:
    """``$HF_UNLEARN_CACHE`` if set, else ``~/.cache/hf_unlearn``."""
    return Path(os.environ.get("HF_UNLEARN_CACHE", Path.home() / ".cache" / "hf_unlearn"))


@contextlib.contextmanager
def _progress_bars(show: bool) -> Iterator[None]:
    """Hide transformers' progress bars (e.g. "Writing model shards") in the block unless ``show``."""
    hf_logging = transformers.utils.logging
    enabled = hf_logging.is_progress_bar_enabled()
    if enabled and not show:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled and not show:
            hf_logging.enable_progress_bar()


def _count_parameters(model: Any) -> int:
    # Tied input/output embeddings are one tensor; count each parameter once.
    return sum(p.numel() for p in model.parameters())


class LearnStopper(TrainerCallback):
    """Every ``every`` epochs (and at the last), measure how well the learned data is known (:meth:`score`); stop
    learning once it reaches ``target``. ``history`` holds (epoch, score)."""

    def __init__(self, target: float, every: int) -> None:
        self.target = target
        self.every = every
        self.last: float | None = None
        self.history: list[tuple[int, float]] = []

    def score(self, model: Any) -> float:
        raise NotImplementedError

    def measure(self, model: Any) -> float:
        self.last = self.score(model)
        return self.last

    def final(self, model: Any, epochs: int) -> float:
        """The score at the end of learning: the one measured at the last epoch, else measured now."""
        if self.history and self.history[-1][0] == epochs:
            return self.last
        return self.measure(model)

    def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> Any:
        epoch = round(state.epoch or 0)
        if epoch % self.every == 0 or epoch >= args.num_train_epochs:
            self.history.append((epoch, self.measure(model)))
            if self.last >= self.target:
                control.should_training_stop = True
        return control


class _ExactMatchStopper(LearnStopper):
    """Greedy exact match on the training QA."""

    def __init__(
        self, tokenizer: Any, records: Sequence[Mapping[str, Any]], target: float, every: int, batch_size: int
    ) -> None:
        super().__init__(target, every)
        self.tokenizer = tokenizer
        self.questions = [r["question"] for r in records]
        self.answers = [r["answer"] for r in records]
        self.max_new_tokens = default_max_new_tokens(tokenizer, self.answers, margin=2)
        self.batch_size = batch_size

    def score(self, model: Any) -> float:
        predictions = generate_answers(
            model, self.tokenizer, self.questions, max_new_tokens=self.max_new_tokens, batch_size=self.batch_size
        )
        scores = exact_match(predictions, self.answers)
        return sum(scores) / len(scores)


def _sft_trainer(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    train_dataset: Dataset,
    output_dir: str,
    *,
    max_epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    show_progress: bool,
    callbacks: Sequence[TrainerCallback] = (),
    description: str | None = None,
) -> Any:
    """TRL ``SFTTrainer`` on a pre-tokenized dataset whose ``labels`` column already masks the prompt.

    TRL recognises a processed dataset by its ``input_ids`` column and uses an existing ``labels`` column as is
    (its collator pads it with ``-100``), so the loss is on the answer tokens alone, as in completion-only SFT.
    """
    from trl import SFTConfig, SFTTrainer

    args = SFTConfig(
        output_dir=output_dir,
        num_train_epochs=max_epochs,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=math.ceil(len(train_dataset) / batch_size),
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=seed,
        data_seed=seed,
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="epoch",
        report_to="none",
        disable_tqdm=not show_progress,
        # A ~1M-parameter model learns in float32, without activation checkpointing or truncation.
        activation_checkpointing=False,
        bf16=False,
        max_length=None,
        dataloader_num_workers=0,
        dataloader_pin_memory=torch.cuda.is_available(),
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer, callbacks=list(callbacks)
    )
    if show_progress:  # the bar, without a printed line per epoch's log
        trainer.remove_callback(ProgressCallback)
        trainer.add_callback(QuietProgressCallback(description))
    else:
        trainer.remove_callback(PrinterCallback)  # it prints every log when the progress bar is off
    return trainer


def _smollm2() -> tuple[PreTrainedModel, Any]:
    from .pretrained import load_smollm2

    return load_smollm2()


#: Pretrained bases :func:`learn_target_model` can learn the benchmark on (loaded offline).
PRETRAINED_BASES: dict[str, Callable[[], tuple[PreTrainedModel, Any]]] = {"smollm2": _smollm2}


def learn_target_model(
    cache_dir: str | os.PathLike[str] | None = None,
    architecture: str = "llama",
    seed: int = 0,
    max_epochs: int = 60,
    learning_rate: float = 3e-3,
    target_exact_match: float = 0.95,
    show_progress: bool = True,
    *,
    num_authors: int = 40,
    questions_per_author: int = 5,
    num_holdout_authors: int = 4,
    num_calibration_authors: int = 4,
    benchmark_seed: int = 0,
    batch_size: int = 16,
    eval_every: int = 2,
    model_kwargs: Mapping[str, Any] | None = None,
    learn_split: str = "full",
    base_model: str | None = None,
    lora_r: int = 0,
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast, dict[str, Any]]:
    """Make the "target model": a tiny causal LM that has memorised every learned author (the ``full`` split).

    With ``learn_split="retain90"`` (or another retain split) it makes the *retain-only* model instead, the
    reference that TOFU's forget quality compares an unlearned model with: it never saw the forget authors.

    ``base_model="smollm2"`` learns on the real pretrained SmolLM2-135M-Instruct
    (:func:`hf_unlearn.benchmarks.pretrained. load_smollm2`, with its own tokenizer and chat template) instead of a
    tiny model trained from scratch; ``lora_r > 0`` learns through a LoRA adapter of that rank (all linear layers),
    merged into the saved model.

    ``num_authors``, ``questions_per_author``, ``num_holdout_authors`` and ``num_calibration_authors`` set the
    benchmark's size (:data:`~hf_unlearn.benchmarks.fictitious_authors.BENCHMARK_SIZES` names two); every author,
    never-learned ones included, is in the tokenizer's corpus.

    It is learned with TRL's ``SFTTrainer`` on the pairs tokenized by :func:`hf_unlearn.data.tokenize_qa` (the
    ``labels`` column keeps the prompt at ``-100``, so the loss is on the answer alone, and unlearning later sees
    exactly the same tokens). Every ``eval_every`` epochs the greedy exact match on the training QA is measured
    and learning stops once it reaches ``target_exact_match`` (or after ``max_epochs``).

    The result is cached under ``cache_dir`` (default ``$HF_UNLEARN_CACHE`` or ``~/.cache/hf_unlearn``) in
    ``fictitious_authors/<hash of all settings>``; a later call with the same settings loads it instead of
    learning (``info["cached"]`` is then ``True``). The cache entry is written to a temporary folder and renamed
    into place, so an interrupted run never leaves half of one.

    Returns ``(model, tokenizer, info)`` with the model in eval mode (on the device it learned on, or on the CPU
    when loaded from the cache); ``info`` has ``epochs``, ``exact_match`` (greedy, on the learned QA),
    ``seconds``, ``num_parameters``, ``cached``, ``path`` and the ``settings``.
    """
    settings = _authors_settings(
        architecture=architecture,
        seed=seed,
        max_epochs=max_epochs,
        learning_rate=learning_rate,
        target_exact_match=target_exact_match,
        num_authors=num_authors,
        questions_per_author=questions_per_author,
        num_holdout_authors=num_holdout_authors,
        num_calibration_authors=num_calibration_authors,
        benchmark_seed=benchmark_seed,
        batch_size=batch_size,
        eval_every=eval_every,
        model_kwargs=dict(sorted((model_kwargs or {}).items())),
        learn_split=learn_split,
        base_model=base_model,
        lora_r=lora_r,
    )
    path = cache_path(cache_dir, "fictitious_authors", settings)
    with learning_lock(path):
        cached = from_cache(path, show_progress)
        if cached is not None:
            return cached

        start = time.perf_counter()
        benchmark_kwargs = {
            "num_authors": num_authors,
            "questions_per_author": questions_per_author,
            "num_holdout_authors": num_holdout_authors,
            "seed": benchmark_seed,
        }
        # every author, never-learned ones too, is in the tokenizer's corpus
        corpus = dict(benchmark_kwargs, num_calibration_authors=num_calibration_authors)
        start_model = _start_model(base_model, architecture, seed, model_kwargs, lora_r, corpus)
        learned, model, tokenizer, train = _what_to_learn(benchmark_kwargs, learn_split, start_model)
        stopper = _ExactMatchStopper(tokenizer, learned, target_exact_match, eval_every, batch_size=256)

        return learn_into_cache(
            model,
            tokenizer,
            train,
            path,
            settings,
            partial(_summarize_authors, stopper, start, merge=lora_r > 0),
            stopper,
            max_epochs=max_epochs,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
            show_progress=show_progress,
        )


def _what_to_learn(
    size: Mapping[str, Any], learn_split: str, start: tuple[Any, Any]
) -> tuple[list[dict[str, Any]], Any, Any, Dataset]:
    """The records the target learns (``learn_split``'s authors of the benchmark :func:`generate_benchmark` makes with
    ``size``), the ``start`` model and tokenizer (refused if the longest pair does not fit its positions), and the
    tokenized training pairs."""
    records = generate_benchmark(**size)
    learned = _learned_authors(records, learn_split, size)
    model, tokenizer = start
    _check_pairs_fit(model, tokenizer, records)
    return (
        learned,
        model,
        tokenizer,
        Dataset.from_list([tokenize_qa(tokenizer, r["question"], r["answer"]) for r in learned]),
    )


def _authors_settings(**given: Any) -> dict[str, Any]:
    """The target's cache key: every setting, the optional ones (``learn_split``, ``base_model``, ``lora_r``,
    ``num_calibration_authors``) only when not their default, so that the default model keeps its cache key."""
    optional = {"learn_split": "full", "base_model": None, "lora_r": 0, "num_calibration_authors": 4}
    settings = {"version": BENCHMARK_VERSION, **{k: v for k, v in given.items() if k not in optional}}
    settings.update({k: given[k] for k, default in optional.items() if given[k] != default})
    return settings


def _summarize_authors(
    stopper: LearnStopper, start: float, trainer: Any, epochs: int, merge: bool
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """The learned target (LoRA merged: the target is a plain model; unlearning adds its own adapter) and its
    ``info``: the exact match at the end, its history, the seconds since ``start``."""
    model = trainer.model.merge_and_unload() if merge else trainer.model
    exact_match = stopper.final(model, epochs)
    return model, {
        "exact_match": exact_match,
        "exact_match_history": stopper.history,
        "seconds": time.perf_counter() - start,
    }


def _learned_authors(
    records: list[dict[str, Any]], learn_split: str, benchmark_kwargs: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """The records the target learns: every learned author's (``full``), or those of the split's authors."""
    learned = [r for r in records if not r["is_holdout"]]
    if learn_split != "full":
        kept_authors = set(load_split(learn_split, **benchmark_kwargs)["author_index"])
        learned = [r for r in learned if r["author_index"] in kept_authors]
    return learned


def _start_model(
    base_model: str | None,
    architecture: str,
    seed: int,
    model_kwargs: Mapping[str, Any] | None,
    lora_r: int,
    benchmark_kwargs: Mapping[str, Any],
) -> tuple[Any, Any]:
    """The model the target learns from and its tokenizer: a tiny one from scratch with the benchmark's own tokenizer,
    or a pretrained base; through a LoRA adapter of rank ``lora_r`` when it is positive."""
    if base_model is None:
        tokenizer = build_tokenizer(tokenizer_corpus(**benchmark_kwargs))
        model = tiny_model(tokenizer, architecture, seed=seed, **(model_kwargs or {}))
    elif base_model not in PRETRAINED_BASES:  # before any learning: no cache entry can hold an unknown base
        raise ValueError(f"Unknown base_model {base_model!r}; available: {', '.join(PRETRAINED_BASES)}.")
    else:
        model, tokenizer = PRETRAINED_BASES[base_model]()
        ensure_pad_token(tokenizer)
    if lora_r > 0:
        model = with_adapter(model, lora_config(lora_r, "all-linear", dropout=0.0))
    return model, tokenizer


def _check_pairs_fit(model: Any, tokenizer: Any, records: Sequence[Mapping[str, Any]]) -> None:
    """Refuse a model whose positions cannot hold the longest tokenized question/answer pair."""
    longest = max(len(tokenize_qa(tokenizer, r["question"], r["answer"])["input_ids"]) for r in records)
    if longest > model.config.max_position_embeddings:
        raise ValueError(
            f"The longest question/answer pair is {longest} tokens, more than the model's "
            f"max_position_embeddings={model.config.max_position_embeddings}; raise it in model_kwargs."
        )


def cache_path(cache_dir: str | os.PathLike[str] | None, benchmark: str, settings: Mapping[str, Any]) -> Path:
    """Where a learned model with these settings is cached: a digest of them under the benchmark's folder."""
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / benchmark / digest


@contextlib.contextmanager
def learning_lock(path: Path) -> Iterator[None]:
    """Held while a process looks ``path`` up in the cache and, when it is absent, learns it: another process that
    asks for the same settings meanwhile (two runs started at once, pytest-xdist's workers) waits, then loads the
    entry instead of learning it a second time. The lock files (``filelock``, released when their process dies) are
    kept in the cache's ``.locks`` folder, apart from the entries."""
    path.parent.mkdir(parents=True, exist_ok=True)
    locks = path.parent.parent / ".locks"
    locks.mkdir(exist_ok=True)
    with FileLock(str(locks / f"{path.parent.name}-{path.name}.lock")):
        yield


def from_cache(path: Path, show_progress: bool) -> tuple[PreTrainedModel, Any, dict[str, Any]] | None:
    """The cached model, its tokenizer and ``info`` (with ``cached``, ``path``, ``load_seconds``), or ``None``."""
    if not (path / "info.json").is_file():
        return None
    start = time.perf_counter()
    model, tokenizer = load_cached(path, show_progress)
    info = json.loads((path / "info.json").read_text())
    info.update(cached=True, path=str(path), load_seconds=time.perf_counter() - start)
    return model, tokenizer, info


def learn_into_cache(
    model: PreTrainedModel,
    tokenizer: Any,
    train: Dataset,
    path: Path,
    settings: Mapping[str, Any],
    summarize: Callable[[Any, int], tuple[PreTrainedModel, dict[str, Any]]],
    stopper: LearnStopper,
    *,
    max_epochs: int,
    learning_rate: float,
    batch_size: int,
    seed: int,
    show_progress: bool,
    description: str = "Learning the benchmark's model",
) -> tuple[PreTrainedModel, Any, dict[str, Any]]:
    """Learn ``train`` with TRL's SFTTrainer in a staging folder next to ``path``, until ``stopper`` says so; then
    ``summarize(trainer, epochs)`` gives the model to keep and the benchmark's own ``info`` fields, the common ones
    are added, and everything is moved to ``path`` in one rename. Returns what the cache holds, not the trained
    object (SFTTrainer leaves a patched forward on it), so a first and a cached run hand out the same thing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        trainer = _sft_trainer(
            model,
            tokenizer,
            train,
            str(staging / "trainer"),
            max_epochs=max_epochs,
            learning_rate=learning_rate,
            batch_size=batch_size,
            seed=seed,
            show_progress=show_progress,
            callbacks=[stopper],
            description=description,
        )
        trainer.train()
        epochs = round(trainer.state.epoch or 0)
        model, own = summarize(trainer, epochs)
        info = {
            "epochs": epochs,
            **own,
            "num_parameters": _count_parameters(model),
            "num_examples": len(train),
            "final_loss": next(
                (entry["loss"] for entry in reversed(trainer.state.log_history) if "loss" in entry), None
            ),
            "settings": dict(settings),
            "transformers_version": transformers.__version__,
        }
        # the stage's bar is the learning's; writing and reading back the cache take seconds
        store_in_cache(model, tokenizer, info, staging, path, show_progress=False)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    model, tokenizer = load_cached(path, show_progress=False)
    info.update(cached=False, path=str(path))
    return model, tokenizer, info


def store_in_cache(
    model: PreTrainedModel, tokenizer: Any, info: dict[str, Any], staging: Path, path: Path, show_progress: bool
) -> None:
    """Save a learned model, its tokenizer and ``info.json`` into ``staging``, then move it to ``path`` in one
    rename, so a cache folder is either complete or absent."""
    shutil.rmtree(staging / "trainer", ignore_errors=True)
    model.config.use_cache = True  # TRL turns it off for training; a saved model should generate with it
    with _progress_bars(show_progress):
        model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    (staging / "info.json").write_text(json.dumps(info, indent=2))
    try:
        os.rename(staging, path)
    except OSError:
        # Another process cached the same settings meanwhile; keep theirs.
        if not (path / "info.json").is_file():
            raise
        shutil.rmtree(staging, ignore_errors=True)


def load_cached(path: Path, show_progress: bool) -> tuple[PreTrainedModel, Any]:
    tokenizer = AutoTokenizer.from_pretrained(path)
    with _progress_bars(show_progress):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.eval()
    return model, tokenizer


def learn_retain_only_model(
    split: str = "forget10",
    cache_dir: str | os.PathLike[str] | None = None,
    architecture: str = "llama",
    **size: Any,
) -> tuple[PreTrainedModel, Any]:
    """The embedded benchmark's model learned without ``split``'s authors (learned once, then cached): what forget
    quality and PrivLeak compare an unlearned model with. ``size``: the benchmark's size settings, as
    :func:`learn_target_model` takes them."""
    model, tokenizer, _ = learn_target_model(
        cache_dir=cache_dir,
        architecture=architecture,
        learn_split=retain_split_for(split),
        show_progress=False,
        **size,
    )
    return model, tokenizer
