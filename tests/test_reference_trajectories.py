"""Stored reference trajectories: the forget and retain losses of the first steps of every method on a fixed tiny
model, in the spirit of TRL's invariant tests. A method whose loss, normalisation, weighting or batching changes
silently moves these numbers. After an intended change, regenerate them and say why in the commit:

    HF_HUB_OFFLINE=1 python tests/test_reference_trajectories.py --regenerate
"""

import json
import os
import sys

import pytest
from conftest import train_on_answers

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "reference_trajectories.json")
STEPS = 4
# name -> UnlearnConfig overrides; the last three exercise gradient surgery, accumulation and the weights.
RUNS = {
    "masc": dict(method="masc"),
    "ga": dict(method="ga"),
    "graddiff": dict(method="graddiff"),
    "npo": dict(method="npo"),
    "npo_klr": dict(method="npo_klr"),
    "simnpo": dict(method="simnpo"),
    "rmu": dict(method="rmu", rmu_layer=0),
    "idk_dpo": dict(method="idk_dpo"),
    "undial": dict(method="undial"),
    "masc_sago": dict(method="masc", gradient_surgery="sago", forget_weight=0.5, retain_weight=2.0),
    "graddiff_pcgrad_accumulated": dict(
        method="graddiff", gradient_surgery="pcgrad", per_device_train_batch_size=2, gradient_accumulation_steps=2
    ),
    "masc_teacher": dict(method="masc", competitor_source="teacher", masc_beta=5.0, masc_k=2),
}


def memorized_model():
    """A tiny Llama that has learned forget01 and 20 retain QA (40 full-batch AdamW steps, deterministic)."""
    tokenizer = build_tokenizer()
    model = tiny_model(tokenizer, "llama", hidden_size=32, num_layers=2, num_heads=2)
    forget_records, retain_records = load_split("forget01"), load_split("retain99").select(range(20))
    train_on_answers(model, tokenizer, [*forget_records, *retain_records], steps=40, lr=1e-2)
    forget = build_qa_dataset(forget_records, tokenizer)
    retain = build_qa_dataset(retain_records, tokenizer)
    return model, tokenizer, forget, retain


def trajectory(name, tmp_dir):
    model, tokenizer, forget, retain = memorized_model()
    values = dict(
        output_dir=str(tmp_dir),
        max_steps=STEPS,
        learning_rate=1e-3,
        per_device_train_batch_size=4,
        probe_interval=0,
        stop_on_violation=False,
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
        assert got[key] == pytest.approx(stored[key], rel=1e-3, abs=1e-5), key
    # Not a flat line: every run moves its forget loss within these steps.
    assert got["forget_loss"][0] != pytest.approx(got["forget_loss"][-1], rel=1e-4, abs=1e-7)


if __name__ == "__main__" and "--regenerate" in sys.argv:
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        result = {name: trajectory(name, os.path.join(scratch, name)) for name in RUNS}
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with open(PATH, "w") as f:
        json.dump(result, f, indent=1)
    print(f"Wrote {PATH}")
