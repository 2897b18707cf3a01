"""Model size vs memorisation and unlearning, in miniature (the MASC paper's question on scale).

    python studies/scale_study.py [--sizes 64x2 128x4 256x4 384x6] [--plot docs/scale_study.png]

For each size (hidden size x layers, Llama, trained from scratch) the embedded benchmark is learned with the
same recipe (until greedy exact match >= 0.95 or 60 epochs), then forget10 is unlearned with MASC at the demo's
settings (lr 1e-3, the stopping rule on). Before and after, on the forget set:

* exact memorisation: ROUGE-L recall and exact match of the greedy answer against the trained wording, and
  Prob, the answer probability exp(-mean NLL);
* paraphrase memorisation: the probability of the paraphrased answer (a wording never trained on), and
  paraphrase accuracy, the fraction of questions whose paraphrase beats all three perturbed (false) answers;

and retain utility, TOFU's harmonic mean of retain Prob, ROUGE-L and truth ratio. One run, one seed per size.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks import learn_target_model, load_split  # noqa: E402
from hf_unlearn.evaluation.metrics import (
    answer_log_probs,  # noqa: E402
    evaluate_unlearning,  # noqa: E402
)


def paraphrase_memorisation(model, tokenizer, records) -> dict[str, float]:
    questions, answers = [], []
    for r in records:
        for answer in [r["paraphrased_answer"], *r["perturbed_answer"]]:
            questions.append(r["question"])
            answers.append(answer)
    scores = [total / count for total, count in answer_log_probs(model, tokenizer, questions, answers)]
    per_question = [scores[i : i + 4] for i in range(0, len(scores), 4)]
    return {
        "paraphrase_probability": sum(math.exp(s[0]) for s in per_question) / len(per_question),
        "paraphrase_accuracy": sum(s[0] > max(s[1:]) for s in per_question) / len(per_question),
    }


def measure(model, tokenizer, forget, retain) -> dict[str, float]:
    result = evaluate_unlearning(model, tokenizer, forget, retain)
    return {
        "rouge_l": result["forget"]["rouge_l_recall"],
        "exact_match": result["forget"]["exact_match"],
        "probability": result["forget"]["probability"],
        **paraphrase_memorisation(model, tokenizer, forget),
        "utility": result["model_utility"],
    }


def run(size: str, forget, retain) -> dict:
    hidden, layers = (int(x) for x in size.split("x"))
    kwargs = {"hidden_size": hidden, "num_layers": layers, "num_heads": max(2, hidden // 32)}
    model, tokenizer, info = learn_target_model(model_kwargs=kwargs, show_progress=False)
    before = measure(model, tokenizer, forget, retain)
    with tempfile.TemporaryDirectory() as output_dir:
        config = UnlearnConfig(
            output_dir=output_dir,
            learning_rate=1e-3,
            num_train_epochs=40,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            use_cpu=True,
        )
        trainer = UnlearnTrainer(
            model=model,
            args=config,
            train_dataset=build_qa_dataset(forget, tokenizer),
            retain_dataset=build_qa_dataset(retain, tokenizer),
            processing_class=tokenizer,
        )
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    after = measure(trainer.model, tokenizer, forget, retain)
    record = trainer.record
    return {
        "size": size,
        "parameters": info["num_parameters"],
        "learn_epochs": info["epochs"],
        "learn_exact_match": info["exact_match"],
        "stop_step": record.stop_step,
        "steps": record.global_step,
        "seconds": seconds,
        "before": before,
        "after": after,
    }


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    params = [r["parameters"] / 1e6 for r in rows]
    panels = (
        ("rouge_l", "forget ROUGE-L (exact wording)"),
        ("paraphrase_accuracy", "forget paraphrase accuracy"),
        ("utility", "retain model utility"),
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for when, style in (("before", "o-"), ("after", "s--")):
            ax.plot(params, [r[when][key] for r in rows], style, label=f"{when} unlearning")
        ax.set_xscale("log")
        ax.set_xlabel("parameters (millions)")
        ax.set_ylim(-0.02, 1.02)
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["64x2", "128x4", "256x4", "384x6"])
    parser.add_argument("--plot", default="scale_study.png")
    args = parser.parse_args()
    forget, retain = load_split("forget10"), load_split("retain90")
    rows = []
    for size in args.sizes:
        rows.append(run(size, forget, retain))
        print(f"done {size}: {rows[-1]['parameters'] / 1e6:.2f}M parameters", flush=True)
    print(
        "\n| size | parameters | learn epochs | stop step | forget ROUGE-L before -> after | exact match | Prob | "
        "paraphrase Prob | paraphrase accuracy | retain utility |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        b, a = r["before"], r["after"]

        def pair(key: str, b=b, a=a) -> str:
            return f"{b[key]:.3f} -> {a[key]:.3f}"

        print(
            f"| {r['size']} | {r['parameters'] / 1e6:.2f}M | {r['learn_epochs']} | {r['stop_step'] or 'none'} | "
            f"{pair('rouge_l')} | {pair('exact_match')} | {pair('probability')} | {pair('paraphrase_probability')} | "
            f"{pair('paraphrase_accuracy')} | {pair('utility')} |"
        )
    plot(rows, args.plot)
    print(f"\nPlot: {args.plot}")


if __name__ == "__main__":
    main()
