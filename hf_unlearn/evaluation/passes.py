"""The model's passes for evaluation: generation and teacher-forced scoring, run here, returned as plain results.

Above :mod:`hf_unlearn.forwards` and :mod:`hf_unlearn.scores`, below every metric of :mod:`hf_unlearn.evaluation`,
and importing none: a metric asks for a pass and computes from what it returns, so evaluation flows one way.

* Generation: greedy answers and continuations, left-padded batches with the KV cache (:func:`generate_answers`).
* Teacher-forced scoring: :func:`score_teacher_forced` runs the batched forward and hands each batch's logits and
  labels to a reducer (:func:`log_prob_sums_and_counts`, or a metric's own); :func:`answer_log_probs`.
* The one pass per (question, answer) the answer metrics read (:func:`score_answers`), per example an
  :class:`AnswerScores` with

  * ``log_prob_sum`` and ``count``: the answer tokens' summed log-probability and their number (answer probability,
    truth ratio), reduced in the batch exactly as :func:`answer_log_probs` does;
  * ``predictions`` and ``labels``: the argmax at every answer position but the last (memorisation metrics);
  * ``violations``: with ``k``, the answer tokens whose restricted margin (:func:`hf_unlearn.objectives.masc.margin.
    restricted_margin`, self-competitors, beta 1) is above ``tau``, and their number in ``violation_fraction``;
  * ``token_log_probs`` (when asked): the example's token ids, where its answer starts, and each answer token's
    log-probability, EOS included (the loss, zlib and Min-K% membership attacks);
  * ``token_mean`` and ``token_std`` (when asked): at each answer token's position, the mean ``mu = sum_z p log p``
    and the standard deviation ``sqrt(sum_z p (log p)^2 - mu^2)`` of ``log p(z | prefix)`` under the model's own
    distribution, what Min-K%++ standardises with (Zhang et al., "Min-K%++", ICLR 2025, arXiv 2404.02936, §3).

* A question's options scored after its prompt, encoded once (:func:`option_scores`): the truth ratio's reading.

Prompts and answers are tokenized by :mod:`hf_unlearn.data` exactly as for learning and unlearning, so a pass scores
the very tokens the model was trained on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ..data.examples import IGNORE_INDEX, tokenize_prompt, tokenize_qa
from ..data.pairing import pad_examples
from ..forwards import (
    accepts_logits_to_keep,
    answer_logits,
    cache_keyword,
    forward_after_prompts,
    left_padded_positions,
    prompt_cache_keyword,
)
from ..objectives.masc.margin import restricted_margin, violation_fractions
from ..scores import shift_for_causal_lm, token_log_probs

#: Greedy answers generated per batch by :func:`~hf_unlearn.evaluation.metrics.evaluate_qa`. Decoding one token
#: costs about one read of the weights whatever the batch (a forward of a few rows is memory-bound), so fewer, larger
#: batches cost less; rows that reach EOS leave the batch (:func:`greedy_decode`).
GENERATION_BATCH_SIZE = 64


def batches(items: Sequence[Any], batch_size: int) -> Iterable[Sequence[Any]]:
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    for start in range(0, len(items), batch_size):
        yield items[start : start + batch_size]


def by_length(items: Sequence[Any], length: Any = len) -> tuple[list[Any], list[int]]:
    """``items`` sorted by length (so a batch pads little) and the permutation that sorted them; results computed
    in sorted order go back with :func:`restore_order`."""
    order = sorted(range(len(items)), key=lambda i: length(items[i]))
    return [items[i] for i in order], order


def restore_order(results: Sequence[Any], order: Sequence[int]) -> list[Any]:
    restored: list[Any] = [None] * len(order)
    for position, index in enumerate(order):
        restored[index] = results[position]
    return restored


def progress_bar(iterable: Iterable[Any], total: int, desc: str, show: bool) -> Iterable[Any]:
    if not show:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc)


def pad_token_id_of(tokenizer: Any) -> int:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError("The tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token first.")
    return pad


def model_device(model: Any) -> torch.device:
    return next(model.parameters()).device


def qa_records(dataset_or_records: Any) -> list[Mapping[str, Any]]:
    if hasattr(dataset_or_records, "column_names"):  # a datasets.Dataset
        columns = dataset_or_records.column_names
        if "question" not in columns or "answer" not in columns:
            return []
        return list(dataset_or_records.select_columns(["question", "answer"]))
    return [r for r in dataset_or_records if r.get("question") is not None and r.get("answer") is not None]


def generate_answers(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    max_new_tokens: int = 32,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[str]:
    """Greedy answers to ``questions``, generated in left-padded batches.

    The prompt is :func:`hf_unlearn.data.tokenize_prompt` (the same prompt as in learning). Generation stops at
    EOS; only the new tokens are decoded, without special tokens, and stripped. The model is put in eval mode
    for the call and its training mode restored afterwards.
    """
    prompts = [tokenize_prompt(tokenizer, q, prompt_template) for q in questions]
    return generate_continuations(model, tokenizer, prompts, max_new_tokens, batch_size, show_progress)


def generate_continuations(
    model: Any,
    tokenizer: Any,
    prompt_ids: Sequence[Sequence[int]],
    max_new_tokens: int = 32,
    batch_size: int = 32,
    show_progress: bool = False,
    desc: str = "Generating answers",
) -> list[str]:
    """Greedy continuations of already tokenized prompts, in left-padded batches of similar length under
    ``inference_mode``, with the KV cache (:func:`greedy_decode`: a row that reached EOS leaves the batch).

    Generation stops at EOS; the new tokens are decoded without special tokens and stripped.
    """
    pad_id = pad_token_id_of(tokenizer)
    eos_id = tokenizer.eos_token_id
    device = model_device(model)
    was_training = model.training
    answers: list[str] = []
    prompt_ids, order = by_length(prompt_ids)
    model.eval()
    try:
        total = math.ceil(len(prompt_ids) / batch_size)
        with torch.inference_mode():
            for batch in progress_bar(batches(prompt_ids, batch_size), total, desc, show_progress):
                padded = left_pad(batch, pad_id)
                rows = greedy_decode(
                    model, padded["input_ids"].to(device), padded["attention_mask"].to(device), max_new_tokens, eos_id,
                    pad_id, tokenizer.bos_token_id,
                )  # fmt: skip
                answers.extend(tokenizer.decode(row, skip_special_tokens=True).strip() for row in rows)
    finally:
        model.train(was_training)
    return restore_order(answers, order)


def greedy_decode(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    bos_id: int | None = None,
) -> list[list[int]]:
    """Greedy new tokens of every row of a left-padded batch, up to (not including) its first ``eos_id``.

    The tokens transformers' greedy ``generate`` gives (same positions, mask and KV cache), but a row that reached
    EOS is dropped from the batch and its cache, so finished rows stop costing. Falls back to ``generate`` for a
    model whose forward takes no cache (:func:`cache_keyword`).
    """
    if max_new_tokens < 1:
        return [[] for _ in range(input_ids.shape[0])]
    keyword = cache_keyword(model)
    if keyword is None:
        return generate_fallback(model, input_ids, attention_mask, max_new_tokens, eos_id, pad_id, bos_id)
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    positions = left_padded_positions(attention_mask)
    extra = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=True,
        **{keyword: cache}, **extra,
    ).logits[:, -1]  # fmt: skip
    rows: list[list[int]] = [[] for _ in range(input_ids.shape[0])]
    active = torch.arange(input_ids.shape[0], device=input_ids.device)
    last = positions[:, -1:]
    for step in range(max_new_tokens):
        tokens = logits.argmax(dim=-1)
        done = tokens == eos_id if eos_id is not None else torch.zeros_like(tokens, dtype=torch.bool)
        for row, token, finished in zip(active.tolist(), tokens.tolist(), done.tolist(), strict=True):
            if not finished:
                rows[row].append(token)
        if step == max_new_tokens - 1 or bool(done.all()):
            break
        if bool(done.any()):
            keep = (~done).nonzero(as_tuple=True)[0]
            cache.batch_select_indices(keep)
            active, tokens, attention_mask, last = active[keep], tokens[keep], attention_mask[keep], last[keep]
        attention_mask = torch.cat([attention_mask, attention_mask.new_ones((attention_mask.shape[0], 1))], dim=-1)
        last = last + 1
        logits = model(
            input_ids=tokens[:, None], attention_mask=attention_mask, position_ids=last, use_cache=True,
            **{keyword: cache},
        ).logits[:, -1]  # fmt: skip
    return rows


def generate_fallback(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    bos_id: int | None,
) -> list[list[int]]:
    """transformers' greedy ``generate`` of a left-padded batch, each row cut at its first ``eos_id``."""
    from transformers import GenerationConfig

    generation_config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, num_beams=1, eos_token_id=eos_id, pad_token_id=pad_id,
        bos_token_id=bos_id,
        # Explicitly: a model saved by a trainer that turned the cache off (TRL does) would otherwise decode
        # without a KV cache, recomputing the whole prefix at every new token.
        use_cache=True,
    )  # fmt: skip
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config)
    rows = []
    for row in output[:, input_ids.shape[1] :].tolist():
        if eos_id is not None and eos_id in row:
            row = row[: row.index(eos_id)]
        rows.append(row)
    return rows


