"""Small unlearning runs for the distributed tests: `torchrun --nproc_per_node N tests/distributed_job.py JOBS.json`,
where JOBS.json maps a job's name to its arguments (`SURGERY GLOBAL_BATCH [--backend ddp|fsdp2|zero3] ...`). The
jobs run one after another in the same processes, each into the folder of its name beside JOBS.json: one launch
(the interpreter, torch, transformers and the process group start once, ~12 s of a launch against well under a
second of training) serves every run a test file compares.

Every rank writes what it ended with (stop step, probe history, first gradient, final weights, gathered from the
shards under FSDP2/ZeRO-3) so the test can compare ranks with each other and with a single-process run on the same
global batch.
"""

import argparse
import json
import os

import torch
from conftest import make_tiny_model, make_varied_example, memorize
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, TrainerCallback

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.cli.main import end_process_group
from hf_unlearn.training.memory import StateBytesCallback


def full(tensor):
    """The whole tensor from an FSDP2 shard (a collective: every rank calls it), or the tensor itself."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


class FirstGradient(TrainerCallback):
    """The gradient the optimizer gets at the first step (after the all-reduce and the surgery, clipping off)."""

    def __init__(self, model):
        self.model = model
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.grads is None:
            self.grads = {
                n: full(p.grad).detach().clone() for n, p in self.model.named_parameters() if p.grad is not None
            }


def let_accelerate_shard_on_cpu() -> None:
    """accelerate turns FSDP on only for accelerator devices (CUDA, XPU, ...); on a CPU-only machine it would run the
    FSDP configuration as plain DDP. Mark the gloo CPU processes as FSDP so that Trainer really wraps the model with
    ``fully_shard`` (DTensor parameters and gradients, reduce-scatter, sharded reference): the code path a GPU run
    takes, on this machine's CPUs."""
    import accelerate.state
    from accelerate.utils import DistributedType

    original = accelerate.state.AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kwargs):
        original(self, *args, fsdp_plugin=fsdp_plugin, **kwargs)
        # Every later AcceleratorState() copies the process state (MULTI_CPU) over the shared one: mark it again.
        plugin = fsdp_plugin or self.__dict__.get("cpu_fsdp_plugin")
        if plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            self.fsdp_plugin = self.cpu_fsdp_plugin = plugin

    accelerate.state.AcceleratorState.__init__ = init


