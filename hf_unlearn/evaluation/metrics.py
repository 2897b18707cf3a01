"""Question/answer metrics of TOFU (Maini et al., 2024, "TOFU: A Task of Fictitious Unlearning for LLMs"), batched.

* ROUGE-L recall of the greedy answer against the reference answer (TOFU's "ROUGE"),
* the answer probability ``P(a | q) ** (1 / |a|)``, i.e. ``exp(-mean token NLL)`` of the reference answer given
  the question (TOFU's "Prob" on the forget and retain sets),
* exact match of the greedy answer (after whitespace, case and trailing-punctuation normalisation),
* truth ratios and their aggregates, forget quality (two-sample KS test against a retain-only model's truth
  ratios), model utility (harmonic mean) and MASC's exact-reproduction bound (Proposition 1, arXiv 2606.02920).
  Everything here measures a model on records; :func:`hf_unlearn.evaluation.suites.evaluate_unlearning` puts them
  together, and the benchmark suites that load TOFU, MUSE or the embedded data live there too.

Prompts and answers are tokenized by :mod:`hf_unlearn.data` exactly as for learning and unlearning, so a metric
scores the very tokens the model was trained on.
"""

from __future__ import annotations

import math
import string
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from scipy.stats import hmean, ks_2samp

from ..data.examples import IGNORE_INDEX, tokenize_prompt, tokenize_qa
from ..data.pairing import pad_examples
from ..forwards import accepts_logits_to_keep, answer_logits, cache_keyword, left_padded_positions
from ..objectives.masc.margin import exact_reproduction_bound, measure_violations, threshold_from_probability
from ..scores import token_log_probs

__all__ = [
    "answer_log_probs",
    "answer_probability",
    "GENERATION_BATCH_SIZE",
    "default_max_new_tokens",
    "evaluate_qa",
    "exact_match",
    "forget_quality",
    "generate_answers",
    "generate_continuations",
    "model_utility",
    "reproduction_bound",
    "rouge_l_f1",
    "rouge_l_recall",
    "score_teacher_forced",
]


#: Greedy answers generated per batch by :func:`evaluate_qa`. Decoding one token costs about one read of the weights
#: whatever the batch (a forward of a few rows is memory-bound), so fewer, larger batches cost less; rows that reach
#: EOS leave the batch (:func:`greedy_decode`).
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


