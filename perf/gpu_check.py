"""The prepared GPU check: MASC + KL step rate and peak memory on a ~0.5B model, full and LoRA, surgery vs sum, FSDP2.

    python perf/gpu_check.py [--json gpu_check.json] [--steps 20]          # on a GPU, no network, < 8 min
    python perf/gpu_check.py --size tiny --device cpu --steps 2            # the same code path on a CPU

A randomly initialised Llama of about 0.5B parameters (hidden 1024, 24 layers; no download) in bf16 unlearns random
token sequences (256 tokens, batch 8, forget and retain) with MASC + KL. One subprocess per setting, so each peak is
its own: full fine-tuning with gradient_surgery sum / sago / pcgrad, LoRA r16 (all linear layers) with sum / sago, and
full fine-tuning under FSDP2 on one process (torchrun, fully_shard). Each row: optimizer steps per second after 3 warm-
up steps (probes off, so the rate is the training step's), the peak of torch.cuda.max_memory_allocated, and the bytes
the trainer holds by hf_unlearn.training.memory's prediction, so the table shows what activations and temporaries add.
The surgery rows also give their step time as a ratio to `sum`'s, measured in the same run. A setting that fails is
reported with its error; the others still run. The output says what was measured, on what, and when.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The repository root, so that the check runs from a plain checkout (no `pip install -e .` needed on the GPU machine).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SIZES = {
    "0.5b": dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                 num_key_value_heads=4, vocab_size=32000, sequence=256, batch=8),
    # Llama-3.2-1B's shape (128k vocabulary) and Llama-2-7B's: LoRA only, the setting a user runs at that size.
    "1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
               num_key_value_heads=8, vocab_size=128256, sequence=256, batch=8),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, sequence=256, batch=8),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, sequence=32, batch=4),
}  # fmt: skip
# (name, adapter, surgery, fsdp2); surgery "plain" is a plain transformers.Trainer fine-tuning step (causal LM loss)
# over the same rows a MASC step reads (the forget and the retain batch): the floor a MASC step is compared with.
SETTINGS = [
    ("full, sum", "full", "sum", False),
    ("full, sago", "full", "sago", False),
    ("full, pcgrad", "full", "pcgrad", False),
    ("LoRA r16, sum", "lora", "sum", False),
    ("LoRA r16, sago", "lora", "sago", False),
    ("full, sum, FSDP2 (1 process)", "full", "sum", True),
    ("LoRA r16, plain fine-tuning", "lora", "plain", False),
    ("full, plain fine-tuning", "full", "plain", False),
]
#: --settings all runs every setting; the larger sizes run their LoRA rows only (full fine-tuning of a 7B model in
#: one process is not what a user of this library does on one GPU).
LARGE_SIZE_SETTINGS = ("LoRA r16, sum", "LoRA r16, plain fine-tuning")
WARMUP = 3
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def child(setting: int, size: str, device: str, steps: int) -> dict:
    import torch
    from peft import LoraConfig
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback

    from hf_unlearn import UnlearnConfig, UnlearnTrainer
    from hf_unlearn.training.memory import lora_parameter_count, parameter_counts, predicted_state_bytes

    name, adapter, surgery, fsdp2 = SETTINGS[setting]
    shape = dict(SIZES[size])
    sequence, batch = shape.pop("sequence"), shape.pop("batch")
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    # Built on the device in its dtype: a random 7B model built in fp32 on the CPU takes minutes.
    with torch.device("cuda" if cuda else "cpu"):
        model = LlamaForCausalLM(LlamaConfig(**shape, tie_word_embeddings=False, torch_dtype=dtype)).to(dtype)
    counts = parameter_counts(model)
    adapters = lora_parameter_count(model, 16, LORA_TARGETS)
    generator = torch.Generator().manual_seed(1)

    def examples(count: int) -> list[dict]:
        rows = []
        for _ in range(count):
            ids = torch.randint(3, shape["vocab_size"], (sequence,), generator=generator).tolist()
            rows.append({"input_ids": ids, "attention_mask": [1] * sequence, "labels": [-100] * 16 + ids[16:]})
        return rows

    forget, retain = examples(8 * batch), examples(8 * batch)
    extra = {}
    if fsdp2:
        extra = {
            "fsdp": "full_shard",
            "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]},
        }
    args = UnlearnConfig(
        output_dir=f"/tmp/gpu_check_{setting}",
        overwrite_output_dir=True,
        method="masc",
        retain_loss="kl",
        gradient_surgery="sum" if surgery == "plain" else surgery,
        per_device_train_batch_size=batch,
        max_steps=WARMUP + steps,
        probe_interval=0,
        stop_at_target=False,
        learning_rate=1e-5,
        bf16=cuda,
        use_cpu=not cuda,
        report_to="none",
        save_strategy="no",
        logging_steps=10_000,
        disable_tqdm=True,
        dataloader_num_workers=0,
        **extra,
    )
    lora = None if adapter == "full" else LoraConfig(r=16, target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    if surgery == "plain":
        from peft import get_peft_model
        from transformers import Trainer, TrainingArguments, default_data_collator

        plain = TrainingArguments(
            **{k: getattr(args, k) for k in ("output_dir", "max_steps", "learning_rate", "bf16", "use_cpu",
                                            "report_to", "save_strategy", "logging_steps", "disable_tqdm",
                                            "dataloader_num_workers")},
            per_device_train_batch_size=2 * batch,  # the forget and the retain rows of one MASC step
        )  # fmt: skip
        trainer = Trainer(
            get_peft_model(model, lora) if lora is not None else model, plain, train_dataset=forget + retain,
            data_collator=default_data_collator,
        )  # fmt: skip
        surgery = "sum"  # the memory prediction's: no second gradient
    else:
        trainer = UnlearnTrainer(model, args, forget, retain, peft_config=lora)

    class Clock(TrainerCallback):
        start: float | None = None
        end: float | None = None
        timed_steps = 0

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            if state.global_step == WARMUP:
                self.start = time.perf_counter()
            elif self.start is not None:
                self.end, self.timed_steps = time.perf_counter(), state.global_step - WARMUP

    clock = Clock()
    trainer.add_callback(clock)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    predicted = predicted_state_bytes(
        counts,
        adapter=adapter,
        # Under FSDP2 with bf16 mixed precision accelerate upcasts the trainable weights to fp32 (master weights).
        dtype="bfloat16" if cuda and not fsdp2 else "float32",
        surgery=surgery != "sum",
        lora_parameters=adapters,
    )
    if clock.start is None or clock.end is None or clock.timed_steps == 0:
        raise RuntimeError(f"fewer than {WARMUP + 1} optimizer steps ran, nothing was timed")
    seconds = clock.end - clock.start
    return {
        "setting": name if size not in ("1b", "7b") else f"{name} [{size}]",
        "size": size,
        "parameters": counts["total"],
        "timed_steps": clock.timed_steps,
        "steps_per_second": clock.timed_steps / seconds,
        "seconds_per_step": seconds / clock.timed_steps,
        "peak_allocated_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
        "predicted_state_gb": predicted.total / 1e9,
        "fsdp2": bool(trainer.is_fsdp_enabled),
        "sharded_parameters": any(hasattr(p, "to_local") for p in trainer.model.parameters()),
    }


def run_setting(index: int, size: str, device: str, steps: int, timeout: int) -> dict:
    name, _, _, fsdp2 = SETTINGS[index]
    name = f"{name} [{size}]" if size in ("1b", "7b") else name
    command = [__file__, "--child", str(index), "--size", size, "--device", device, "--steps", str(steps)]
    if fsdp2:
        if device != "cuda":
            return {"setting": name, "error": "skipped: accelerate runs FSDP only on an accelerator"}
        command = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", *command]
    started = time.perf_counter()
    try:
        completed = subprocess.run(
            [sys.executable, *command], capture_output=True, text=True, timeout=timeout, env=dict(os.environ)
        )
    except subprocess.TimeoutExpired:
        return {"setting": name, "error": f"timed out after {timeout} s"}
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        # The last line that names an error (torchrun ends its report with a border of '=').
        errors = [line.strip() for line in completed.stderr.splitlines() if "Error" in line or "error" in line]
        return {"setting": name, "error": (errors[-1] if errors else f"exit code {completed.returncode}")[:300]}
    row = json.loads(lines[-1])
    row["wall_seconds"] = time.perf_counter() - started
    return row


def _step_time(rows: list[dict], setting: str, size: str | None) -> float | None:
    """The seconds per step of ``setting`` at ``size`` among ``rows``, or None where it failed or did not run."""
    for row in rows:
        name = row.get("setting", "").split(" [")[0]
        if name == setting and row.get("size", size) == size and "error" not in row:
            return row["seconds_per_step"]
    return None


def table(rows: list[dict]) -> str:
    """Each setting's step rate, its step time against ``sum``'s (surgery) and against a plain fine-tuning step over
    the same rows with the same adapter and size (what MASC costs over ordinary training), and its memory."""
    lines = [
        "| setting | parameters | steps/s | step time vs sum | vs plain fine-tuning | peak allocated GB "
        "| predicted state GB | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['setting']} | - | - | - | - | - | - | {row['error']} |")
            continue
        size, lora = row.get("size"), row["setting"].startswith("LoRA")
        base = _step_time(rows, "LoRA r16, sum" if lora else "full, sum", size)
        plain = _step_time(rows, "LoRA r16, plain fine-tuning" if lora else "full, plain fine-tuning", size)
        ratio = f"{row['seconds_per_step'] / base:.2f}x" if base and "plain" not in row["setting"] else "-"
        over_plain = f"{row['seconds_per_step'] / plain:.2f}x" if plain and "plain" not in row["setting"] else "-"
        peak = "-" if row["peak_allocated_gb"] is None else f"{row['peak_allocated_gb']:.2f}"
        note = "sharded (DTensor)" if row.get("sharded_parameters") else ""
        lines.append(
            f"| {row['setting']} | {row['parameters'] / 1e6:.0f}M | {row['steps_per_second']:.2f} | {ratio} | "
            f"{over_plain} | {peak} | {row['predicted_state_gb']:.2f} | {note} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="0.5b")
    parser.add_argument(
        "--larger", nargs="*", choices=("1b", "7b"), default=[],
        help="after the --size settings, the LoRA MASC and plain rows at these sizes too",
    )  # fmt: skip
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--timeout", type=int, default=75, help="seconds allowed per setting")
    parser.add_argument("--deadline", type=int, default=450, help="seconds for the whole check; later settings skip")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    options = parser.parse_args()
    import torch

    device = options.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if options.child is not None:
        print(json.dumps(child(options.child, options.size, device, options.steps)))
        return
    started = time.perf_counter()
    where = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = []
    plan = [(index, options.size) for index in range(len(SETTINGS))]
    plan += [
        (index, size) for size in options.larger for index in range(len(SETTINGS))
        if SETTINGS[index][0] in LARGE_SIZE_SETTINGS
    ]  # fmt: skip
    for index, size in plan:
        left = options.deadline - (time.perf_counter() - started)
        if left < 20:
            rows.append({"setting": SETTINGS[index][0], "error": f"skipped: the {options.deadline} s deadline"})
        else:
            rows.append(run_setting(index, size, device, options.steps, min(options.timeout, int(left))))
        # Each row as soon as it exists, so a run cut short still leaves what it measured.
        print(json.dumps(rows[-1]), flush=True)
        if options.json:
            with open(options.json, "w") as f:
                json.dump({"when": stamp, "device": where, "size": options.size, "rows": rows}, f, indent=2)
    parameters = next((r["parameters"] for r in rows if "parameters" in r), 0)
    print(
        f"GPU check, {stamp}, on {where} (torch {torch.__version__}): MASC + KL, random Llama of "
        f"{parameters / 1e6:.1f}M parameters ({options.size}), {'bf16' if device == 'cuda' else 'fp32'}, "
        f"{options.steps} timed steps after {WARMUP} warm-up steps, probes off; one process per setting; "
        f"{time.perf_counter() - started:.0f} s in all."
    )
    print(table(rows))
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"when": stamp, "device": where, "size": options.size, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
