"""Two CPU processes (torchrun or `accelerate launch`, gloo) must stop at the same step and end with the weights
of one process trained on the same global batch."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import tiny_model_folder, write_qa_files
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))


LAUNCHERS = {
    "torchrun": lambda n: ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"],
    # accelerate's multi-GPU launcher is torch.distributed.run underneath; on a CPU-only machine it runs gloo.
    "accelerate": lambda n: ["-m", "accelerate.commands.launch", "--multi_gpu", f"--num_processes={n}",
                             "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no"],
}  # fmt: skip


# Two processes against one, in float64 (tests/distributed_job.py). Measured on AVX2 kernels (AMD EPYC, 2026-12-01):
# first-step gradients within 1.7e-16 absolute, final weights after 8-10 AdamW steps within 9.5e-16, for sum, SAGO
# and PCGrad, DDP and FSDP2. The tolerances leave four orders of magnitude for other kernels (AVX-512 reorders sums
# at the same float64 rounding); a real error (a token count per rank instead of summed, a weight applied twice)
# moves gradients by 1e-3 or more. In float32 the same runs differed by ~1e-7, and AVX-512 kernels pushed
# near-zero coordinates past rtol 1e-4 (and flipped SAGO's sign choices on them).
GRADIENT_TOLERANCE = dict(rtol=1e-9, atol=1e-12)
WEIGHT_TOLERANCE = dict(rtol=1e-9, atol=1e-11)


GLOO_TEARDOWN_ABORT = "terminate called without an active exception"


def launch(out_dir, processes, jobs, launcher="torchrun"):
    """Run ``jobs`` ({name: distributed_job.py arguments}) one after another in one launch of ``processes``
    processes; {name: [(result, weights) of each rank]}."""
    os.makedirs(out_dir, exist_ok=True)
    jobs_file = os.path.join(out_dir, "jobs.json")
    with open(jobs_file, "w") as f:
        json.dump(jobs, f)
    command = [sys.executable, *LAUNCHERS[launcher](processes), os.path.join(HERE, "distributed_job.py"), jobs_file]
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1")
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    if completed.returncode != 0 and GLOO_TEARDOWN_ABORT in completed.stderr:
        # Seen twice (2026-12-02 and 12-03, AVX-512 Xeon, 2 busy cores), both on FSDP2 with PCGrad, KL and
        # accumulation: a gloo thread still running as rank 0 exits aborts it, and the agent then kills the other
        # rank before it has written its results. Not the job's failure (it passed when relaunched): a second launch
        # decides.
        completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    runs = {}
    for name in jobs:
        runs[name] = []
        for rank in range(processes):
            folder = os.path.join(out_dir, name)
            with open(os.path.join(folder, f"rank{rank}.json")) as f:
                result = json.load(f)
            result["grads"] = load_file(os.path.join(folder, f"rank{rank}_grads.safetensors"))
            runs[name].append((result, load_file(os.path.join(folder, f"rank{rank}.safetensors"))))
    return runs


# DeepSpeed trains in float32 whatever it is given. AdamW's first steps turn float32 rounding differences of near-zero
# gradients into learning-rate-sized steps (measured: 3e-6 apart on AVX2 kernels, 5.6e-3 on the DEFAULT ones), so the
# ZeRO-3 comparison runs with plain SGD, which carries them linearly: measured within 1.1e-6 (AVX2) and 1.8e-6
# (DEFAULT kernels) of one process after 8 steps, 2026-12-01.
FLOAT32_SGD = ["--dtype", "float32", "--optim", "sgd", "--learning_rate", "0.03"]
FSDP2 = ["--backend", "fsdp2"]
# Every run the tests compare, grouped by launch: (processes, launcher, {job: distributed_job.py arguments}). The
# single-process references share one launch; so do the runs of one backend and launcher.
LAUNCHES = {
    "one": (1, "torchrun", {
        "sum": ["sum", "4"],
        "sago": ["sago", "4"],
        "membership": ["sum", "4", "--stop_target", "membership"],
        "pcgrad-kl": ["pcgrad", "4", "--retain_loss", "kl"],
        "sum-kl-float32-sgd": ["sum", "4", "--retain_loss", "kl", *FLOAT32_SGD],
    }),
    "torchrun": (2, "torchrun", {
        "sum": ["sum", "4"],
        "sago": ["sago", "4"],
        "membership": ["sum", "4", "--stop_target", "membership"],
    }),
    "accelerate": (2, "accelerate", {"sum": ["sum", "4"]}),
    "fsdp2": (2, "torchrun", {
        "sago": ["sago", "4", *FSDP2],
        "pcgrad-kl-accumulation": ["pcgrad", "4", *FSDP2, "--retain_loss", "kl", "--accumulation", "2"],
    }),
    "zero3": (2, "torchrun", {"sum-kl-float32-sgd": ["sum", "4", "--backend", "zero3", "--retain_loss", "kl",
                                                     *FLOAT32_SGD]}),
}  # fmt: skip


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """``launched(group)``: the runs of one of LAUNCHES, launched the first time a test asks for them."""
    runs = {}

    def get(group):
        if group not in runs:
            processes, launcher, jobs = LAUNCHES[group]
            runs[group] = launch(tmp_path_factory.mktemp(group), processes, jobs, launcher)
        return runs[group]

    return get


@pytest.mark.slow
@pytest.mark.parametrize(("surgery", "launcher"), [("sum", "torchrun"), ("sago", "torchrun"), ("sum", "accelerate")])
def test_two_processes_match_one_process(launched, surgery, launcher):
    two = launched(launcher)[surgery]
    ((one_result, one_weights),) = launched("one")[surgery]
    (rank0, weights0), (rank1, weights1) = two
    assert rank0["stop_step"] is not None, rank0["history"]
    assert rank0["stop_step"] == rank1["stop_step"] == one_result["stop_step"]
    assert rank0["global_step"] == rank1["global_step"]
    # Examples of different lengths and weights other than 1: the first step's gradient equals one process's on
    # the same global batch (token counts summed over ranks), for the plain sum and through gradient surgery, and so
    # do the final weights. The job runs in float64, so what differs is the reduction order at float64 rounding.
    for name, grad in one_result["grads"].items():
        torch.testing.assert_close(rank0["grads"][name], rank1["grads"][name], rtol=0, atol=0)
        torch.testing.assert_close(rank0["grads"][name], grad, **GRADIENT_TOLERANCE)
    for name, tensor in one_weights.items():
        torch.testing.assert_close(weights0[name], weights1[name], rtol=0, atol=0)
        torch.testing.assert_close(weights0[name], tensor, **WEIGHT_TOLERANCE)


def assert_ranks_agree(two):
    (rank0, weights0), (rank1, weights1) = two
    assert rank0["stop_step"] is not None, rank0["history"]
    assert rank0["stop_step"] == rank1["stop_step"] and rank0["global_step"] == rank1["global_step"]
    for name, tensor in weights0.items():
        torch.testing.assert_close(weights1[name], tensor, rtol=0, atol=0)


@pytest.mark.slow
@pytest.mark.parametrize(("job", "reference"), [("sago", "sago"), ("pcgrad-kl-accumulation", "pcgrad-kl")])
def test_fsdp2_trainer_matches_one_process(launched, job, reference):
    """Trainer under FSDP2 (fully_shard, DTensor gradients, 2 gloo processes): gradient surgery is combined shard by
    shard, the KL reference is sharded like the model, and both ranks probe, stop and update as one process does on
    the same global batch; with gradient accumulation too (each micro-batch's forget and retain gradients are
    reduce-scattered apart, not mixed in FSDP2's unsharded accumulators)."""
    two = launched("fsdp2")[job]
    ((one, one_weights),) = launched("one")[reference]
    assert_ranks_agree(two)
    (rank0, weights0), _ = two
    assert rank0["is_fsdp2"] and rank0["sharded_parameters"]
    assert rank0["stop_step"] == one["stop_step"]
    if "kl" in job:
        # Each process holds about half of the frozen reference (its shards), not a whole copy.
        assert rank0["reference_local_numel"] < 0.6 * rank0["reference_numel"], rank0
    # ... and about half of the weights, gradients, AdamW moments and surgery buffers one process holds.
    held, whole = rank0["state_bytes"], one["state_bytes"]
    for kind in ("weights", "gradients", "optimizer", "reference", "surgery"):
        assert held[kind] <= 0.6 * whole[kind], (kind, held, whole)
    assert held["surgery"] > 0 and held["surgery"] == held["gradients"]
    for name, grad in one["grads"].items():
        torch.testing.assert_close(rank0["grads"][name], grad, **GRADIENT_TOLERANCE)
    for name, tensor in one_weights.items():
        torch.testing.assert_close(weights0[name], tensor, **WEIGHT_TOLERANCE)


@pytest.mark.slow
def test_deepspeed_zero3_partitions_the_reference_and_matches_one_process(launched):
    """DeepSpeed ZeRO-3 on 2 CPU processes with the KL reference, the model loaded already partitioned
    (from_pretrained under zero.Init): the reference is copied partition-wise and partitioned like the model (an
    inference-only engine), and the run stops and ends where one process does (a wrong reference would change the
    KL term and the trajectory). Float32 and SGD: see FLOAT32_SGD."""
    pytest.importorskip("deepspeed")
    two = launched("zero3")["sum-kl-float32-sgd"]
    ((one, one_weights),) = launched("one")["sum-kl-float32-sgd"]
    assert_ranks_agree(two)
    (rank0, weights0), _ = two
    assert rank0["distributed_type"] == "DistributedType.DEEPSPEED" and rank0["loaded_partitioned"]
    assert rank0["reference_local_numel"] < 0.6 * rank0["reference_numel"], rank0
    assert rank0["stop_step"] == one["stop_step"]
    for name, tensor in one_weights.items():
        assert (weights0[name] - tensor).abs().max() < 2e-5, name  # 10x the spread measured above


@pytest.mark.slow
# A launch, a report written once and whole weights saved: nothing here depends on the CPU's kernels.
@pytest.mark.not_numerics
@pytest.mark.parametrize("config_file", ["ddp.yaml", "zero3.yaml"])
def test_cli_under_accelerate_launch_reports_once(tmp_path, config_file):
    """`accelerate launch --config_file examples/accelerate/<file> -m hf_unlearn.cli.main run ...` on a CPU-only
    machine: both processes train (use_cpu is switched on by itself), the main process alone writes the report and
    says so once. With ZeRO-3 the CLI loads the model partitioned (zero.Init), measures before and after with the
    weights gathered, and copies the KL reference partition-wise."""
    if config_file == "zero3.yaml":
        pytest.importorskip("deepspeed")
    tiny_model_folder(tmp_path / "model", "gpt2", hidden_size=32, num_layers=1, num_heads=2)
    write_qa_files(tmp_path)
    # The shipped accelerate config, as a user would launch it.
    config = os.path.join(HERE, "..", "examples", "accelerate", config_file)
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config,
               "-m", "hf_unlearn.cli.main", "run",
               "--model_name_or_path", str(tmp_path / "model"), "--forget_data", str(tmp_path / "forget.json"),
               "--retain_data", str(tmp_path / "retain.jsonl"), "--output_dir", str(tmp_path / "out"),
               "--max_steps", "4", "--probe_interval", "2", "--report_to", "none",
               "--learning_rate", "1e-3"]  # fmt: skip
    completed = subprocess.run(
        command, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=600
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert (completed.stdout + completed.stderr).count("Written:") == 1
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["global_step"] <= 4 and (tmp_path / "out" / "model.safetensors").is_file()
    # Whole weights were saved (under ZeRO-3 gathered from the partitions, not the empty placeholders).
    saved = load_file(tmp_path / "out" / "model.safetensors")
    assert all(tensor.numel() > 0 for tensor in saved.values())


@pytest.mark.slow
def test_the_calibrated_hinge_and_the_membership_stop_match_one_process(launched):
    """stop_target='membership' (a calibration set: the hinge's rank-matched never-seen thresholds) with two
    processes. The thresholds rank each token among the whole micro-batch's tokens, gathered from both processes, so
    the first gradient and the final weights are one process's (before: each process ranked its half, 0.13 off at the
    first step). Each process sends its latest probe_size / 2 Min-K% scores and the gathered window holds the answers
    one process's holds, so every probe reads the same AUC and both ranks stop where one process does."""
    (rank0, weights0), (rank1, _) = launched("torchrun")["membership"]
    ((one, one_weights),) = launched("one")["membership"]
    for name, grad in one["grads"].items():
        torch.testing.assert_close(rank0["grads"][name], grad, **GRADIENT_TOLERANCE)
    for name, weight in one_weights.items():
        torch.testing.assert_close(weights0[name], weight, **WEIGHT_TOLERANCE)

    def aucs(result, key):
        return [(h["step"], h.get(key)) for h in result["history"]]

    # the running read (the gathered window) at every probe, the exact read where it was due
    read = [auc for _, auc in aucs(one, "running_calibration_min_k_auc") if auc is not None]
    assert len(read) >= 3 and len(set(read)) > 1, one["history"]  # the window moved between probes
    for key in ("running_calibration_min_k_auc", "calibration_min_k_auc"):
        steps = [[step for step, _ in aucs(result, key)] for result in (rank0, rank1, one)]
        assert steps[0] == steps[1] == steps[2]
        for (_, two_procs), (_, other_rank), (_, single) in zip(
            aucs(rank0, key), aucs(rank1, key), aucs(one, key), strict=True
        ):
            assert two_procs == other_rank and (two_procs is None) == (single is None)
            assert single is None or two_procs == pytest.approx(single, abs=1e-9)
    assert one["stop_step"] is not None and rank0["stop_step"] == rank1["stop_step"] == one["stop_step"]


def test_every_process_pushes_or_refuses_as_the_first_ones_record_says(tmp_path):
    """UnlearnTrainer.push_to_hub on two processes: the first process's record decides for both (an audit runs there
    alone), so an unjudged run is refused on both, and once the first one's record holds a landed verdict both go on
    to the Hub (here offline: ConnectionError on both), none refusing on its own stale record."""
    command = [sys.executable, *LAUNCHERS["torchrun"](2), os.path.join(HERE, "push_job.py"), str(tmp_path)]
    env = dict(os.environ, PYTHONPATH=HERE + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               HF_HUB_OFFLINE="1")  # fmt: skip
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert completed.returncode == 0, completed.stderr[-4000:]
    for rank in range(2):
        with open(tmp_path / f"rank{rank}.json") as f:
            assert json.load(f) == {"unjudged": "ValueError", "judged_on_first": "ConnectionError"}