def left_pad(batch: Sequence[Sequence[int]], pad_id: int) -> dict[str, torch.Tensor]:
    length = max(len(ids) for ids in batch)
    input_ids = [[pad_id] * (length - len(ids)) + list(ids) for ids in batch]
    attention_mask = [[0] * (length - len(ids)) + [1] * len(ids) for ids in batch]
    return {"input_ids": torch.tensor(input_ids), "attention_mask": torch.tensor(attention_mask)}


def score_teacher_forced(
    model: Any,
    examples: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    score: Callable[[torch.Tensor, torch.Tensor], Sequence[Any]],
    batch_size: int = 32,
    show_progress: bool = False,
    desc: str = "Scoring answers",
) -> list[Any]:
    """``score(logits, labels)`` of tokenized ``examples`` (``input_ids``, ``labels`` with ``-100`` outside the
    answer), one result per example, teacher-forced, in the examples' order.

    The examples are sorted by length and right-padded with :func:`hf_unlearn.data.pad_examples` in batches; the
    forward runs under ``inference_mode`` with the model in eval mode (its training mode is restored afterwards).
    ``score`` gets the logits and labels of one batch as a causal LM returns and takes them, ``(B, T', V)`` and
    ``(B, T')`` (the token at ``t + 1`` is predicted by the logits at ``t``); when the model takes
    ``logits_to_keep`` both start just before the batch's earliest answer token, so the LM head runs only where an
    answer token is predicted. The one teacher-forced loop of the answer metrics (probabilities, truth ratios,
    extraction strength, exact memorisation).
    """
    device = model_device(model)
    examples, order = by_length(examples, lambda example: len(example["input_ids"]))
    results: list[Any] = []
    total = math.ceil(len(examples) / batch_size)
    with evaluating(model):
        for batch in progress_bar(batches(examples, batch_size), total, desc, show_progress):
            padded = {k: v.to(device) for k, v in pad_examples(batch, pad_token_id).items()}
            # The LM head only where an answer token is predicted, the rows' shared leading tokens (a chat
            # template's system prompt) run once when the cache allows.
            logits, start = answer_logits(model, padded["input_ids"], padded["attention_mask"], padded["labels"])
            labels = padded["labels"][:, start:]
            results.extend(score(logits, labels))
    return restore_order(results, order)


