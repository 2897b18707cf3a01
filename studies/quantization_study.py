"""Does forgetting survive 4-bit quantization? MASC vs NPO vs GA on the embedded benchmark, one table.

    python studies/quantization_study.py [--epochs 10] [--lr 1e-4]

Each method unlearns forget10 from the same cached target model (MASC with the demo's settings, stopping
itself; GA and NPO for a fixed budget at a utility-preserving learning rate, the regime where Zhang et al.,
ICLR 2025, saw knowledge return after quantization). Then every model is reloaded in NF4, FP4 and 8-bit and the
forget/retain ROUGE-L recall is measured again.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks import learn_target_model, load_split  # noqa: E402
from hf_unlearn.robustness.quantize import check_quantization_robustness  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-4, help="GA and NPO learning rate.")
    cli = parser.parse_args()
    _, tokenizer, _ = learn_target_model(show_progress=False)
    forget_records, retain_records = load_split("forget10"), load_split("retain90")
    forget, retain = build_qa_dataset(forget_records, tokenizer), build_qa_dataset(retain_records, tokenizer)
    runs = {
        "target (no unlearning)": None,
        "masc": dict(method="masc", learning_rate=1e-3, num_train_epochs=40),
        "npo": dict(method="npo", learning_rate=cli.lr, num_train_epochs=cli.epochs, stop_on_violation=False),
        "ga": dict(method="ga", learning_rate=cli.lr, num_train_epochs=cli.epochs, stop_on_violation=False),
    }
    print("| method | steps | forget ROUGE-L fp32 | NF4 | FP4 | int8 | retain ROUGE-L fp32 | NF4 | knowledge back? |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, settings in runs.items():
        model, _, _ = learn_target_model(show_progress=False)
        steps = 0
        if settings is not None:
            with tempfile.TemporaryDirectory() as output_dir:
                args = UnlearnConfig(
                    output_dir=output_dir,
                    report_to="none",
                    save_strategy="no",
                    disable_tqdm=True,
                    logging_strategy="no",
                    **settings,
                )
                trainer = UnlearnTrainer(model, args, forget, retain, processing_class=tokenizer)
                trainer.train()
                model, steps = trainer.model, trainer.state.global_step
        result = check_quantization_robustness(model, tokenizer, forget_records, retain_records)
        fp, nf4, fp4, int8 = (result[k] for k in ("full_precision", "nf4", "fp4", "int8"))
        back = [m for m in ("nf4", "fp4", "int8") if result[m]["knowledge_returned"]]
        print(
            f"| {name} | {steps} | {fp['forget']['rouge_l_recall']:.3f} | {nf4['forget']['rouge_l_recall']:.3f} | "
            f"{fp4['forget']['rouge_l_recall']:.3f} | {int8['forget']['rouge_l_recall']:.3f} | "
            f"{fp['retain']['rouge_l_recall']:.3f} | {nf4['retain']['rouge_l_recall']:.3f} | "
            f"{', '.join(back) or 'no'} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
