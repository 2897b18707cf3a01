"""What MASC does to the answer tokens that repeat the prompt (docs/studies/prompt_copies.md).

For the embedded benchmark's target, its never-trained (retain-only) model and each saved run: the share of the forget
answers, generated greedily, that spell the author's name as the question does, and the mean log-probability, under
teacher forcing, of the answer tokens that repeat the prompt (``hf_unlearn.data.prompt_copies``: the name) and of the
others (the facts), on the forget authors and on the calibration authors (never learned by any of them).

    python studies/prompt_copies.py RUN [RUN ...] --cache_dir C [--size judge]

Prints one JSON object, a key per model.
"""

from __future__ import annotations

import argparse
import json

import torch


def token_means(model, batch, copies) -> dict:
    """Mean log-probability of the answer tokens that repeat the prompt and of the others."""
    from hf_unlearn.scores import token_log_probs

    sums = {"copies": [0.0, 0], "rest": [0.0, 0]}
    with torch.no_grad():
        for start in range(0, len(batch["input_ids"]), 64):
            rows = slice(start, start + 64)
            logits = model(input_ids=batch["input_ids"][rows], attention_mask=batch["attention_mask"][rows]).logits
            log_probs, scored = token_log_probs(logits, batch["labels"][rows])
            repeats = copies[rows][:, 1:]
            for name, mask in (("copies", scored & repeats), ("rest", scored & ~repeats)):
                sums[name][0] += log_probs[mask].sum().item()
                sums[name][1] += int(mask.sum())
    return {name: round(total / max(count, 1), 3) for name, (total, count) in sums.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--cache_dir", default=None)
    parser.add_argument("--size", default="judge")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    from hf_unlearn.benchmarks import benchmark_size, learn_retain_only_model, learn_target_model, load_split
    from hf_unlearn.data import pad_examples, prompt_copies, tokenize_qa
    from hf_unlearn.evaluation import measure_qa_sets

    settings = benchmark_size(args.size)
    never_trained, tokenizer = learn_retain_only_model("forget10", args.cache_dir, **settings)
    target = learn_target_model(cache_dir=args.cache_dir, show_progress=False, **settings)[0]
    forget = load_split("forget10", **settings)
    sets = {}
    for name in ("forget10", "calibration"):
        rows = load_split(name, **settings)
        examples = [tokenize_qa(tokenizer, row["question"], row["answer"]) for row in rows]
        batch = pad_examples(examples, tokenizer.pad_token_id)
        sets[name] = (batch, prompt_copies(batch["input_ids"], batch["labels"], batch["attention_mask"]))

    def read(model) -> dict:
        model.eval()
        answers = measure_qa_sets(model, tokenizer, {"forget": forget}, return_predictions=True)["forget"]
        spelled = [row["author"] in answer for row, answer in zip(forget, answers["predictions"])]
        means = {name: token_means(model, batch, copies) for name, (batch, copies) in sets.items()}
        return {"name_as_asked": round(sum(spelled) / len(spelled), 4), "mean_log_prob": means}

    out = {"target": read(target), "never_trained": read(never_trained)}
    for run in args.runs:
        out[run] = read(AutoModelForCausalLM.from_pretrained(run))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
