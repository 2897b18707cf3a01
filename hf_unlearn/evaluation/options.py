"""Answers scored after their question's prompt, encoded once: a question's options.

TOFU's truth ratio (the paraphrased against the perturbed answers) and its normalised probability over the
real-knowledge options (Maini et al. 2024, §2.5) score several answers after one question. :func:`score_after_prompts`
runs each prompt once into a KV cache and scores every option as its continuation; :func:`option_scores` is the one
option scorer both metrics read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

from ..data.examples import tokenize_qa
from ..data.pairing import pad_examples
from ..forwards import forward_after_prompts, prompt_cache_keyword
from .metrics import (
    evaluating,
    left_pad,
    log_prob_sums_and_counts,
    model_device,
    pad_token_id_of,
    progress_bar,
    prompt_length,
    score_teacher_forced,
)

__all__ = [
    "normalized_probabilities",
    "normalized_probabilities_from",
    "option_scores",
    "real_knowledge_options",
    "score_after_prompts",
    "truth_ratios",
    "truth_ratios_from",
]


def prompt_batches(
    groups: Sequence[tuple[tuple[int, ...], list[int]]], batch_size: int
) -> Iterable[list[tuple[tuple[int, ...], list[int]]]]:
    """Consecutive ``(prompt, answer indices)`` groups, whole, with at most ``batch_size`` answers a batch (a group
    of more answers alone)."""
    batch: list[tuple[tuple[int, ...], list[int]]] = []
    for group in groups:
        if batch and sum(len(indices) for _, indices in batch) + len(group[1]) > batch_size:
            yield batch
            batch = []
        batch.append(group)
    if batch:
        yield batch


def score_after_prompts(
    model: Any,
    examples: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    batch_size: int = 32,
    show_progress: bool = False,
    desc: str = "Scoring options",
) -> list[tuple[float, int]]:
    """``(sum of the answer tokens' log-probabilities, number of answer tokens)`` of tokenized examples, as
    :func:`answer_log_probs`'s teacher-forced pass gives them, with each prompt encoded once for all the answers
    scored after it (a question's options: the truth ratio's paraphrased and perturbed answers, TOFU's real-knowledge
    options).

    The prompt of an example is its leading tokens labelled ``-100``; examples with the same prompt form a group.
    Per batch of groups (sorted by prompt length, at most ``batch_size`` answers): one forward over the prompts but
    their last token, left-padded, into a ``DynamicCache``; the cache repeated over each group's answers
    (``reorder_cache``, beam search's own); then one forward over every answer as a right-padded continuation (the
    prompt's last token, which predicts the first answer token, then the answer), at the positions after its own
    prompt. Falls back to the full (prompt + answer) forward of :func:`score_teacher_forced` for a model whose cache
    cannot be continued this way (:func:`prompt_cache_keyword`) and when a prompt has fewer than two tokens (there
    is then nothing before its last token to cache).
    """
    keyword = prompt_cache_keyword(model)
    lengths = [prompt_length(example) for example in examples]
    if keyword is None or min(lengths, default=0) < 2:
        return score_teacher_forced(
            model, examples, pad_token_id, log_prob_sums_and_counts, batch_size, show_progress, desc
        )
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, (example, length) in enumerate(zip(examples, lengths, strict=True)):
        groups.setdefault(tuple(example["input_ids"][:length]), []).append(index)
    ordered = sorted(groups.items(), key=lambda group: len(group[0]))
    results: list[tuple[float, int]] = [(0.0, 0)] * len(examples)
    total = len(list(prompt_batches(ordered, batch_size)))
    with evaluating(model):
        for batch in progress_bar(prompt_batches(ordered, batch_size), total, desc, show_progress):
            indices = [index for _, group in batch for index in group]
            answers = [
                {
                    "input_ids": examples[i]["input_ids"][lengths[i] - 1 :],
                    "labels": examples[i]["labels"][lengths[i] - 1 :],
                }
                for i in indices
            ]
            scored = score_continuations(
                model, keyword, [prompt for prompt, _ in batch], [len(g) for _, g in batch], answers, pad_token_id
            )
            for index, value in zip(indices, scored, strict=True):
                results[index] = value
    return results


def score_continuations(
    model: Any,
    keyword: str,
    prompts: Sequence[Sequence[int]],
    counts: Sequence[int],
    answers: Sequence[Mapping[str, Any]],
    pad_token_id: int,
) -> list[tuple[float, int]]:
    """:func:`log_prob_sums_and_counts` of ``answers`` (``input_ids`` from each prompt's last token on, ``labels``
    ``-100`` on it), the first ``counts[0]`` after ``prompts[0]``, the next ``counts[1]`` after ``prompts[1]``, ...:
    the prompts but their last token run once into a KV cache, which is repeated over their answers."""
    device = model_device(model)
    prefix = {k: v.to(device) for k, v in left_pad([prompt[:-1] for prompt in prompts], pad_token_id).items()}
    rows = torch.repeat_interleave(torch.arange(len(prompts), device=device), torch.tensor(counts, device=device))
    padded = {k: v.to(device) for k, v in pad_examples(answers, pad_token_id).items()}
    logits = forward_after_prompts(
        model, keyword, prefix["input_ids"], prefix["attention_mask"], rows, padded["input_ids"],
        padded["attention_mask"],
    )  # fmt: skip
    return log_prob_sums_and_counts(logits, padded["labels"])


def option_scores(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    base_key: str,
    batch_size: int,
    show_progress: bool,
    prompt_template: str | None = None,
) -> list[tuple[float, list[float]]]:
    """Per record with ``base_key`` and ``perturbed_answer``: the mean token log-probability of the base answer
    and of each perturbed answer, all scored in one batched pass that encodes each question's prompt once for all
    its options (:func:`score_after_prompts`). The one option scorer of the truth ratio and of the normalised
    probability over TOFU's real-knowledge options."""
    if hasattr(dataset_or_records, "column_names") and not {base_key, "perturbed_answer"} <= set(
        dataset_or_records.column_names
    ):
        return []
    records = [r for r in dataset_or_records if r.get(base_key) and r.get("perturbed_answer")]
    examples = [
        tokenize_qa(tokenizer, str(record["question"]), str(answer), prompt_template=prompt_template)
        for record in records
        for answer in [record[base_key], *record["perturbed_answer"]]
    ]
    scored = iter(score_after_prompts(model, examples, pad_token_id_of(tokenizer), batch_size, show_progress))
    result = []
    for record in records:
        base_total, base_count = next(scored)
        perturbed = [total / max(count, 1) for total, count in (next(scored) for _ in record["perturbed_answer"])]
        result.append((base_total / max(base_count, 1), perturbed))
    return result


def truth_ratios(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[float]:
    """Per question TOFU truth ratio ``P~(perturbed) / P~(paraphrased)`` (Maini et al. 2024, §2.5).

    ``P~(a) = exp(-mean token NLL of a)``; the perturbed answers are averaged in log space. Records need
    ``question``, ``paraphrased_answer`` and ``perturbed_answer`` (a list of strings); others are skipped.
    """
    scores = option_scores(
        model, tokenizer, dataset_or_records, "paraphrased_answer", batch_size, show_progress, prompt_template
    )
    return truth_ratios_from(scores)


def truth_ratios_from(scores: Sequence[tuple[float, list[float]]]) -> list[float]:
    """Truth ratios from :func:`option_scores` (base = the paraphrased answer)."""
    return [math.exp(sum(perturbed) / len(perturbed) - base) for base, perturbed in scores]


def normalized_probabilities(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[float]:
    """Per question ``P~(answer) / (P~(answer) + sum P~(perturbed))``: TOFU's "Prob" on the real-authors and
    world-facts sets (Maini et al. 2024, §2.5), where the perturbed answers act as wrong options."""
    scores = option_scores(model, tokenizer, dataset_or_records, "answer", batch_size, show_progress, prompt_template)
    return normalized_probabilities_from(scores)


def normalized_probabilities_from(scores: Sequence[tuple[float, list[float]]]) -> list[float]:
    """Normalised probabilities from :func:`option_scores` (base = the answer)."""
    return [1.0 / (1.0 + sum(math.exp(p - base) for p in perturbed)) for base, perturbed in scores]


def real_knowledge_options(
    model: Any,
    tokenizer: Any,
    dataset_or_records: Any,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> tuple[list[float], list[float]]:
    """Per question of a real-knowledge set (TOFU's real authors and world facts, Maini et al. 2024, §2.5): the
    probability normalised over the answer and its perturbed answers, and the truth ratio.

    TOFU's real-knowledge sets compare the perturbed answers with the answer itself (the loader sets it as the
    paraphrase): the truth ratio then reads the same option scores instead of a second pass over every option."""
    shared = {"batch_size": batch_size, "show_progress": show_progress, "prompt_template": prompt_template}
    scores = option_scores(model, tokenizer, dataset_or_records, "answer", **shared)
    if all("paraphrased_answer" in r and r["paraphrased_answer"] == r["answer"] for r in dataset_or_records):
        return normalized_probabilities_from(scores), truth_ratios_from(scores)
    return normalized_probabilities_from(scores), truth_ratios(model, tokenizer, dataset_or_records, **shared)
