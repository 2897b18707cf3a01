"""The prepared GPU check (perf/gpu_check.py) runs its settings' code path on the CPU, so that the one run a
lent GPU allows is not spent on a broken script."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "perf", "gpu_check.py")


@pytest.mark.slow
@pytest.mark.parametrize("setting", [1, 4, 6], ids=["full-sago", "lora-sago", "lora-plain"])
def test_gpu_check_setting_runs_on_the_cpu(setting):
    command = [sys.executable, SCRIPT, "--child", str(setting), "--size", "tiny", "--device", "cpu", "--steps", "2"]
    completed = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1")
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    row = json.loads(completed.stdout.strip().splitlines()[-1])
    assert row["steps_per_second"] > 0 and row["predicted_state_gb"] > 0
    assert row["peak_allocated_gb"] is None and not row["fsdp2"]  # no CUDA here