@contextmanager
def evaluating(model: Any) -> Iterator[None]:
    """``model`` in eval mode under ``inference_mode``; its training mode is restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def log_prob_sums_and_counts(logits: torch.Tensor, labels: torch.Tensor) -> list[tuple[float, int]]:
    """Per row ``(sum of the answer tokens' log-probabilities, number of answer tokens)`` of a causal LM's
    ``logits`` and ``labels`` (``-100`` outside the answer)."""
    log_probs, mask = token_log_probs(logits, labels)
    return list(zip(log_probs.sum(dim=-1).tolist(), mask.sum(dim=-1).tolist(), strict=True))


def prompt_length(example: Mapping[str, Any]) -> int:
    """The number of leading tokens of a tokenized example whose label is ``-100``: its prompt."""
    labels = example["labels"]
    return next((t for t, label in enumerate(labels) if label != IGNORE_INDEX), len(labels))


def answer_log_probs(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[tuple[float, int]]:
    """Per example ``(sum of the answer tokens' log-probabilities, number of answer tokens)``, teacher-forced.

    Examples are :func:`hf_unlearn.data.tokenize_qa` (answer tokens are those whose label is not ``-100``, EOS
    included), scored by :func:`score_teacher_forced`; the token at position ``t + 1`` is scored by the logits at
    ``t``, as in a causal LM loss.
    """
    if len(questions) != len(answers):
        raise ValueError(f"Got {len(questions)} questions but {len(answers)} answers.")
    examples = [
        tokenize_qa(tokenizer, q, a, prompt_template=prompt_template) for q, a in zip(questions, answers, strict=True)
    ]
    return score_teacher_forced(
        model, examples, pad_token_id_of(tokenizer), log_prob_sums_and_counts, batch_size, show_progress
    )


@dataclass
class AnswerScores:
    """What one teacher-forced pass over one (question, answer) gives (module docstring)."""

    log_prob_sum: float
    count: int
    predictions: list[int]
    labels: list[int]
    violation_fraction: float | None = None
    input_ids: tuple[int, ...] | None = None
    answer_start: int | None = None
    token_log_probs: torch.Tensor | None = None
    token_mean: torch.Tensor | None = None
    token_std: torch.Tensor | None = None

    @property
    def probability(self) -> float:
        """TOFU's answer probability ``exp(mean answer-token log-probability)`` (NaN without answer tokens)."""
        import math

        return math.exp(self.log_prob_sum / self.count) if self.count else float("nan")


def score_answers(
    model: Any,
    examples: Sequence[Mapping[str, Any]],
    pad_token_id: int,
    k: int | None = None,
    tau: float = 0.0,
    batch_size: int = 32,
    show_progress: bool = False,
    reads: Collection[str] = (),
) -> list[AnswerScores]:
    """:class:`AnswerScores` of every tokenized example (``input_ids``, ``labels``), one forward each; with ``k``,
    the violation fraction of the restricted margin at threshold ``tau`` too; with ``"token_log_probs"`` or
    ``"token_moments"`` in ``reads``, the per-token values (the moments imply the log-probabilities)."""
    moments = "token_moments" in reads
    per_token = moments or "token_log_probs" in reads

    def read(logits: torch.Tensor, labels: torch.Tensor) -> list[AnswerScores]:
        log_probs, mask = token_log_probs(logits, labels)
        sums, counts = log_probs.sum(dim=-1).tolist(), mask.sum(dim=-1).tolist()
        shifted, shifted_labels = shift_for_causal_lm(logits, labels)
        argmaxes = shifted.argmax(dim=-1)
        fractions: list[float | None] = [None] * len(sums)
        if k is not None:
            fractions = violation_fractions(restricted_margin(shifted, shifted_labels, k=k), tau)[0].tolist()
        # Per row, the answer tokens' values in order (the mask's positions are the answer tokens, prompt first).
        tokens = log_probs[mask].cpu().split(counts) if per_token else [None] * len(sums)
        means, stds = distribution_moments(shifted[mask], counts) if moments else ([None] * len(sums),) * 2
        scores = []
        for row, (row_predictions, row_labels) in enumerate(zip(argmaxes, shifted_labels, strict=True)):
            positions = (row_labels != IGNORE_INDEX).nonzero(as_tuple=True)[0][:-1]  # the EOS is not predicted
            scores.append(
                AnswerScores(
                    sums[row],
                    counts[row],
                    row_predictions[positions].tolist(),
                    row_labels[positions].tolist(),
                    fractions[row],
                    token_log_probs=tokens[row],
                    token_mean=means[row],
                    token_std=stds[row],
                )  # fmt: skip
            )
        return scores

    scores = score_teacher_forced(
        model, examples, pad_token_id, read, batch_size, show_progress, desc="Scoring answers"
    )  # fmt: skip
    if per_token:  # what a reader matches its own tokens against (membership_scores)
        for score, example in zip(scores, examples, strict=True):
            score.input_ids, score.answer_start = tuple(example["input_ids"]), prompt_length(example)
    return scores


#: Positions whose full distribution :func:`distribution_moments` holds at once (a few (rows, vocabulary) float32
#: tensors: 256 x 128k is 128 MiB each), so a batch of long answers on a large vocabulary stays within memory.
MOMENT_CHUNK = 256


def distribution_moments(
    logits: torch.Tensor, counts: Sequence[int]
) -> tuple[Sequence[torch.Tensor], Sequence[torch.Tensor]]:
    """Mean and standard deviation of ``log p(z | prefix)`` for ``z ~ p`` at each row of ``logits`` (N, V), on the
    CPU, split into ``counts``: Min-K%++'s ``mu = sum p log p`` and ``sigma^2 = sum p (log p)^2 - mu^2`` (Zhang et
    al., ICLR 2025, §3), in float32 as the attack's own forward computes them."""
    means, stds = [], []
    for chunk in logits.split(MOMENT_CHUNK):
        log_probs = torch.log_softmax(chunk.float(), dim=-1)
        probs = log_probs.exp()
        mean = (probs * log_probs).sum(-1)
        means.append(mean)
        stds.append(((probs * log_probs.square()).sum(-1) - mean.square()).clamp(min=0).sqrt())
    mean = torch.cat(means) if means else logits.new_zeros(0, dtype=torch.float32)
    std = torch.cat(stds) if stds else logits.new_zeros(0, dtype=torch.float32)
    return mean.cpu().split(list(counts)), std.cpu().split(list(counts))


def score_qa_records(
    model: Any,
    tokenizer: Any,
    records: Any,
    k: int | None = None,
    tau: float = 0.0,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
    reads: Collection[str] = (),
) -> list[AnswerScores]:
    """:func:`score_answers` of the records with ``question`` and ``answer``, tokenized as for learning
    (:func:`hf_unlearn.data.tokenize_qa`), in the records' order."""
    examples = [
        tokenize_qa(tokenizer, str(r["question"]), str(r["answer"]), prompt_template=prompt_template)
        for r in qa_records(records)
    ]
    return score_answers(model, examples, pad_token_id_of(tokenizer), k, tau, batch_size, show_progress, reads)


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


__all__ = [
    "GENERATION_BATCH_SIZE",
    "AnswerScores",
    "answer_log_probs",
    "batches",
    "distribution_moments",
    "generate_answers",
    "generate_continuations",
    "generate_fallback",
    "greedy_decode",
    "left_pad",
    "log_prob_sums_and_counts",
    "model_device",
    "option_scores",
    "pad_token_id_of",
    "progress_bar",
    "prompt_length",
    "qa_records",
    "score_after_prompts",
    "score_answers",
    "score_qa_records",
    "score_teacher_forced",
]
