"""Turning question/answer data into the tensors Trainer takes, and pairing forget with retain batches.

Every example is ``input_ids``, ``attention_mask`` and ``labels`` with ``-100`` on the prompt, which is the
form transformers' ``Trainer`` and TRL's ``SFTTrainer`` (completion-only loss) already use.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from datasets import Dataset
from transformers.utils import logging

from .loaders import load_records
from .prompts import check_prompt_template, prompt_and_completion, uses_chat_template

logger = logging.get_logger(__name__)

IGNORE_INDEX = -100


def tokenize_prompt(tokenizer: Any, question: str, prompt_template: str | None = None) -> list[int]:
    """Token ids of the prompt alone, as fed to ``generate`` at evaluation time."""
    prompt, _ = prompt_and_completion(tokenizer, question, "", prompt_template)
    return _encode(tokenizer, prompt, add_special_tokens=not uses_chat_template(tokenizer, prompt_template))


def tokenize_qa(
    tokenizer: Any, question: str, answer: str, max_length: int | None = None, prompt_template: str | None = None
) -> dict[str, list[int]]:
    """Tokenize one QA pair; prompt tokens get label ``-100`` so only the answer is scored.

    Prompt and completion are encoded separately and concatenated, so the prompt/answer boundary never
    depends on how a tokenizer merges across it. ``prompt_template``: see :mod:`hf_unlearn.prompts`.
    """
    prompt, completion = prompt_and_completion(tokenizer, question, answer, prompt_template)
    prompt_ids = _encode(tokenizer, prompt, add_special_tokens=not uses_chat_template(tokenizer, prompt_template))
    completion_ids = _encode(tokenizer, completion, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    if eos is not None and (not completion_ids or completion_ids[-1] != eos):
        completion_ids = completion_ids + [eos]
    input_ids = prompt_ids + completion_ids
    labels = [IGNORE_INDEX] * len(prompt_ids) + completion_ids
    if max_length is not None and len(input_ids) > max_length:
        raise ValueError(
            f"A question/answer pair is {len(input_ids)} tokens long, more than max_length={max_length}; "
            f"question starts {question[:60]!r}. Shorten it or raise max_length."
        )
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def tokenize_text(tokenizer: Any, text: str, max_length: int | None = None) -> dict[str, list[int]]:
    """Tokenize one plain text (a passage of a book or an article, MUSE's forget corpus) for language modelling:
    every token is scored except the BOS token the tokenizer may prepend, and an EOS token ends it."""
    input_ids = _encode(tokenizer, text, add_special_tokens=True)
    eos = tokenizer.eos_token_id
    if eos is not None and (not input_ids or input_ids[-1] != eos):
        input_ids = input_ids + [eos]
    bos = tokenizer.bos_token_id
    labels = [IGNORE_INDEX if i == 0 and token == bos else token for i, token in enumerate(input_ids)]
    if max_length is not None and len(input_ids) > max_length:
        raise ValueError(
            f"A text is {len(input_ids)} tokens long, more than max_length={max_length}; it starts "
            f"{text[:60]!r}. Split it into shorter passages or raise max_length."
        )
    return {"input_ids": input_ids, "attention_mask": [1] * len(input_ids), "labels": labels}


def continuation_labels(
    labels: Sequence[int], cut_ratio: float, min_prefix_tokens: int, min_suffix_tokens: int
) -> list[int]:
    """Labels that score only the continuation of a forget text: the first ``cut`` scored tokens become ``-100``.

    ``cut = floor(cut_ratio * n)`` for the ``n`` scored tokens, clamped to ``[min_prefix_tokens, n -
    min_suffix_tokens]``; a text with fewer than ``min_prefix_tokens + min_suffix_tokens`` scored tokens keeps
    every one. This is the continuation mode of the MASC reference code's MUSE runs (Di Gennaro et al., arXiv
    2606.02920; reference flag ``--forget_penalty_mode continuation`` with ``--continuation_cut_min_ratio``,
    ``--continuation_cut_max_ratio``, ``--continuation_min_prefix_tokens``, ``--continuation_min_suffix_tokens``):
    the prefix is context, only the continuation enters the hinge and the violation rate.
    """
    # Position 0 is never predicted (causal shift), whatever its label: count only tokens the model scores, as the
    # reference counts shifted target positions.
    scored = [i for i, label in enumerate(labels) if label != IGNORE_INDEX and i > 0]
    if len(scored) < min_prefix_tokens + min_suffix_tokens:
        return list(labels)
    cut = max(min_prefix_tokens, min(math.floor(cut_ratio * len(scored)), len(scored) - min_suffix_tokens))
    masked = list(labels)
    for position in scored[:cut]:
        masked[position] = IGNORE_INDEX
    return masked


@dataclass(frozen=True)
class ContinuationScoring:
    """Where each forget example is cut under ``forget_scoring="continuation"`` (see :func:`continuation_labels`).

    The MASC reference draws the cut ratio uniformly in ``[min_ratio, max_ratio]`` each time a batch is scored and
    uses a fixed, hashed one for its probes; here the draw is seeded by (seed, example, epoch), so a resumed run
    sees the same cuts, and a probe (``epoch=None``) cuts each example at one place for the whole run. Disabled, it
    returns examples unchanged.
    """

    enabled: bool = False
    min_ratio: float = 0.2
    max_ratio: float = 0.6
    min_prefix_tokens: int = 32
    min_suffix_tokens: int = 32
    seed: int = 0

    @classmethod
    def from_config(cls, config: Any, seed: int) -> ContinuationScoring:
        return cls(
            enabled=config.forget_scoring == "continuation",
            min_ratio=config.continuation_cut_min_ratio,
            max_ratio=config.continuation_cut_max_ratio,
            min_prefix_tokens=config.continuation_min_prefix_tokens,
            min_suffix_tokens=config.continuation_min_suffix_tokens,
            seed=seed,
        )

    def cut_ratio(self, index: int, epoch: int | None = None) -> float:
        return random.Random(f"{self.seed}:{index}:{epoch}").uniform(self.min_ratio, self.max_ratio)

    def __call__(self, example: Mapping[str, Any], index: int, epoch: int | None = None) -> dict[str, Any]:
        if not self.enabled:
            return dict(example)
        labels = continuation_labels(
            example["labels"], self.cut_ratio(index, epoch), self.min_prefix_tokens, self.min_suffix_tokens
        )
        return {**example, "labels": labels}


def _encode(tokenizer: Any, text: str, add_special_tokens: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])


def ensure_pad_token(tokenizer: Any) -> None:
    """Give a tokenizer without a pad token (GPT-2, Llama) its EOS token as pad, as most fine-tuning scripts do."""
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ValueError("The tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token first.")
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning(
            f"The tokenizer has no pad token; using its EOS token {tokenizer.eos_token!r} as pad (padding is masked "
            "out of every loss). Set tokenizer.pad_token yourself to choose another."
        )


QARecords = Dataset | Sequence[Mapping[str, Any]] | str | os.PathLike


def as_records_dataset(records: QARecords, name: str = "forget", text_columns: Sequence[str] = ()) -> Dataset:
    """A :class:`datasets.Dataset` from a Dataset, a list of dicts, or a path / Hub id (see
    :func:`hf_unlearn.loaders.load_records`). In a list, ``text_columns`` are checked row by row first (a column
    mixing numbers and text could not become a Dataset)."""
    if isinstance(records, Dataset):
        return records
    if isinstance(records, (str, os.PathLike)):
        return load_records(os.fspath(records))
    if isinstance(records, Mapping):
        raise TypeError(
            f"The {name} records are one mapping; pass a list of {{'question': ..., 'answer': ...}} dicts, a "
            "datasets.Dataset or a path to a JSON/JSONL/CSV/Parquet file."
        )
    records = list(records)
    bad = next((i for i, record in enumerate(records) if not isinstance(record, Mapping)), None)
    if bad is not None:
        raise TypeError(
            f"The {name} records must be dicts with a question and an answer; row {bad} is a "
            f"{type(records[bad]).__name__}: {records[bad]!r:.80}."
        )
    if not records:
        return Dataset.from_dict({})
    where = f"The {name} set"
    records = [dict(record) for record in records]
    for column in text_columns:
        rows = [i for i, record in enumerate(records) if column in record]
        texts = _text_values([records[i][column] for i in rows], column, where, rows)
        for i, text in zip(rows, texts, strict=True):
            records[i][column] = text
    return Dataset.from_list(records)


def _text_values(values: Sequence[Any], column: str, where: str, rows: Sequence[int] | None = None) -> list[str]:
    """A column of questions, answers or texts as text: numbers become text (one warning for the column, however many
    rows hold them), anything else is an error naming the first bad row (``rows``: the row number of each value)."""
    texts, numeric = [], []
    for index, value in enumerate(values):
        row = index if rows is None else rows[index]
        if isinstance(value, str):
            texts.append(value)
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            numeric.append(index)
            texts.append(str(value))
            continue
        raise TypeError(
            f"{where}: column {column!r}, row {row} holds "
            f"{'nothing (null)' if value is None else type(value).__name__ + ' ' + repr(value)[:60]}; "
            f"every {column!r} must be a text string."
        )
    if numeric:
        first = numeric[0]
        logger.warning(
            f"{where}: column {column!r} holds numbers in {len(numeric)} of {len(texts)} rows (first: row "
            f"{first if rows is None else rows[first]}, {values[first]!r}); they are used as text ({texts[first]!r})."
        )
    return texts


def check_qa_records(
    dataset: Dataset, question_column: str, answer_column: str, name: str = "forget", source: str | None = None
) -> list[int]:
    """Refuse what cannot be unlearned or kept, warn about what is legal but suspicious; return the rows whose
    answer is empty.

    Errors (naming the set, its source, the column and the row): no examples, a missing column, a question or
    answer that is null or not text, every answer empty. Warnings: some answers empty, duplicated examples.
    """
    where = f"The {name} set" + (f" ({source})" if source else "")
    if len(dataset) == 0:
        raise ValueError(f"{where} is empty: there is nothing to {'forget' if name == 'forget' else 'keep'}.")
    for column in (question_column, answer_column):
        if column not in dataset.column_names:
            raise ValueError(
                f"{where} has no column {column!r}; it has {dataset.column_names}. "
                "Pass question_column/answer_column to name the right ones."
            )
    questions = _text_values(dataset[question_column], question_column, where)
    answers = _text_values(dataset[answer_column], answer_column, where)
    empty = [i for i, answer in enumerate(answers) if not answer.strip()]
    if len(empty) == len(answers):
        raise ValueError(
            f"{where}: every {answer_column!r} is empty, so there is no answer to "
            f"{'forget' if name == 'forget' else 'keep'}. Check answer_column."
        )
    if empty:
        logger.warning(
            f"{where}: {len(empty)} of {len(answers)} {answer_column!r} values are empty (rows {empty[:5]}); for "
            "those only the end-of-sequence token after the prompt is trained on. Drop them unless that is intended."
        )
    seen: dict[tuple[str, str], int] = {}
    duplicates = []
    for i, pair in enumerate(zip(questions, answers, strict=True)):
        if pair in seen:
            duplicates.append((seen[pair], i))
        else:
            seen[pair] = i
    if duplicates:
        logger.warning(
            f"{where}: {len(duplicates)} example(s) repeat an earlier one (row pairs {duplicates[:3]}); each copy is "
            "trained on, so repeated examples weigh more."
        )
    return empty


def _as_text_columns(dataset: Dataset, columns: Sequence[str]) -> Dataset:
    """Numeric question or answer columns (a JSON file of numbers) as text, as :func:`check_qa_records` read them."""
    from datasets import Value

    for column in columns:
        feature = dataset.features.get(column)
        if isinstance(feature, Value) and feature.dtype not in ("string", "large_string"):
            dataset = dataset.cast_column(column, Value("string"))
    return dataset


def rename_qa_columns(dataset: Dataset, question_column: str, answer_column: str) -> Dataset:
    """The question and answer columns under the names the evaluation reads, ``question`` and ``answer``."""
    for column, canonical in ((question_column, "question"), (answer_column, "answer")):
        if column != canonical:
            if canonical in dataset.column_names:
                dataset = dataset.remove_columns(canonical)
            dataset = dataset.rename_column(column, canonical)
    return dataset


def build_qa_dataset(
    records: QARecords,
    tokenizer: Any,
    question_column: str = "question",
    answer_column: str = "answer",
    max_length: int | None = None,
    prompt_template: str | None = None,
    name: str = "forget",
) -> Dataset:
    """Tokenize question/answer records into ``input_ids``/``attention_mask``/``labels`` (prompt labels ``-100``).

    ``records``: a :class:`datasets.Dataset`, a list of dicts, or a path / Hub id of a JSON, JSONL, CSV or Parquet
    file or dataset. ``prompt_template`` is the format the model was fine-tuned in (see :mod:`hf_unlearn.prompts`:
    the tokenizer's chat template when it has one, else ``"Question: {question}\\nAnswer: {answer}"``).
    ``name`` ("forget", "retain", ...) is used in error messages. Bad records are refused with the row and column
    named (:func:`check_qa_records`). The original columns are kept, the question and answer ones renamed to
    ``question`` and ``answer`` (the evaluation reads them back under those names), so pass the result straight to
    ``UnlearnTrainer``.
    """
    source = os.fspath(records) if isinstance(records, (str, os.PathLike)) else None
    check_prompt_template(prompt_template)
    dataset = as_records_dataset(records, name, (question_column, answer_column))
    check_qa_records(dataset, question_column, answer_column, name, source)
    dataset = rename_qa_columns(
        _as_text_columns(dataset, (question_column, answer_column)), question_column, answer_column
    )

    def encode(example: Mapping[str, Any]) -> dict[str, Any]:
        question, answer = example["question"], example["answer"]
        return tokenize_qa(tokenizer, str(question), str(answer), max_length, prompt_template)

    # A map this small is instant; its progress bar would only add a line per call.
    with _progress_bars_off():
        return dataset.map(encode, desc=f"Tokenizing the {name} set")


def build_text_dataset(
    records: QARecords,
    tokenizer: Any,
    text_column: str = "text",
    max_length: int | None = None,
    name: str = "forget",
) -> Dataset:
    """Tokenize plain-text records (passages of a book, news articles: MUSE's forget corpus) into ``input_ids``/
    ``attention_mask``/``labels`` with every text token scored (:func:`tokenize_text`).

    ``records``: a :class:`datasets.Dataset`, a list of dicts or a path / Hub id, as for :func:`build_qa_dataset`.
    The text column is renamed ``text``. To score only continuations (MASC's MUSE setting), set
    ``forget_scoring="continuation"`` in :class:`~hf_unlearn.config.UnlearnConfig` rather than cutting texts here.
    """
    source = os.fspath(records) if isinstance(records, (str, os.PathLike)) else None
    where = f"The {name} set" + (f" ({source})" if source else "")
    dataset = as_records_dataset(records, name, (text_column,))
    if len(dataset) == 0:
        raise ValueError(f"{where} is empty: there is nothing to {'forget' if name == 'forget' else 'keep'}.")
    if text_column not in dataset.column_names:
        raise ValueError(
            f"{where} has no column {text_column!r}; it has {dataset.column_names}. Pass text_column to name it."
        )
    texts = _text_values(dataset[text_column], text_column, where)
    empty = [i for i, text in enumerate(texts) if not text.strip()]
    if empty:
        raise ValueError(f"{where}: {len(empty)} {text_column!r} value(s) are empty (rows {empty[:5]}); drop them.")
    if text_column != "text":
        if "text" in dataset.column_names:
            dataset = dataset.remove_columns("text")
        dataset = dataset.rename_column(text_column, "text")
    with _progress_bars_off():
        return dataset.map(
            lambda example: tokenize_text(tokenizer, str(example["text"]), max_length),
            desc=f"Tokenizing the {name} set",
        )


@contextlib.contextmanager
def _progress_bars_off() -> Iterator[None]:
    from datasets.utils.logging import disable_progress_bar, enable_progress_bar, is_progress_bar_enabled

    was_enabled = is_progress_bar_enabled()
    disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            enable_progress_bar()


def pad_examples(examples: Sequence[Mapping[str, Any]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad ``input_ids`` (with the pad id), ``attention_mask`` (0) and ``labels`` (-100) to one length."""
    length = max(len(e["input_ids"]) for e in examples)
    batch: dict[str, list[list[int]]] = {"input_ids": [], "attention_mask": [], "labels": []}
    for e in examples:
        ids = list(e["input_ids"])
        mask = list(e.get("attention_mask") or [1] * len(ids))
        labels = list(e["labels"]) if "labels" in e else list(ids)
        gap = length - len(ids)
        batch["input_ids"].append(ids + [pad_token_id] * gap)
        batch["attention_mask"].append(mask + [0] * gap)
        batch["labels"].append(labels + [IGNORE_INDEX] * gap)
    return {k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()}


class ForgetRetainCollator:
    """Collate items of :class:`ForgetRetainDataset` into ``{"forget": batch, "retain": batch}``.

    Each side is padded with :func:`pad_examples`, or with ``inner`` (any Trainer data collator) when given.
    """

    def __init__(self, pad_token_id: int, inner: Any = None) -> None:
        self.pad_token_id = pad_token_id
        self.inner = inner

    def _collate(self, examples: list[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        if self.inner is not None:
            return dict(self.inner(examples))
        return pad_examples(examples, self.pad_token_id)

    def __call__(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, torch.Tensor]]:
        batch = {"forget": self._collate([e["forget"] for e in examples])}
        for side in ("retain", "refusal"):
            if examples[0].get(side) is not None:
                batch[side] = self._collate([e[side] for e in examples])
        return batch


MODEL_INPUT_KEYS = ("input_ids", "attention_mask", "labels")


def model_inputs(example: Mapping[str, Any]) -> dict[str, list[int]]:
    """Keep only what the model reads, dropping text columns such as ``question``."""
    return {k: example[k] for k in MODEL_INPUT_KEYS if k in example}


class ForgetRetainDataset(torch.utils.data.Dataset):
    """Each item is one forget example paired with one retain example.

    The epoch runs over the forget examples (what Trainer would have trained on). Retain examples are paired
    through a seeded permutation, offset by ``epoch * len(forget)`` (see :meth:`set_epoch`), so the pairing is
    deterministic (a resumed run sees the same pairs) and still walks through a retain set larger than the
    forget set over the epochs.
    """

    def __init__(
        self,
        forget: Sequence[Mapping[str, Any]],
        retain: Sequence[Mapping[str, Any]] | None,
        seed: int = 0,
        refusal: Sequence[Mapping[str, Any]] | None = None,
        forget_labels: Callable[[dict[str, Any], int, int], dict[str, Any]] | None = None,
    ):
        self.forget = forget
        self.retain = retain
        self.refusal = refusal
        self.forget_labels = forget_labels
        if retain is not None and len(retain) > 0:
            generator = torch.Generator().manual_seed(seed)
            self._retain_order = torch.randperm(len(retain), generator=generator).tolist()
        else:
            self._retain_order = []
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.forget)

    def __getitem__(self, index: int) -> dict[str, Any]:
        forget = model_inputs(self.forget[index])
        if self.forget_labels is not None:
            forget = self.forget_labels(forget, index, self.epoch)
        item: dict[str, Any] = {"forget": forget, "retain": None}
        if self.refusal is not None:
            item["refusal"] = model_inputs(self.refusal[index])
        if self._retain_order:
            item["retain"] = model_inputs(
                self.retain[self._retain_order[(index + self.epoch * len(self.forget)) % len(self._retain_order)]]
            )
        return item


def split_holdout(num_examples: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Split forget indices into (trained, held out); the held-out part is never put in a training batch.

    The split depends only on ``seed``, so every process of a distributed run holds the same one.
    """
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {fraction}.")
    num_holdout = round(num_examples * fraction)
    if fraction > 0 and num_holdout == 0:
        num_holdout = 1
    if num_holdout >= num_examples:
        raise ValueError(
            f"The forget set has {num_examples} examples, too few to hold out {fraction:.0%} for the stopping "
            "probe and still train on the rest. Add forget examples, lower holdout_fraction or use stop_probe='train'."
        )
    order = torch.randperm(num_examples, generator=torch.Generator().manual_seed(seed)).tolist()
    return sorted(order[num_holdout:]), sorted(order[:num_holdout])
