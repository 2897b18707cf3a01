"""Stored reference trajectories: the forget and retain losses of the first steps of every method on a fixed tiny
model, in the spirit of TRL's invariant tests. A method whose loss, normalisation, weighting or batching changes
silently moves these numbers. After an intended change, regenerate them and say why in the commit:

    HF_HUB_OFFLINE=1 python tests/test_reference_trajectories.py --regenerate

The numbers must not depend on the CPU. In float32 with AdamW they did: AVX-512 and AVX2 kernels differ in the last
bits, and AdamW's first steps turn a last-bit difference of a near-zero gradient into a step of the learning rate's
size (measured: retain loss off by up to 2% relative after 4 steps between an AMD Zen 4 with AVX-512 and the same CPU
with ``ATEN_CPU_CAPABILITY=avx2``). So the model is learned and unlearned in float64, the memorisation's loss is taken
in float64 here (transformers' loss would round the logits to float32) and the unlearning steps use plain SGD, whose
steps carry a kernel difference through linearly instead of amplifying it. What remains between kernel families is
measured by ``--kernel-spread`` (the largest relative difference between this process's kernels and another run's) and
is far below the tolerance below.
"""

import functools
import json
import os
import sys

import pytest
import torch
from conftest import answer_nll, cpu_independent_init

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
from hf_unlearn.data.pairing import pad_examples

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "reference_trajectories.json")
STEPS = 4
# GPT-2: fully float64 (Llama's and Qwen2's RMSNorm compute in float32 whatever the model's dtype).
ARCH = "gpt2"
# name -> UnlearnConfig overrides; the last three exercise gradient surgery, accumulation and the weights.
RUNS = {
    "masc": dict(method="masc"),
    "ga": dict(method="ga"),
    "graddiff": dict(method="graddiff"),
    "npo": dict(method="npo"),
    "npo_klr": dict(method="npo_klr"),
    "simnpo": dict(method="simnpo"),
    "rmu": dict(method="rmu", forget_loss_kwargs={"layer": 0}),
    "idk_dpo": dict(method="idk_dpo"),
    "undial": dict(method="undial"),
    # NLL, not MASC's default KL, as the retain term: at the first step the model is its own reference, the KL
    # gradient is pure rounding noise, and SAGO's per-coordinate sign test on noise differs between CPUs.
    # masc_rival_kl off for the same reason: at the first step its KL to the start model is rounding noise too.
    "masc_sago": dict(
        method="masc",
        retain_loss="nll",
        gradient_surgery="sago",
        forget_weight=0.5,
        retain_weight=2.0,
        masc_rival_kl=0.0,
    ),
    "graddiff_pcgrad_accumulated": dict(
        method="graddiff", gradient_surgery="pcgrad", per_device_train_batch_size=2, gradient_accumulation_steps=2
    ),
    "masc_teacher": dict(method="masc", competitor_source="teacher", masc_beta=5.0, masc_k=2),
    # MASC holding the other tokens' distribution where the start model has it (on by default with a calibration
    # set; these runs have none, so their MASC is the paper's hinge alone):
    "masc_rival_kl": dict(method="masc", masc_rival_kl=10.0),
}


# Relative tolerance of the comparison. Between kernel families (AVX2 against the unvectorised DEFAULT kernels,
# ATEN_CPU_CAPABILITY=default) every logged value was identical (measured 2026-12-01 with --kernel-spread; the logs
# hold float32, so the spread is below 6e-8); the mutations these trajectories must catch (NPO's 2/beta as 1/beta,
# num_items_in_batch dropped, a surgery weight applied twice) move them by 1e-3 or more.
RELATIVE_TOLERANCE = 1e-6


def fresh_model(tokenizer):
    """The tiny model in float64 with weights that do not depend on the CPU (see conftest.cpu_independent_init)."""
    return cpu_independent_init(tiny_model(tokenizer, ARCH, hidden_size=32, num_layers=2, num_heads=2).double())


