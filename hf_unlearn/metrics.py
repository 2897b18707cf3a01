"""Question/answer metrics of TOFU (Maini et al., 2024, "TOFU: A Task of Fictitious Unlearning for LLMs"), batched.

* ROUGE-L recall of the greedy answer against the reference answer (TOFU's "ROUGE"),
* the answer probability ``P(a | q) ** (1 / |a|)``, i.e. ``exp(-mean token NLL)`` of the reference answer given
  the question (TOFU's "Prob" on the forget and retain sets),
* exact match of the greedy answer (after whitespace, case and trailing-punctuation normalisation).

Prompts and answers are tokenized by :mod:`hf_unlearn.data` exactly as for learning and unlearning, so a metric
scores the very tokens the model was trained on.
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from hf_unlearn.data import IGNORE_INDEX, pad_examples, tokenize_prompt, tokenize_qa
from hf_unlearn.objectives import token_log_probs

__all__ = [
    "answer_log_probs",
    "answer_probability",
    "default_max_new_tokens",
    "evaluate_qa",
    "exact_match",
    "generate_answers",
    "rouge_l_recall",
]


def _batches(items: Sequence[Any], batch_size: int) -> Iterable[Sequence[Any]]:
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    for start in range(0, len(items), batch_size):
        yield items[start : start + batch_size]


def _progress(iterable: Iterable[Any], total: int, desc: str, show: bool) -> Iterable[Any]:
    if not show:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc)


def _pad_token_id(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("The tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token first.")
    return pad


def _device(model: Any) -> torch.device:
    return next(model.parameters()).device


def generate_answers(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    max_new_tokens: int = 32,
    batch_size: int = 32,
    show_progress: bool = False,
) -> list[str]:
    """Greedy answers to ``questions``, generated in left-padded batches.

    The prompt is :func:`hf_unlearn.data.tokenize_prompt` (the same prompt as in learning). Generation stops at
    EOS; only the new tokens are decoded, without special tokens, and stripped. The model is put in eval mode
    for the call and its training mode restored afterwards.
    """
    from transformers import GenerationConfig

    pad_id = _pad_token_id(tokenizer)
    eos_id = tokenizer.eos_token_id
    generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    device = _device(model)
    was_training = model.training
    padding_side = tokenizer.padding_side
    answers: list[str] = []
    model.eval()
    tokenizer.padding_side = "left"
    try:
        prompts = [tokenize_prompt(tokenizer, q) for q in questions]
        batches = _batches(prompts, batch_size)
        total = math.ceil(len(prompts) / batch_size)
        with torch.inference_mode():
            for batch in _progress(batches, total, "Generating answers", show_progress):
                if tokenizer.pad_token_id is None:
                    padded = _left_pad(batch, pad_id)
                else:
                    padded = tokenizer.pad({"input_ids": list(batch)}, padding=True, return_tensors="pt")
                input_ids = padded["input_ids"].to(device)
                attention_mask = padded["attention_mask"].to(device)
                output = model.generate(
                    input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config
                )
                for row in output[:, input_ids.shape[1] :].tolist():
                    if eos_id is not None and eos_id in row:
                        row = row[: row.index(eos_id)]
                    answers.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return answers


def _left_pad(batch: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    length = max(len(ids) for ids in batch)
    input_ids = [[pad_id] * (length - len(ids)) + list(ids) for ids in batch]
    attention_mask = [[0] * (length - len(ids)) + [1] * len(ids) for ids in batch]
    return {"input_ids": torch.tensor(input_ids), "attention_mask": torch.tensor(attention_mask)}


def answer_log_probs(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    batch_size: int = 32,
    show_progress: bool = False,
) -> list[tuple[float, int]]:
    """Per example ``(sum of the answer tokens' log-probabilities, number of answer tokens)``, teacher-forced.

    Examples are :func:`hf_unlearn.data.tokenize_qa` (answer tokens are those whose label is not ``-100``, EOS
    included), right-padded with :func:`hf_unlearn.data.pad_examples`; the token at position ``t + 1`` is scored
    by the logits at ``t``, as in a causal LM loss.
    """
    if len(questions) != len(answers):
        raise ValueError(f"Got {len(questions)} questions but {len(answers)} answers.")
    pad_id = _pad_token_id(tokenizer)
    device = _device(model)
    examples = [tokenize_qa(tokenizer, q, a) for q, a in zip(questions, answers, strict=True)]
    results: list[tuple[float, int]] = []
    was_training = model.training
    model.eval()
    try:
        total = math.ceil(len(examples) / batch_size)
        with torch.inference_mode():
            for batch in _progress(_batches(examples, batch_size), total, "Scoring answers", show_progress):
                padded = {k: v.to(device) for k, v in pad_examples(batch, pad_id).items()}
                logits = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
                log_probs, mask = token_log_probs(logits, padded["labels"])
                sums = log_probs.sum(dim=-1)
                counts = mask.sum(dim=-1)
                results.extend(zip(sums.tolist(), counts.tolist(), strict=True))
    finally:
        model.train(was_training)
    return results


def answer_probability(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    batch_size: int = 32,
    show_progress: bool = False,
) -> list[float]:
    """Per example ``exp(-mean token NLL)`` of the answer, i.e. ``P(a | q) ** (1 / |a|)`` (TOFU's "Prob")."""
    return [
        math.exp(total / count) if count else float("nan")
        for total, count in answer_log_probs(model, tokenizer, questions, answers, batch_size, show_progress)
    ]


_ROUGE_SCORER: Any = None


def rouge_l_recall(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L recall of each prediction against its reference (TOFU's "ROUGE"), with Porter stemming."""
    global _ROUGE_SCORER
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions but {len(references)} references.")
    if _ROUGE_SCORER is None:
        from rouge_score import rouge_scorer

        _ROUGE_SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [_ROUGE_SCORER.score(ref, pred)["rougeL"].recall for pred, ref in zip(predictions, references, strict=True)]


_TRAILING_PUNCTUATION = string.punctuation


def _normalize(text: str) -> str:
    return " ".join(text.split()).lower().rstrip(_TRAILING_PUNCTUATION).rstrip()


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """1.0 where prediction and reference are equal after collapsing whitespace, lower-casing and stripping
    trailing punctuation, else 0.0."""
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions but {len(references)} references.")
    return [float(_normalize(p) == _normalize(r)) for p, r in zip(predictions, references, strict=True)]


def default_max_new_tokens(tokenizer: Any, answers: Iterable[str], margin: int = 4) -> int:
    """Tokens enough to generate the longest answer (EOS included) plus ``margin``."""
    longest = max(
        (sum(label != IGNORE_INDEX for label in tokenize_qa(tokenizer, "", a)["labels"]) for a in answers),
        default=0,
    )
    return longest + margin


def _records(dataset_or_records: Any) -> list[Mapping[str, Any]]:
    if hasattr(dataset_or_records, "column_names"):  # a datasets.Dataset
        columns = dataset_or_records.column_names
        if "question" not in columns or "answer" not in columns:
            return []
        return list(dataset_or_records.select_columns(["question", "answer"]))
    return [r for r in dataset_or_records if r.get("question") is not None and r.get("answer") is not None]


def evaluate_qa(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    max_new_tokens: int | None = None,
    batch_size: int = 32,
    show_progress: bool = False,
) -> dict[str, float]:
    """Mean ROUGE-L recall, answer probability and exact match over the records with ``question`` and ``answer``.

    ``dataset_or_records`` is a :class:`datasets.Dataset` or a sequence of mappings. ``max_new_tokens`` defaults
    to the longest tokenized answer plus a few tokens. Returns ``{"rouge_l_recall", "probability",
    "exact_match", "num_examples"}`` (the means are NaN when there is no example).
    """
    records = _records(dataset_or_records)
    questions = [str(r["question"]) for r in records]
    answers = [str(r["answer"]) for r in records]
    if not records:
        nan = float("nan")
        return {"rouge_l_recall": nan, "probability": nan, "exact_match": nan, "num_examples": 0}
    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(tokenizer, answers)
    predictions = generate_answers(model, tokenizer, questions, max_new_tokens, batch_size, show_progress)
    probabilities = answer_probability(model, tokenizer, questions, answers, batch_size, show_progress)

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    return {
        "rouge_l_recall": mean(rouge_l_recall(predictions, answers)),
        "probability": mean(probabilities),
        "exact_match": mean(exact_match(predictions, answers)),
        "num_examples": len(records),
    }


def truth_ratios(model: Any, tokenizer: Any, dataset_or_records: Any, batch_size: int = 32) -> list[float]:
    """Per question TOFU truth ratio ``P~(perturbed) / P~(paraphrased)`` (Maini et al. 2024, §2.5).

    ``P~(a) = exp(-mean token NLL of a)``; the perturbed answers are averaged in log space. Records need
    ``question``, ``paraphrased_answer`` and ``perturbed_answer`` (a list of strings).
    """
    records = [r for r in dataset_or_records if r.get("paraphrased_answer") and r.get("perturbed_answer")]
    questions, answers, owners = [], [], []
    for index, record in enumerate(records):
        for answer in [record["paraphrased_answer"], *record["perturbed_answer"]]:
            questions.append(str(record["question"]))
            answers.append(str(answer))
            owners.append(index)
    scored = answer_log_probs(model, tokenizer, questions, answers, batch_size)
    paraphrased: dict[int, float] = {}
    perturbed: dict[int, list[float]] = {}
    cursor = 0
    for index, record in enumerate(records):
        total, count = scored[cursor]
        paraphrased[index] = total / max(count, 1)
        others = scored[cursor + 1 : cursor + 1 + len(record["perturbed_answer"])]
        perturbed[index] = [s / max(c, 1) for s, c in others]
        cursor += 1 + len(record["perturbed_answer"])
    return [math.exp(sum(perturbed[i]) / len(perturbed[i]) - paraphrased[i]) for i in range(len(records))]


def forget_truth_ratio(ratios: Sequence[float]) -> float:
    """TOFU's forget-set aggregation ``mean(min(TR, 1/TR))``: 1 when paraphrase and perturbations look alike."""
    return sum(min(r, 1.0 / r) for r in ratios) / len(ratios) if ratios else float("nan")


def retain_truth_ratio(ratios: Sequence[float]) -> float:
    """TOFU's retain-set aggregation ``mean(max(0, 1 - TR))``: high when the true paraphrase is preferred."""
    return sum(max(0.0, 1.0 - r) for r in ratios) / len(ratios) if ratios else float("nan")
