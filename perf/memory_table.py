"""Memory of MASC + KL per parameter: predicted from the code, checked against this machine, projected to 1B-70B.

    python perf/memory_table.py [--steps 3] [--json out.json] [--skip-measured]

Part 1 (measured, one subprocess per setting, the real SmolLM2-135M-Instruct): the bytes the trainer holds just before
an optimizer step, counted tensor by tensor (hf_unlearn.training.memory.StateBytesCallback), against the prediction
(hf_unlearn.training.memory.predicted_state_bytes), and the process's peak resident memory (VmHWM) with its baseline
after the imports, so that what the prediction leaves out (activations, the probe's forwards, allocator slack,
libraries) is visible too.

Part 2 (projected): the prediction for Llama-3.2-1B, Llama-3.1-8B and Llama-3.1-70B (parameter counts from the
architectures built on the meta device, no weights), bf16 weights as on a GPU, per GPU for 1 GPU, and the smallest
number of 80 GB / 141 GB GPUs whose FSDP2 / ZeRO-3 shards fit in 80% of each GPU (the other 20% left for
activations, gathered layers and the CUDA context; a guess, not a measurement).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
LORA_RANK = 16
# (name, adapter, gradient surgery, reference dtype)
SETTINGS = [
    ("full", "full", "sum", None),
    ("full + SAGO", "full", "sago", None),
    ("full, bf16 reference", "full", "sum", "bfloat16"),
    ("LoRA r16", "lora", "sum", None),
    ("LoRA r16 + SAGO", "lora", "sago", None),
    ("QLoRA r16 (NF4)", "qlora", "sum", None),
]
ARCHITECTURES = {
    "Llama-3.2-1B": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "Llama-3.1-8B": dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "Llama-3.1-70B": dict(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                          num_attention_heads=64, num_key_value_heads=8, tie_word_embeddings=False),
}  # fmt: skip
GPUS_GB = (80, 141)
USABLE = 0.8


def peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def child(setting: int, steps: int) -> None:
    baseline = peak_rss_mb()  # after Python starts; the imports below count toward the peak
    import torch
    from peft import LoraConfig

    from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
    from hf_unlearn.benchmarks import load_split
    from hf_unlearn.benchmarks.pretrained import load_smollm2
    from hf_unlearn.training.memory import (
        StateBytesCallback,
        lora_parameter_count,
        parameter_counts,
        predicted_state_bytes,
    )

    name, adapter, surgery, reference_dtype = SETTINGS[setting]
    model, tokenizer = load_smollm2()
    counts = parameter_counts(model)
    adapters = lora_parameter_count(model, LORA_RANK, LORA_TARGETS)
    if adapter == "qlora":
        import tempfile

        from hf_unlearn.jobs import load_model_and_tokenizer

        folder = tempfile.mkdtemp()
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        del model
        model, tokenizer = load_model_and_tokenizer(folder, load_in_4bit=True)
    imports_and_model = peak_rss_mb()
    columns = ["input_ids", "attention_mask", "labels"]
    forget = build_qa_dataset(load_split("forget10"), tokenizer).select_columns(columns)
    retain = build_qa_dataset(load_split("retain90").select(range(64)), tokenizer).select_columns(columns)
    args = UnlearnConfig(
        output_dir=os.path.join("/tmp", f"memory_table_{setting}"),
        overwrite_output_dir=True,
        method="masc",
        gradient_surgery=surgery,
        reference_dtype=reference_dtype,
        max_steps=steps,
        per_device_train_batch_size=4,
        probe_interval=1,
        stop_at_target=False,
        learning_rate=1e-5,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    lora = None if adapter == "full" else LoraConfig(r=LORA_RANK, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    trainer = UnlearnTrainer(model, args, forget, retain, processing_class=tokenizer, peft_config=lora)
    counter = StateBytesCallback(trainer)
    trainer.add_callback(counter)
    torch.manual_seed(0)
    trainer.train()
    predicted = predicted_state_bytes(
        counts, adapter=adapter, surgery=surgery != "sum", reference_dtype=reference_dtype, lora_parameters=adapters
    )
    print(
        json.dumps(
            {
                "setting": name,
                "parameters": counts["total"],
                "adapter_parameters": adapters if adapter != "full" else 0,
                "counted": counter.peak.as_dict(),
                "predicted": predicted.as_dict(),
                "baseline_rss_mb": baseline,
                "after_model_rss_mb": imports_and_model,
                "peak_rss_mb": peak_rss_mb(),
            }
        )
    )


def measured(steps: int) -> list[dict]:
    rows = []
    for index, (name, *_rest) in enumerate(SETTINGS):
        completed = subprocess.run(
            [sys.executable, __file__, "--child", str(index), "--steps", str(steps)],
            capture_output=True,
            text=True,
            env=dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2")),
        )
        if completed.returncode != 0:
            raise RuntimeError(f"{name}: {completed.stderr[-3000:]}")
        rows.append(json.loads(completed.stdout.strip().splitlines()[-1]))
        print(f"  measured {name}", file=sys.stderr)
    return rows


def projected() -> list[dict]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from hf_unlearn.training.memory import lora_parameter_count, parameter_counts, predicted_state_bytes

    rows = []
    for architecture, values in ARCHITECTURES.items():
        with torch.device("meta"):
            model = LlamaForCausalLM(LlamaConfig(**values))
        counts = parameter_counts(model)
        adapters = lora_parameter_count(model, LORA_RANK, LORA_TARGETS)
        # bf16 weights throughout (dtype=bfloat16 at load; AdamW's moments follow the weights), and full fine-tuning
        # with fp32 master weights under bf16 autocast and a bf16 reference (reference_dtype), with and without SAGO.
        variants = [(name, adapter, surgery, "bfloat16", None) for name, adapter, surgery, ref in SETTINGS if not ref]
        variants[2:2] = [
            ("full, fp32 master + bf16 reference", "full", "sum", "float32", "bfloat16"),
            ("full + SAGO, fp32 master + bf16 reference", "full", "sago", "float32", "bfloat16"),
        ]
        for name, adapter, surgery, dtype, reference_dtype in variants:
            state = predicted_state_bytes(
                counts,
                adapter=adapter,
                dtype=dtype,
                surgery=surgery != "sum",
                reference_dtype=reference_dtype,
                lora_parameters=adapters,
            )
            gb = state.total / 1e9
            rows.append(
                {
                    "architecture": architecture,
                    "parameters": counts["total"],
                    "setting": name,
                    "bytes_per_parameter": state.total / counts["total"],
                    "one_gpu_gb": gb,
                    **{f"gpus_{size}gb": max(1, math.ceil(gb / (USABLE * size))) for size in GPUS_GB},
                }
            )
    return rows


def markdown(measured_rows: list[dict], projected_rows: list[dict]) -> str:
    lines = []
    if measured_rows:
        lines += [
            "| SmolLM2-135M, fp32, MASC + KL | counted MB | predicted MB | bytes/param | peak RSS MB | RSS after "
            "model MB | start MB |",
            "|---|---|---|---|---|---|---|",
        ]
        for row in measured_rows:
            counted, predicted = row["counted"]["total"], row["predicted"]["total"]
            lines.append(
                f"| {row['setting']} | {counted / 1e6:.0f} | {predicted / 1e6:.0f} | "
                f"{counted / row['parameters']:.2f} | {row['peak_rss_mb']:.0f} | {row['after_model_rss_mb']:.0f} | "
                f"{row['baseline_rss_mb']:.0f} |"
            )
        lines.append("")
    lines += [
        "| model, MASC + KL | setting (bf16 weights unless said) | bytes/param | on one GPU | 80 GB GPUs | "
        "141 GB GPUs |",
        "|---|---|---|---|---|---|",
    ]
    for row in projected_rows:
        lines.append(
            f"| {row['architecture']} ({row['parameters'] / 1e9:.2f}B) | {row['setting']} | "
            f"{row['bytes_per_parameter']:.2f} | {row['one_gpu_gb']:.0f} GB | {row['gpus_80gb']} | "
            f"{row['gpus_141gb']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--skip-measured", action="store_true")
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child is not None:
        child(options.child, options.steps)
        return
    measured_rows = [] if options.skip_measured else measured(options.steps)
    projected_rows = projected()
    print(markdown(measured_rows, projected_rows))
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"measured": measured_rows, "projected": projected_rows}, f, indent=2)


if __name__ == "__main__":
    main()
