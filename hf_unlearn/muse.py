"""MUSE metrics (Shi et al., "MUSE: Machine Unlearning Six-Way Evaluation for Language Models", arXiv 2407.06460).

* VerbMem (§3.1, C1): ROUGE-L F1 between the model's greedy continuation (128 tokens) of a forget-text prompt
  and the true continuation.
* KnowMem (§3.1, C2 and C4): ROUGE-L F1 of the model's greedy answer (32 tokens) to questions about the forget
  (or retain) text.
* PrivLeak (§3.1, C3): ``(AUC_unlearned - AUC_retrained) / AUC_retrained * 100``, where AUC is that of a
  membership-inference attack telling forget texts (members) from holdout texts (non-members); about 0 is
  ideal, large positive means under-unlearning, large negative over-unlearning. The attacks are Min-K% Prob
  (Shi et al. 2024, "Detecting Pretraining Data from Large Language Models", arXiv 2310.16789, §3; k = 0.4 as in
  MUSE) and Min-K%++ (Zhang et al. 2024, arXiv 2404.02936, §3).

Scoring and generation are batched (right padding for scoring, left padding for generation) under
``torch.inference_mode``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from scipy.stats import mannwhitneyu

from .data import tokenize_prompt
from .metrics import _batches, _device, _pad_token_id, _progress, generate_continuations, rouge_l_f1
from .prompts import PLAIN_PROMPT_TEMPLATE

__all__ = [
    "knowmem",
    "membership_auc",
    "membership_scores",
    "min_k_percent",
    "min_k_plus_plus",
    "privleak",
    "token_statistics",
    "verbmem",
]


def min_k_percent(token_log_probs: torch.Tensor, k: float = 0.4) -> float:
    """Min-K% Prob (Shi et al. 2024, §3): the mean of the lowest ``ceil(k * n)`` token log-probabilities of a
    sequence; higher means "more likely seen in training"."""
    if not 0 < k <= 1:
        raise ValueError(f"k must be in (0, 1], got {k}.")
    if token_log_probs.numel() == 0:
        return float("nan")
    count = max(1, math.ceil(k * token_log_probs.numel()))
    return torch.topk(token_log_probs.double(), count, largest=False).values.mean().item()


def min_k_plus_plus(
    token_log_probs: torch.Tensor, mean_log_probs: torch.Tensor, std_log_probs: torch.Tensor, k: float = 0.4
) -> float:
    """Min-K%++ (Zhang et al. 2024, §3): each token's log-probability standardised by the mean and standard
    deviation of ``log p(z | prefix)`` over the vocabulary under the model's own distribution, then Min-K%."""
    standardised = (token_log_probs.double() - mean_log_probs.double()) / std_log_probs.double().clamp(min=1e-12)
    return min_k_percent(standardised, k)


