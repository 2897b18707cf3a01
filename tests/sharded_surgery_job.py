"""Gradient surgery on FSDP2-sharded gradients: `torchrun --nproc_per_node 2 tests/sharded_surgery_job.py OUT`.

Each rank shards a small model with `fully_shard` (gloo, CPU), takes the forget and the retain gradient as its
local shards (`local_shards`), combines them with `combine_gradients_(..., reduce_sum=...)` for every strategy, and
writes the full update (gathered from the shards) and the statistics; the test compares them with one process combining
the unsharded gradients.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
from safetensors.torch import save_file
from torch.distributed.fsdp import fully_shard

from hf_unlearn.surgery.combine import STRATEGIES, combine_gradients_, local_shards


def model_and_batches():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 5))
    generator = torch.Generator().manual_seed(1)
    forget_x, retain_x = torch.randn(4, 6, generator=generator), torch.randn(4, 6, generator=generator)
    return model, forget_x, retain_x


def gradients(model, x, sign):
    model.zero_grad()
    (sign * model(x).pow(2).mean()).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def main(out_dir: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model, forget_x, retain_x = model_and_batches()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    forget = gradients(model, forget_x, -1.0)  # ascent on the forget batch
    retain = gradients(model, retain_x, 1.0)

    result, tensors = {}, {}
    for strategy in STRATEGIES:
        f, r = [g.clone() for g in forget], [g.clone() for g in retain]
        # What the trainer does: the local shards, combined with sums across the processes where needed; the
        # update is written into the retain shards, so the retain DTensors now hold it.
        f_local, r_local, reduce_sum = local_shards(f, r)
        assert reduce_sum is not None and all(a.numel() < b.numel() for a, b in zip(r_local, r, strict=True))
        _, stats = combine_gradients_(f_local, r_local, strategy, 0.7, 1.3, with_stats=True, reduce_sum=reduce_sum)
        for index, update in enumerate(r):
            tensors[f"{strategy}.{index}"] = update.full_tensor().contiguous()
        result[strategy] = {key: float(value) for key, value in stats.items()}
    if rank == 0:
        save_file(tensors, os.path.join(out_dir, "updates.safetensors"))
        with open(os.path.join(out_dir, "stats.json"), "w") as f:
            json.dump({"world_size": dist.get_world_size(), "stats": result}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
