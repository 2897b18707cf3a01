"""A small unlearning run for the distributed tests: `torchrun --nproc_per_node N tests/distributed_job.py OUT`.

Every rank writes what it ended with (stop step, probe history, final weights) so the test can compare ranks
with each other and with a single-process run on the same global batch.
"""

import json
import os
import sys

import torch
from conftest import make_tiny_model, make_varied_example, memorize
from safetensors.torch import save_file
from transformers import TrainerCallback

from hf_unlearn import UnlearnConfig, UnlearnTrainer


class FirstGradient(TrainerCallback):
    """The gradient the optimizer gets at the first step (after the all-reduce and the surgery, clipping off)."""

    def __init__(self, model):
        self.model = model
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.grads is None:
            self.grads = {n: p.grad.detach().clone() for n, p in self.model.named_parameters() if p.grad is not None}


def main(out_dir: str, surgery: str, global_batch: int) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    # Different lengths on each rank: one process's token mean over the global batch is only matched when the
    # ranks count answer tokens together (average_tokens_across_devices), not with a mean of per-rank means.
    forget = [make_varied_example(i) for i in range(8)]
    retain = [make_varied_example(1000 + i) for i in range(16)]
    model = memorize(make_tiny_model("llama"), forget + retain, steps=60, lr=2e-2)
    args = UnlearnConfig(
        output_dir=os.path.join(out_dir, "run"),
        per_device_train_batch_size=global_batch // world,
        learning_rate=3e-3,
        forget_weight=0.5,
        retain_weight=1.5,
        max_grad_norm=0.0,
        stop_alpha=0.3,
        probe_interval=2,
        max_steps=30,
        gradient_surgery=surgery,
        retain_loss="nll",
        report_to="none",
        save_strategy="no",
        # No use_cpu: under torchrun on a CPU-only machine UnlearnConfig must choose DDP on the CPU by itself.
        disable_tqdm=True,
        dataloader_drop_last=True,
    )
    trainer = UnlearnTrainer(model=model, args=args, train_dataset=forget, retain_dataset=retain)
    first = FirstGradient(trainer.accelerator.unwrap_model(trainer.model))
    trainer.add_callback(first)
    trainer.train()
    save_file(first.grads, os.path.join(out_dir, f"rank{rank}_grads.safetensors"))
    record = trainer.record
    result = {"stop_step": record.stop_step, "global_step": record.global_step, "history": record.probe_history}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    weights = {
        k: v.detach().contiguous() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()
    }
    save_file(weights, os.path.join(out_dir, f"rank{rank}.safetensors"))
    torch.distributed.destroy_process_group() if torch.distributed.is_initialized() else None


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
