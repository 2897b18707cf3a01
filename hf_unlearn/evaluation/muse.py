"""MUSE metrics (Shi et al., "MUSE: Machine Unlearning Six-Way Evaluation for Language Models", arXiv 2407.06460).

* VerbMem (§3.1, C1): ROUGE-L F1 between the model's greedy continuation (128 tokens) of a forget-text prompt
  and the true continuation.
* KnowMem (§3.1, C2 and C4): ROUGE-L F1 of the model's greedy answer (32 tokens) to questions about the forget
  (or retain) text.
* PrivLeak (§3.1, C3) and the membership attacks behind it live in :mod:`hf_unlearn.evaluation.membership`.

Scoring and generation are batched (right padding for scoring, left padding for generation) under
``torch.inference_mode``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..data.examples import tokenize_prompt
from ..data.prompts import PLAIN_PROMPT_TEMPLATE
from .metrics import rouge_l_f1
from .passes import generate_continuations

__all__ = ["knowmem", "verbmem"]


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
