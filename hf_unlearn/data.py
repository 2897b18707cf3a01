"""Turning question/answer data into the tensors Trainer takes, and pairing forget with retain batches.

Every example is ``input_ids``, ``attention_mask`` and ``labels`` with ``-100`` on the prompt, which is the
form transformers' ``Trainer`` and TRL's ``SFTTrainer`` (completion-only loss) already use.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from datasets import Dataset
from transformers.utils import logging

logger = logging.get_logger(__name__)

IGNORE_INDEX = -100
PLAIN_PROMPT_TEMPLATE = "Question: {question}\nAnswer:"


def prompt_and_completion(tokenizer: Any, question: str, answer: str) -> tuple[str, str]:
    """Return the prompt text and the completion text for one QA pair.

    With a chat template the question is the user turn and the answer the assistant turn (the completion is
    whatever the template appends for the assistant, end-of-turn tokens included); without one, a plain
    ``Question: ...\\nAnswer: ...`` format is used. The EOS token is appended by :func:`tokenize_qa`.
    """
    if getattr(tokenizer, "chat_template", None):
        user = [{"role": "user", "content": question}]
        prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(user + [{"role": "assistant", "content": answer}], tokenize=False)
        if full.startswith(prompt):
            return prompt, full[len(prompt) :]
        return prompt, answer
    return PLAIN_PROMPT_TEMPLATE.format(question=question), " " + answer


def tokenize_prompt(tokenizer: Any, question: str) -> list[int]:
    """Token ids of the prompt alone, as fed to ``generate`` at evaluation time."""
    prompt, _ = prompt_and_completion(tokenizer, question, "")
    return _encode(tokenizer, prompt, add_special_tokens=not getattr(tokenizer, "chat_template", None))


def tokenize_qa(tokenizer: Any, question: str, answer: str, max_length: int | None = None) -> dict[str, list[int]]:
    """Tokenize one QA pair; prompt tokens get label ``-100`` so only the answer is scored.

    Prompt and completion are encoded separately and concatenated, so the prompt/answer boundary never
    depends on how a tokenizer merges across it.
    """
    prompt, completion = prompt_and_completion(tokenizer, question, answer)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    prompt_ids = _encode(tokenizer, prompt, add_special_tokens=not has_template)
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


def build_qa_dataset(
    dataset: Dataset,
    tokenizer: Any,
    question_column: str = "question",
    answer_column: str = "answer",
    max_length: int | None = None,
) -> Dataset:
    """Tokenize a dataset with question and answer columns into ``input_ids``/``attention_mask``/``labels``.

    The original columns are kept, the question and answer ones renamed to ``question`` and ``answer`` (the
    evaluation reads them back under those names), so pass the result straight to ``UnlearnTrainer``.
    """
    for column in (question_column, answer_column):
        if column not in dataset.column_names:
            raise ValueError(
                f"Column {column!r} not found; the dataset has {dataset.column_names}. "
                "Pass question_column/answer_column to name the right ones."
            )
    for column, canonical in ((question_column, "question"), (answer_column, "answer")):
        if column != canonical:
            if canonical in dataset.column_names:
                dataset = dataset.remove_columns(canonical)
            dataset = dataset.rename_column(column, canonical)
    question_column, answer_column = "question", "answer"

    def encode(example: Mapping[str, Any]) -> dict[str, Any]:
        return tokenize_qa(tokenizer, example[question_column], example[answer_column], max_length)

    return dataset.map(encode, desc="Tokenizing question/answer pairs")


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
    ):
        self.forget = forget
        self.retain = retain
        self.refusal = refusal
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
        item: dict[str, Any] = {"forget": model_inputs(self.forget[index]), "retain": None}
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
