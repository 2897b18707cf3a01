"""Evaluation throughput: hf_unlearn's batched scoring and generation vs a naive one-example-at-a-time loop.

    python perf/eval_throughput.py [--examples 96] [--skip-smollm2]

Scoring is the teacher-forced answer log-probability (what Prob and the truth ratio need); generation is greedy
decoding of the answer (what ROUGE needs). "Batched" is :func:`hf_unlearn.evaluation.metrics.answer_log_probs` /
:func:`hf_unlearn.evaluation.metrics.generate_answers` (padded batches of 32 under ``inference_mode``); "naive" calls
the model once per example under ``no_grad`` with the same prompt tokens. Both are checked to agree before timing.
Models: the embedded benchmark's 1.2M target model and, when installed, SmolLM2-135M (a real pretrained model).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from hf_unlearn.benchmarks import learn_target_model, load_split  # noqa: E402
from hf_unlearn.data.examples import tokenize_prompt, tokenize_qa  # noqa: E402
from hf_unlearn.evaluation.metrics import answer_log_probs, generate_answers  # noqa: E402


def naive_scores(model, tokenizer, questions, answers):
    results = []
    with torch.no_grad():
        for q, a in zip(questions, answers, strict=True):
            example = tokenize_qa(tokenizer, q, a)
            ids = torch.tensor([example["input_ids"]])
            labels = torch.tensor(example["labels"][1:])
            log_probs = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
            mask = labels != -100
            results.append((log_probs[mask].gather(-1, labels[mask].unsqueeze(-1)).sum().item(), int(mask.sum())))
    return results


def naive_generate(model, tokenizer, questions, max_new_tokens):
    answers = []
    with torch.no_grad():
        for q in questions:
            ids = torch.tensor([tokenize_prompt(tokenizer, q)])
            out = model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                use_cache=True,
                pad_token_id=tokenizer.pad_token_id or tokenizer.eos_token_id,
            )
            row = out[0, ids.shape[1] :].tolist()
            if tokenizer.eos_token_id in row:
                row = row[: row.index(tokenizer.eos_token_id)]
            answers.append(tokenizer.decode(row, skip_special_tokens=True).strip())
    return answers


def timed(function, *args):
    start = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - start


def measure(name, model, tokenizer, questions, answers, max_new_tokens):
    model.eval()
    n = len(questions)
    batched_scores, t_batched = timed(answer_log_probs, model, tokenizer, questions, answers, 32)
    naive, t_naive = timed(naive_scores, model, tokenizer, questions, answers)
    worst = max(abs(a[0] - b[0]) for a, b in zip(batched_scores, naive, strict=True))
    batched_text, g_batched = timed(generate_answers, model, tokenizer, questions, max_new_tokens, 32)
    naive_text, g_naive = timed(naive_generate, model, tokenizer, questions, max_new_tokens)
    same = sum(a == b for a, b in zip(batched_text, naive_text, strict=True)) / n
    return [
        (name, "scoring", n / t_naive, n / t_batched, t_naive / t_batched, f"max |diff| {worst:.1e}"),
        (name, "generation", n / g_naive, n / g_batched, g_naive / g_batched, f"same text {same:.0%}"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=96)
    parser.add_argument("--skip-smollm2", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    records = list(load_split("retain90"))[: args.examples]
    questions, answers = [r["question"] for r in records], [r["answer"] for r in records]
    rows = []
    model, tokenizer, _ = learn_target_model(show_progress=False)
    rows += measure("target (1.2M Llama)", model, tokenizer, questions, answers, 24)
    if not args.skip_smollm2:
        try:
            from hf_unlearn.benchmarks.pretrained import load_smollm2

            model, tokenizer = load_smollm2()
            tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
            rows += measure("SmolLM2-135M", model, tokenizer, questions, answers, 24)
        except ImportError as error:
            print(f"(SmolLM2 skipped: {error})")
    print(f"\n{torch.get_num_threads()} threads, {len(questions)} examples each\n")
    print("| model | task | naive examples/s | batched examples/s | speed-up | check |")
    print("|---|---|---|---|---|---|")
    for name, task, naive, batched, ratio, check in rows:
        print(f"| {name} | {task} | {naive:.1f} | {batched:.1f} | {ratio:.1f}x | {check} |")


if __name__ == "__main__":
    main()
