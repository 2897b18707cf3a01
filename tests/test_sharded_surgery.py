"""Gradient surgery on FSDP2-sharded gradients (2 CPU processes, gloo) gives the update of the unsharded tensors."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from sharded_surgery_job import gradients, model_and_batches

from hf_unlearn.surgery.combine import STRATEGIES, combine_gradients_

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    out = tmp_path_factory.mktemp("sharded")
    command = [
        sys.executable,
        *["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
        os.path.join(HERE, "sharded_surgery_job.py"),
        str(out),
    ]
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return load_file(os.path.join(out, "updates.safetensors")), json.loads((out / "stats.json").read_text())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sharded_update_equals_the_unsharded_one(sharded, strategy):
    updates, saved = sharded
    assert saved["world_size"] == 2
    model, forget_x, retain_x = model_and_batches()
    forget, retain = gradients(model, forget_x, -1.0), gradients(model, retain_x, 1.0)
    expected, stats = combine_gradients_(forget, retain, strategy, 0.7, 1.3, with_stats=True)
    for index, tensor in enumerate(expected):
        torch.testing.assert_close(updates[f"{strategy}.{index}"], tensor, rtol=1e-5, atol=1e-7)
    for key, value in stats.items():
        assert saved["stats"][strategy][key] == pytest.approx(float(value), rel=1e-6, abs=1e-9), key


def test_unreduced_shards_would_differ(sharded):
    """The check has teeth: combining each half on its own (no reduction) gives another PCGrad update."""
    model, forget_x, retain_x = model_and_batches()
    forget, retain = gradients(model, forget_x, -1.0), gradients(model, retain_x, 1.0)
    full, _ = combine_gradients_([f.clone() for f in forget], [r.clone() for r in retain], "pcgrad_global", 0.7, 1.3)
    halves = [
        combine_gradients_([f.chunk(2)[i].clone() for f in forget], [r.chunk(2)[i].clone() for r in retain],
                           "pcgrad_global", 0.7, 1.3)[0]
        for i in range(2)
    ]  # fmt: skip
    glued = [torch.cat([a, b]) for a, b in zip(*halves, strict=True)]
    assert any(not torch.allclose(a, b) for a, b in zip(glued, full, strict=True))