BACKENDS = {
    "ddp": {},
    "fsdp2": {"fsdp": "full_shard",
              "fsdp_config": {"version": 2, "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}},
    "zero3": {"deepspeed": {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                            "zero_optimization": {"stage": 3}}},
}  # fmt: skip


def main(
    out_dir: str,
    surgery: str,
    global_batch: int,
    backend: str,
    accumulation: int,
    retain_loss: str,
    dtype: str,
    optim: str,
    learning_rate: float,
    stop_target: str,
) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if backend == "fsdp2" and world > 1:
        let_accelerate_shard_on_cpu()
    # Different lengths on each rank: one process's token mean over the global batch is only matched when the
    # ranks count answer tokens together (average_tokens_across_devices), not with a mean of per-rank means.
    forget = [make_varied_example(i) for i in range(8)]
    retain = [make_varied_example(1000 + i) for i in range(16)]
    # float64 (the default): the comparison with one process is then a comparison of reduction orders (two half-batch
    # gradients summed against one whole-batch gradient) at float64 rounding, ~1e-16, which no CPU's kernels can push
    # near the tests' tolerances. In float32 it was ~1e-7 and, on AVX-512 kernels, past rtol 1e-4 on near-zero
    # coordinates. DeepSpeed trains in float32 whatever it is given, so its comparison runs in float32.
    # stop_target='membership': the Min-K% window each rank sends is gathered. Its reference: half memorised answers
    # (retain ones), half never seen, so the AUC starts near 0.25 and moves as the forget answers fall below them.
    calibration = (
        retain[:4] + [make_varied_example(2000 + i) for i in range(4)] if stop_target == "membership" else None
    )
    dtype = getattr(torch, dtype)
    model = memorize(make_tiny_model("llama"), forget + retain, steps=60, lr=2e-2).to(dtype)
    args = UnlearnConfig(
        output_dir=os.path.join(out_dir, "run"),
        per_device_train_batch_size=global_batch // (world * accumulation),
        gradient_accumulation_steps=accumulation,
        optim=optim,
        learning_rate=learning_rate,
        forget_weight=0.5,
        retain_weight=1.5,
        max_grad_norm=0.0,
        stop_alpha=0.3,
        stop_target=stop_target,
        masc_threshold="calibration" if stop_target == "membership" else "rho",
        probe_size=16,
        probe_interval=2,
        max_steps=30,
        gradient_surgery=surgery,
        retain_loss=retain_loss,
        report_to="none",
        save_strategy="no",
        # No use_cpu: under torchrun on a CPU-only machine UnlearnConfig must choose DDP on the CPU by itself.
        disable_tqdm=True,
        dataloader_drop_last=True,
        **(BACKENDS[backend] if world > 1 else {}),
    )
    if backend == "zero3" and world > 1:
        # As a user's script would: from_pretrained after the DeepSpeed arguments exist, so that transformers loads
        # the weights already partitioned (zero.Init) and the reference copy has to be made partition-wise.
        import deepspeed

        # On a GPU, TrainingArguments starts DeepSpeed's process group; with use_cpu (this machine) it starts only
        # torch's, and zero.Init would partition for one process.
        assert args.world_size == world
        deepspeed.init_distributed(dist_backend="gloo")
        if rank == 0:
            model.save_pretrained(os.path.join(out_dir, "start"))
        torch.distributed.barrier()
        model = AutoModelForCausalLM.from_pretrained(os.path.join(out_dir, "start"), dtype=dtype)
        result_extra = {"loaded_partitioned": all(hasattr(p, "ds_id") for p in model.parameters())}
    else:
        result_extra = {}
    trainer = UnlearnTrainer(
        model=model, args=args, train_dataset=forget, retain_dataset=retain, calibration_dataset=calibration
    )
    first = FirstGradient(trainer.accelerator.unwrap_model(trainer.model))
    trainer.add_callback(first)
    held = StateBytesCallback(trainer)  # what this process holds before each optimizer step
    if backend != "zero3":  # DeepSpeed keeps gradients and optimizer states in its own buffers
        trainer.add_callback(held)
    trainer.train()
    save_file(first.grads, os.path.join(out_dir, f"rank{rank}_grads.safetensors"))
    record = trainer.record
    reference = [] if trainer.ref_model is None else list(trainer.ref_model.parameters())
    result = {
        "stop_step": record.stop_step,
        "global_step": record.global_step,
        "history": record.probe_history,
        "distributed_type": str(trainer.accelerator.distributed_type),
        "is_fsdp2": trainer.accelerator.is_fsdp2,
        "sharded_parameters": any(hasattr(p, "to_local") for p in trainer.model.parameters()),
        # What this process holds of the frozen reference (its shards under FSDP2 / ZeRO-3), against the full size.
        "reference_local_numel": sum(_local_numel(p) for p in reference),
        "reference_numel": sum(
            getattr(p, "ds_numel", p.numel()) for p in trainer.accelerator.unwrap_model(trainer.model).parameters()
        ),
        "state_bytes": held.peak.as_dict() if held.peak is not None else None,
        **result_extra,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    if trainer.is_deepspeed_enabled:
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(unwrapped.parameters())):
            weights = {k: v.detach().clone().contiguous() for k, v in unwrapped.state_dict().items()}
    else:
        weights = {k: full(v).detach().contiguous() for k, v in unwrapped.state_dict().items()}
    save_file(weights, os.path.join(out_dir, f"rank{rank}.safetensors"))


def _local_numel(param) -> int:
    if hasattr(param, "to_local"):
        return param.to_local().numel()
    if hasattr(param, "ds_tensor"):  # DeepSpeed ZeRO-3: this process's partition
        return param.ds_tensor.numel()
    return param.numel()


def job_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    parser.add_argument("surgery")
    parser.add_argument("global_batch", type=int)
    parser.add_argument("--backend", default="ddp", choices=sorted(BACKENDS))
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--retain_loss", default="nll")
    parser.add_argument("--dtype", default="float64", choices=["float64", "float32"])
    parser.add_argument("--optim", default="adamw_torch")
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--stop_target", default="alpha", choices=["alpha", "membership"])
    return parser


if __name__ == "__main__":
    import sys

    jobs_file = sys.argv[1]
    with open(jobs_file) as f:
        jobs = json.load(f)
    for name, argv in jobs.items():
        o = job_parser().parse_args(argv)
        out_dir = os.path.join(os.path.dirname(jobs_file), name)
        os.makedirs(out_dir, exist_ok=True)
        main(out_dir, o.surgery, o.global_batch, o.backend, o.accumulation, o.retain_loss, o.dtype, o.optim,
             o.learning_rate, o.stop_target)  # fmt: skip
    end_process_group(finished=True)  # as the CLI ends a launched command
