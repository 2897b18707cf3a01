"""Turning question/answer data and plain text into the tensors Trainer takes, with the checks of each record.

Every example is ``input_ids``, ``attention_mask`` and ``labels`` with ``-100`` on the prompt, which is the
form transformers' ``Trainer`` and TRL's ``SFTTrainer`` (completion-only loss) already use.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from datasets import Dataset
from transformers.utils import logging

from .loaders import load_records
from .prompts import check_prompt_template, prompt_and_completion, uses_chat_template

logger = logging.get_logger(__name__)

IGNORE_INDEX = -100


def prompt_copies(input_ids: torch.Tensor, labels: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Which answer tokens repeat the prompt: each answer token (``labels != -100``) in a pair of consecutive answer
    tokens that the same row's prompt (its attended tokens whose label is ``-100``) also holds as a consecutive pair.
    An author's name the question spells is such a run; a single shared word ("pet" in "What pet does ...") is not.
    Boolean, shaped like ``labels`` (unshifted, as the batch holds them)."""
    answer = labels != IGNORE_INDEX
    prompt = (attention_mask != 0) & ~answer
    copies = torch.zeros_like(answer)
    # One integer per pair of consecutive tokens (ids are below 2**32), with no read of the largest id from the device.
    pairs = (input_ids[:, :-1].long() << 32) | input_ids[:, 1:].long()
    for row in range(input_ids.shape[0]):
        prompt_pairs = pairs[row][prompt[row, :-1] & prompt[row, 1:]]
        in_answer = answer[row, :-1] & answer[row, 1:]
        copied = in_answer & torch.isin(pairs[row], prompt_pairs)
        copies[row, :-1] |= copied
        copies[row, 1:] |= copied
    return copies


def tokenize_prompt(tokenizer: Any, question: str, prompt_template: str | None = None) -> list[int]:
    """Token ids of the prompt alone, as fed to ``generate`` at evaluation time."""
    prompt, _ = prompt_and_completion(tokenizer, question, "", prompt_template)
    return _encode(tokenizer, prompt, add_special_tokens=not uses_chat_template(tokenizer, prompt_template))


def tokenize_qa(
    tokenizer: Any, question: str, answer: str, max_length: int | None = None, prompt_template: str | None = None
) -> dict[str, list[int]]:
    """Tokenize one QA pair; prompt tokens get label ``-100`` so only the answer is scored.

    Prompt and completion are encoded separately and concatenated, so the prompt/answer boundary never
    depends on how a tokenizer merges across it. ``prompt_template``: see :mod:`hf_unlearn.data.prompts`.
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


def appended_eos(tokenizer: Any, model_config: Any = None) -> int | None:
    """The EOS id :func:`tokenize_qa` appends after an answer in the tokenizer's default format (its chat template,
    else the plain one), which the evaluation's membership attack does not score; None where nothing is appended: no
    EOS, or a chat template that ends the assistant's turn with the EOS itself (then the completion holds it and both
    score it). Without a tokenizer, the model config's EOS (the first, where it lists several). Not covered: data
    tokenized in another format than the tokenizer's default (``prompt_template``), and :func:`tokenize_text`'s text
    with such a chat template (it always appends the EOS): there the stop scores one EOS token the attack does not."""
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else None
    if tokenizer is None:
        eos = getattr(model_config, "eos_token_id", None)
        eos = eos[0] if isinstance(eos, (list, tuple)) and eos else eos
        return eos if isinstance(eos, int) else None
    if eos is None:
        return None
    _, completion = prompt_and_completion(tokenizer, "?", "a")
    ids = _encode(tokenizer, completion, add_special_tokens=False)
    return None if ids and ids[-1] == eos else eos


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
    :func:`hf_unlearn.data.loaders.load_records`). In a list, ``text_columns`` are checked row by row first (a column
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
    file or dataset. ``prompt_template`` is the format the model was fine-tuned in (see :mod:`hf_unlearn.data.prompts`:
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
    ``forget_scoring="continuation"`` in :class:`~hf_unlearn.training.config.UnlearnConfig` rather than cutting texts
    here.
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
