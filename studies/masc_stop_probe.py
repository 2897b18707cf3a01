"""Which stopping probe and alpha to use: MASC on the embedded benchmark, one run per setting, one table.

    python studies/masc_stop_probe.py [--quick]

Each row unlearns forget10 from the same cached target model with `holdout_fraction` > 0, so both violation
rates (on the trained forget examples and on held-out ones) are logged, and reports where the stopping rule
fired and what the stopped model keeps. The README's advice on `stop_probe` and the `stop_alpha` default come
from this table.
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks import learn_target_model, load_split  # noqa: E402
from hf_unlearn.evaluation.metrics import evaluate_qa  # noqa: E402


def run(setting: dict, forget, retain, forget_records, retain_records, before) -> dict:
    model, tokenizer, _ = learn_target_model(show_progress=False)
    with tempfile.TemporaryDirectory() as output_dir:
        args = UnlearnConfig(
            output_dir=output_dir,
            num_train_epochs=40,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_strategy="no",
            **setting,
        )
        trainer = UnlearnTrainer(
            model=model, args=args, train_dataset=forget, retain_dataset=retain, processing_class=tokenizer
        )
        trainer.train()
    record = trainer.record
    history = record.probe_history
    after_forget = evaluate_qa(trainer.model, tokenizer, forget_records)
    after_retain = evaluate_qa(trainer.model, tokenizer, retain_records)
    return {
        "stop_step": record.stop_step,
        "steps": record.global_step,
        "seconds": record.wall_seconds,
        "rate_train": history[-1].get("violation_rate_train"),
        "rate_holdout": history[-1].get("violation_rate_holdout"),
        "forget_rouge": after_forget["rouge_l_recall"],
        "retain_rouge": after_retain["rouge_l_recall"],
        "meets_target": after_forget["rouge_l_recall"] <= 0.5 * before["forget"]["rouge_l_recall"]
        and after_retain["rouge_l_recall"] >= 0.9 * before["retain"]["rouge_l_recall"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Only the default setting and the held-out probe.")
    cli = parser.parse_args()
    model, tokenizer, _ = learn_target_model(show_progress=False)
    forget_records, retain_records = load_split("forget10"), load_split("retain90")
    forget, retain = build_qa_dataset(forget_records, tokenizer), build_qa_dataset(retain_records, tokenizer)
    before = {
        "forget": evaluate_qa(model, tokenizer, forget_records),
        "retain": evaluate_qa(model, tokenizer, retain_records),
    }
    settings = [
        {"stop_probe": "train", "holdout_fraction": 0.2, "stop_alpha": 0.45},
        {"stop_probe": "holdout", "holdout_fraction": 0.2, "stop_alpha": 0.45},
    ]
    if not cli.quick:
        settings += [
            {"stop_probe": "train", "holdout_fraction": 0.2, "stop_alpha": 0.3},
            {"stop_probe": "train", "holdout_fraction": 0.2, "stop_alpha": 0.2},
            {"stop_probe": "train", "holdout_fraction": 0.0, "stop_alpha": 0.45},
            {"stop_probe": "train", "holdout_fraction": 0.0, "stop_alpha": 0.475, "learning_rate": 3e-4},
            {"stop_probe": "train", "holdout_fraction": 0.0, "stop_alpha": 0.3, "learning_rate": 3e-4},
        ]
    print(
        f"target model: forget ROUGE-L {before['forget']['rouge_l_recall']:.3f}, "
        f"retain ROUGE-L {before['retain']['rouge_l_recall']:.3f}"
    )
    columns = ["setting", "stop step", "steps", "seconds", "rate (train)", "rate (held out)"]
    columns += ["forget ROUGE-L", "retain ROUGE-L", "target met"]
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))

    def fmt(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    for setting in settings:
        row = run(setting, forget, retain, forget_records, retain_records, before)
        cells = [
            ", ".join(f"{k}={v}" for k, v in setting.items()),
            str(row["stop_step"] or "none"),
            str(row["steps"]),
            f"{row['seconds']:.1f}",
            fmt(row["rate_train"]),
            fmt(row["rate_holdout"]),
            fmt(row["forget_rouge"]),
            fmt(row["retain_rouge"]),
            str(row["meets_target"]),
        ]
        print("| " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