@functools.cache
def memorized_state():
    """A tiny float64 GPT-2 that has learned forget01 and 20 retain QA (40 full-batch AdamW steps, deterministic):
    its weights, learned once per process."""
    tokenizer = build_tokenizer()
    model = fresh_model(tokenizer)
    forget = build_qa_dataset(load_split("forget01"), tokenizer)
    retain = build_qa_dataset(load_split("retain99").select(range(20)), tokenizer)
    examples = [{k: e[k] for k in ("input_ids", "attention_mask", "labels")} for e in list(forget) + list(retain)]
    batch = pad_examples(examples, tokenizer.pad_token_id)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(40):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = answer_nll(logits, batch["labels"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}


def memorized_model():
    tokenizer = build_tokenizer()
    model = fresh_model(tokenizer)
    model.load_state_dict(memorized_state())
    forget = build_qa_dataset(load_split("forget01"), tokenizer)
    retain = build_qa_dataset(load_split("retain99").select(range(20)), tokenizer)
    return model, tokenizer, forget, retain


def trajectory(name, tmp_dir):
    model, tokenizer, forget, retain = memorized_model()
    values = dict(
        output_dir=str(tmp_dir),
        max_steps=STEPS,
        optim="sgd",
        learning_rate=0.1,
        per_device_train_batch_size=4,
        probe_interval=0,
        stop_at_target=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    values.update(RUNS[name])
    trainer = UnlearnTrainer(model, UnlearnConfig(**values), forget, retain, processing_class=tokenizer)
    trainer.train()
    logs = [log for log in trainer.state.log_history if "forget_loss" in log]
    return {key: [log[key] for log in logs] for key in ("loss", "forget_loss", "retain_loss") if key in logs[0]}


@pytest.mark.parametrize("name", list(RUNS))
def test_first_steps_match_the_stored_trajectory(tmp_path, name):
    with open(PATH) as f:
        stored = json.load(f)[name]
    got = trajectory(name, tmp_path)
    assert got.keys() == stored.keys()
    for key in stored:
        assert len(got[key]) == STEPS
        assert got[key] == pytest.approx(stored[key], rel=RELATIVE_TOLERANCE, abs=1e-12), key
    # Not a flat line: every run moves its forget loss within these steps, by far more than the tolerance.
    assert max(got["forget_loss"]) - min(got["forget_loss"]) > 1e-3 * abs(got["forget_loss"][0])


def all_trajectories():
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        return {name: trajectory(name, os.path.join(scratch, name)) for name in RUNS}


def largest_relative_difference(a, b):
    return max(
        abs(x - y) / max(abs(y), 1e-12) for name in b for key in b[name] for x, y in zip(a[name][key], b[name][key])
    )


if __name__ == "__main__" and "--regenerate" in sys.argv:
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with open(PATH, "w") as f:
        json.dump(all_trajectories(), f, indent=1)
    print(f"Wrote {PATH}")
elif __name__ == "__main__" and "--kernel-spread" in sys.argv:
    # Run once per kernel family and compare, e.g.:
    #   ATEN_CPU_CAPABILITY=default python tests/test_reference_trajectories.py --kernel-spread /tmp/default.json
    #   python tests/test_reference_trajectories.py --kernel-spread /tmp/default.json
    other_path = sys.argv[sys.argv.index("--kernel-spread") + 1]
    mine = all_trajectories()
    print(f"kernels: {torch.backends.cpu.get_cpu_capability()}")
    if os.path.exists(other_path):
        for label, path in ((other_path, other_path), ("the stored file", PATH)):
            with open(path) as f:
                print(f"largest relative difference to {label}: {largest_relative_difference(mine, json.load(f)):.3g}")
    else:
        with open(other_path, "w") as f:
            json.dump(mine, f)
        print(f"Wrote {other_path}")
