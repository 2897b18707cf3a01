"""Peak memory of unlearning with LoRA vs a plain LoRA fine-tune, and vs full fine-tuning with a reference copy.

    python perf/lora_memory.py [--steps 10]

One subprocess per setting (peak resident memory, VmHWM), the same ~26M-parameter Llama and the same forget
batches (4 per step; unlearning also forwards 4 retain examples and the frozen reference on them). With LoRA the
reference for the KL term is the base model with adapters disabled, so no second copy of the weights exists.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SETTINGS = {
    "plain LoRA fine-tune (Trainer)": ("finetune", True),
    "MASC + KL, LoRA (UnlearnTrainer)": ("masc", True),
    "plain full fine-tune (Trainer)": ("finetune", False),
    "MASC + KL, full fine-tuning + reference copy": ("masc", False),
}
BIG = {"hidden_size": 512, "num_layers": 6, "num_heads": 8}


def child(kind: str, lora: bool, steps: int) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import DataCollatorForSeq2Seq, Trainer, TrainingArguments

    from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
    from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model

    sys.path.insert(0, os.path.dirname(__file__))
    from gradient_surgery import peak_rss_mb

    tokenizer = build_tokenizer()
    forget = build_qa_dataset(load_split("forget10"), tokenizer).select_columns(
        ["input_ids", "attention_mask", "labels"]
    )
    retain = build_qa_dataset(load_split("retain90"), tokenizer).select_columns(
        ["input_ids", "attention_mask", "labels"]
    )
    model = tiny_model(tokenizer, "llama", **BIG)
    lora_config = LoraConfig(
        r=16,
        lora_alpha=32,
        lora_dropout=0.05,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        task_type="CAUSAL_LM",
    )
    common = dict(
        max_steps=steps,
        per_device_train_batch_size=4,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_strategy="no",
        learning_rate=1e-4,
    )
    with tempfile.TemporaryDirectory() as output_dir:
        if kind == "finetune":
            if lora:
                model = get_peft_model(model, lora_config)
            trainer = Trainer(
                model=model,
                args=TrainingArguments(output_dir, **common),
                train_dataset=forget,
                data_collator=DataCollatorForSeq2Seq(tokenizer),
            )
        else:
            args = UnlearnConfig(output_dir, method="masc", probe_interval=0, stop_at_target=False, **common)
            trainer = UnlearnTrainer(
                model, args, forget, retain, processing_class=tokenizer, peft_config=lora_config if lora else None
            )
        trainer.train()
    print(json.dumps({"peak_mb": peak_rss_mb()}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--child", nargs=2, default=None, help=argparse.SUPPRESS)
    cli = parser.parse_args()
    if cli.child:
        child(cli.child[0], cli.child[1] == "lora", cli.steps)
        return
    peaks = {}
    for name, (kind, lora) in SETTINGS.items():
        out = subprocess.run(
            [sys.executable, __file__, "--child", kind, "lora" if lora else "full", "--steps", str(cli.steps)],
            capture_output=True,
            text=True,
            check=True,
        )
        peaks[name] = json.loads(out.stdout.strip().splitlines()[-1])["peak_mb"]
    base = peaks["plain LoRA fine-tune (Trainer)"]
    print("| setting | peak MB | ratio to plain LoRA fine-tune |")
    print("|---|---|---|")
    for name, peak in peaks.items():
        print(f"| {name} | {peak:.0f} | {peak / base:.2f} |")


if __name__ == "__main__":
    main()
