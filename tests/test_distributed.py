"""Two CPU processes (torchrun, gloo) must stop at the same step and end with the weights of one process
trained on the same global batch."""

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))


def launch(out_dir, processes, surgery, global_batch=4):
    os.makedirs(out_dir, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={processes}",
        os.path.join(HERE, "distributed_job.py"),
        str(out_dir),
        surgery,
        str(global_batch),
    ]
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    results = []
    for rank in range(processes):
        with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
            results.append((json.load(f), load_file(os.path.join(out_dir, f"rank{rank}.safetensors"))))
    return results


@pytest.mark.slow
@pytest.mark.parametrize("surgery", ["sum", "sago"])
def test_two_processes_match_one_process(tmp_path, surgery):
    two = launch(tmp_path / "two", 2, surgery)
    ((one_result, one_weights),) = launch(tmp_path / "one", 1, surgery)
    (rank0, weights0), (rank1, weights1) = two
    assert rank0["stop_step"] is not None, rank0["history"]
    assert rank0["stop_step"] == rank1["stop_step"] == one_result["stop_step"]
    assert rank0["global_step"] == rank1["global_step"]
    for name, tensor in one_weights.items():
        torch.testing.assert_close(weights0[name], weights1[name], rtol=0, atol=0)
        if surgery == "sum":
            torch.testing.assert_close(weights0[name], tensor, rtol=1e-4, atol=1e-5)
        else:
            # SAGO keeps or drops a coordinate by the signs of g_f and g_r; where one of them is ~1e-9 the
            # reduction order can flip the sign and AdamW turns that tiny gradient into a full lr-sized step.
            # So: all but a handful of coordinates agree tightly, and none is off by more than a few steps.
            close = torch.isclose(weights0[name], tensor, rtol=1e-4, atol=1e-5)
            assert close.float().mean() > 0.999, name
            assert (weights0[name] - tensor).abs().max() < 4 * 3e-3, name