def token_statistics(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    batch_size: int = 8,
    max_length: int = 2048,
    show_progress: bool = False,
    prompts: Sequence[str] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """For each text, per token after the first: ``log_prob`` = log p(x_t | x_<t), and the mean and standard
    deviation of log p(z | x_<t) over z ~ p(. | x_<t) (what Min-K%++ standardises with).

    Texts are tokenized with the tokenizer's special tokens (BOS where it adds one) and cut to ``max_length``. With
    ``prompts``, each text is the continuation of its prompt: the prompt is encoded first (special tokens
    included), the text after it without special tokens, and only the text's tokens are returned (what a model
    trained with the prompt masked actually learned, e.g. the answer of a QA pair).
    """
    pad_id = _pad_token_id(tokenizer)
    device = _device(model)
    if prompts is not None:
        if len(prompts) != len(texts):
            raise ValueError(f"Got {len(prompts)} prompts for {len(texts)} texts.")
        heads = [list(tokenizer(prompt)["input_ids"]) for prompt in prompts]
        tails = [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
        encoded = [(head + tail)[:max_length] for head, tail in zip(heads, tails)]
        starts = [len(head) for head in heads]
    else:
        encoded = [list(tokenizer(text)["input_ids"])[:max_length] for text in texts]
        starts = [1] * len(encoded)
    results: list[dict[str, torch.Tensor]] = []
    was_training = model.training
    model.eval()
    try:
        total = math.ceil(len(encoded) / batch_size)
        index = 0
        with torch.inference_mode():
            for batch in _progress(_batches(encoded, batch_size), total, "Scoring texts", show_progress):
                length = max(len(ids) for ids in batch)
                input_ids = torch.tensor([ids + [pad_id] * (length - len(ids)) for ids in batch], device=device)
                mask = torch.tensor([[1] * len(ids) + [0] * (length - len(ids)) for ids in batch], device=device)
                logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1].float()
                log_probs = torch.log_softmax(logits, dim=-1)
                targets = input_ids[:, 1:]
                chosen = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                probs = log_probs.exp()
                mean = (probs * log_probs).sum(-1)
                variance = (probs * log_probs.square()).sum(-1) - mean.square()
                std = variance.clamp(min=0).sqrt()
                for row, ids in enumerate(batch):
                    # Position t - 1 predicts token t; the first scored token is the first after the prompt.
                    first, n = starts[index] - 1, len(ids) - 1
                    results.append(
                        {
                            "log_prob": chosen[row, first:n].cpu(),
                            "mean": mean[row, first:n].cpu(),
                            "std": std[row, first:n].cpu(),
                        }
                    )
                    index += 1
    finally:
        model.train(was_training)
    return results


def membership_scores(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    k: float = 0.4,
    batch_size: int = 8,
    max_length: int = 2048,
    prompts: Sequence[str] | None = None,
) -> dict[str, list[float]]:
    """Min-K% and Min-K%++ scores of every text (higher = more member-like); with ``prompts``, of the text's tokens
    as a continuation of its prompt (see :func:`token_statistics`)."""
    statistics = token_statistics(model, tokenizer, texts, batch_size, max_length, prompts=prompts)
    return {
        "min_k": [min_k_percent(s["log_prob"], k) for s in statistics],
        "min_k_plus_plus": [min_k_plus_plus(s["log_prob"], s["mean"], s["std"], k) for s in statistics],
    }


def membership_auc(member_scores: Sequence[float], nonmember_scores: Sequence[float]) -> float:
    """Area under the ROC curve of telling members from non-members by score: P(member > non-member) + ½ P(tie),
    i.e. the Mann-Whitney U statistic over ``n_members * n_nonmembers``."""
    if not member_scores or not nonmember_scores:
        raise ValueError("membership_auc needs at least one member and one non-member score.")
    statistic = mannwhitneyu(list(member_scores), list(nonmember_scores), alternative="two-sided").statistic
    return float(statistic) / (len(member_scores) * len(nonmember_scores))


def privleak(auc_unlearned: float, auc_retrained: float) -> float:
    """MUSE's PrivLeak (§3.1): relative AUC difference to the retrained model, in percent."""
    return (auc_unlearned - auc_retrained) / auc_retrained * 100


def _mean_rouge_l_f1_of_generations(
    model: Any,
    tokenizer: Any,
    prompt_ids: list[list[int]],
    references: Sequence[str],
    max_new_tokens: int,
    batch_size: int,
    show_progress: bool,
    desc: str,
    clean: Any = None,
) -> float:
    generated = generate_continuations(model, tokenizer, prompt_ids, max_new_tokens, batch_size, show_progress, desc)
    if clean is not None:
        generated = [clean(text) for text in generated]
    scores = rouge_l_f1(generated, list(references))
    return sum(scores) / len(scores)


def verbmem(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str],
    continuations: Sequence[str],
    max_new_tokens: int = 128,
    batch_size: int = 8,
    show_progress: bool = False,
) -> float:
    """VerbMem (MUSE §3.1): mean ROUGE-L F1 of the greedy continuation of each prompt against the true one."""
    if len(prompts) != len(continuations):
        raise ValueError(f"Got {len(prompts)} prompts but {len(continuations)} continuations.")
    if not prompts:
        return float("nan")
    prompt_ids = [list(tokenizer(p)["input_ids"]) for p in prompts]
    return _mean_rouge_l_f1_of_generations(
        model, tokenizer, prompt_ids, continuations, max_new_tokens, batch_size, show_progress, "VerbMem: generating"
    )


def knowmem(
    model: Any,
    tokenizer: Any,
    questions: Sequence[str],
    answers: Sequence[str],
    max_new_tokens: int = 32,
    batch_size: int = 32,
    icl_examples: Sequence[Mapping[str, str]] | None = None,
    show_progress: bool = False,
    prompt_template: str | None = None,
) -> float:
    """KnowMem (MUSE §3.1): mean ROUGE-L F1 of the greedy answer against the true one.

    Without ``icl_examples`` the prompt is the one used in learning (:func:`hf_unlearn.data.tokenize_prompt`);
    with them (MUSE's ``*_qa_icl`` splits) the plain ``Question: ...\\nAnswer: ...`` pairs come first, as MUSE
    prompts a base model, and the answer is cut at the first blank line or next "Question:".
    """
    if len(questions) != len(answers):
        raise ValueError(f"Got {len(questions)} questions but {len(answers)} answers.")
    if not questions:
        return float("nan")
    if icl_examples:
        shots = "".join(
            PLAIN_PROMPT_TEMPLATE.format(question=e["question"]) + f" {e['answer']}\n\n" for e in icl_examples
        )
        prompt_ids = [
            list(tokenizer(shots + PLAIN_PROMPT_TEMPLATE.format(question=q))["input_ids"]) for q in questions
        ]
    else:
        prompt_ids = [tokenize_prompt(tokenizer, q, prompt_template) for q in questions]
    return _mean_rouge_l_f1_of_generations(
        model,
        tokenizer,
        prompt_ids,
        answers,
        max_new_tokens,
        batch_size,
        show_progress,
        "KnowMem: generating",
        clean=lambda text: text.split("\n\n")[0].split("\nQuestion:")[0].strip(),
    )