def answer_probability(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> list[float]:
    """Per example ``exp(-mean token NLL)`` of the answer, i.e. ``P(a | q) ** (1 / |a|)`` (TOFU's "Prob")."""
    return [
        math.exp(total / count) if count else float("nan")
        for total, count in answer_log_probs(
            model, tokenizer, questions, answers, batch_size, show_progress, prompt_template
        )
    ]


_ROUGE_SCORER: Any = None


def _rouge_l(predictions: Sequence[str], references: Sequence[str], measure: str) -> list[float]:
    global _ROUGE_SCORER
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions but {len(references)} references.")
    if _ROUGE_SCORER is None:
        from rouge_score import rouge_scorer

        _ROUGE_SCORER = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [
        getattr(_ROUGE_SCORER.score(ref, pred)["rougeL"], measure)
        for pred, ref in zip(predictions, references, strict=True)
    ]


def rouge_l_recall(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L recall of each prediction against its reference (TOFU's "ROUGE"), with Porter stemming."""
    return _rouge_l(predictions, references, "recall")


def rouge_l_f1(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F1 of each prediction against its reference (MUSE's VerbMem and KnowMem), with Porter stemming."""
    return _rouge_l(predictions, references, "fmeasure")


_TRAILING_PUNCTUATION = string.punctuation


def _normalize(text: str) -> str:
    return " ".join(text.split()).lower().rstrip(_TRAILING_PUNCTUATION).rstrip()


def exact_match(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """1.0 where prediction and reference are equal after collapsing whitespace, lower-casing and stripping
    trailing punctuation, else 0.0."""
    if len(predictions) != len(references):
        raise ValueError(f"Got {len(predictions)} predictions but {len(references)} references.")
    return [float(_normalize(p) == _normalize(r)) for p, r in zip(predictions, references, strict=True)]


def default_max_new_tokens(
    tokenizer: Any, answers: Iterable[str], margin: int = 4, prompt_template: str | None = None
) -> int:
    """Tokens enough to generate the longest answer (EOS included) plus ``margin``."""
    longest = max(
        (
            sum(
                label != IGNORE_INDEX
                for label in tokenize_qa(tokenizer, "", a, prompt_template=prompt_template)["labels"]
            )
            for a in answers
        ),
        default=0,
    )
    return longest + margin


def qa_records(dataset_or_records: Any) -> list[Mapping[str, Any]]:
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
    prompt_template: str | None = None,
    return_predictions: bool = False,
    scores: Sequence[Any] | None = None,
    generation_batch_size: int = GENERATION_BATCH_SIZE,
) -> dict[str, Any]:
    """Mean ROUGE-L recall, answer probability and exact match over the records with ``question`` and ``answer``.

    ``dataset_or_records`` is a :class:`datasets.Dataset` or a sequence of mappings. ``max_new_tokens`` defaults
    to the longest tokenized answer plus a few tokens. Returns ``{"rouge_l_recall", "probability",
    "exact_match", "num_examples"}`` (the means are NaN when there is no example), and with ``return_predictions``
    the greedy answers under ``"predictions"`` (so a fluency measure can read them instead of generating again).
    ``scores``: the records' :func:`hf_unlearn.evaluation.scoring.score_qa_records`, read instead of scoring the
    answers again. ``batch_size`` is for scoring, ``generation_batch_size`` for generating.
    """
    records = qa_records(dataset_or_records)
    questions = [str(r["question"]) for r in records]
    answers = [str(r["answer"]) for r in records]
    if not records:
        nan = float("nan")
        empty: dict[str, Any] = {"rouge_l_recall": nan, "probability": nan, "exact_match": nan, "num_examples": 0}
        return {**empty, "predictions": []} if return_predictions else empty
    if max_new_tokens is None:
        max_new_tokens = default_max_new_tokens(tokenizer, answers, prompt_template=prompt_template)
    predictions = generate_answers(
        model, tokenizer, questions, max_new_tokens, generation_batch_size, show_progress, prompt_template
    )
    if scores is not None:
        probabilities = [s.probability for s in scores]
    else:
        probabilities = answer_probability(
            model, tokenizer, questions, answers, batch_size, show_progress, prompt_template
        )

    def mean(values: Sequence[float]) -> float:
        return sum(values) / len(values)

    measured: dict[str, Any] = {
        "rouge_l_recall": mean(rouge_l_recall(predictions, answers)),
        "probability": mean(probabilities),
        "exact_match": mean(exact_match(predictions, answers)),
        "num_examples": len(records),
    }
    if return_predictions:
        measured["predictions"] = predictions
    return measured


def forget_truth_ratio(ratios: Sequence[float]) -> float:
    """TOFU's forget-set aggregation ``mean(min(TR, 1/TR))``: 1 when paraphrase and perturbations look alike."""
    return sum(min(r, 1.0 / r) for r in ratios) / len(ratios) if ratios else float("nan")


def retain_truth_ratio(ratios: Sequence[float]) -> float:
    """TOFU's retain-set aggregation ``mean(max(0, 1 - TR))``: high when the true paraphrase is preferred."""
    return sum(max(0.0, 1.0 - r) for r in ratios) / len(ratios) if ratios else float("nan")


def forget_quality(truth_ratios_evaluated: Sequence[float], truth_ratios_retain_only: Sequence[float]) -> float:
    """p-value of the two-sample KS test between forget-set truth ratios (TOFU §2.5): high = indistinguishable
    from a model that never saw the forget set."""
    return float(ks_2samp(list(truth_ratios_evaluated), list(truth_ratios_retain_only)).pvalue)


def model_utility(values: Sequence[float]) -> float:
    """Harmonic mean (TOFU §2.5); 0 as soon as one value is 0, as a harmonic mean should be."""
    values = [float(v) for v in values]
    if not values:
        return float("nan")
    if min(values) <= 0:
        return 0.0
    return float(hmean(values))


def reproduction_bound(
    model: Any,
    tokenizer: Any,
    records: Any,
    k: int = 10,
    rho: float = 0.5,
    batch_size: int = 32,
    prompt_template: str | None = None,
) -> dict[str, float]:
    """MASC Proposition 1 at beta = 1 on ``records``: mean and max of ``rho^((1 - v_i) L_i)``, and the violation
    rate, with self-competitors (k) and threshold tau = log(rho / (1 - rho))."""
    examples = [
        tokenize_qa(tokenizer, r["question"], r["answer"], prompt_template=prompt_template)
        for r in qa_records(records)
    ]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    measured = measure_violations(model, examples, pad_id, k, threshold_from_probability(rho), batch_size=batch_size)
    bounds = exact_reproduction_bound(measured["fractions"], measured["lengths"], rho)
    return {
        "mean": bounds.mean().item(),
        "max": bounds.max().item(),
        "violation_rate": measured["fractions"].mean().item(),
    }
