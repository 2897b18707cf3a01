"""A TOFU unlearning run's wall time from `train()` to the stop, for a side-by-side of two commits (issue 55 part 4).

    # once: learn the TOFU target of split A (forget authors 0-1, retain 2-5) and save it
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python perf/tofu_wall_time.py learn --tofu_dir ../shared/tofu \
        --target_dir /tmp/tofu_target
    # then, from each commit's checkout (PYTHONPATH=that checkout), one thread each, side by side:
    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 PYTHONPATH=CHECKOUT python perf/tofu_wall_time.py run \
        --tofu_dir ../shared/tofu --target_dir /tmp/tofu_target --out CHECKOUT.jsonl

`run` unlearns the saved target with MASC and every default of the checkout it imports (LoRA r16 on q/k/v/o, dropout
0, as `hf-unlearn compare --benchmark tofu`; 4 forget + 4 retain rows a step; calibration authors 6-9) and writes one
JSON line per step (seconds since `train()` began) and per probe (the stop's statistics), then a last line with the
run's totals: so a run stopped before its end still gives its time per step, and two commits' probes can be compared
step by step (the same trajectory to float tolerance means the same stop). It uses only what both sides of issue 55
have (`UnlearnConfig`, `UnlearnTrainer`, `build_qa_dataset`, `tofu_sets`, `TofuAuthorSplit`), and builds the model
from the saved target, so both commits start from the same weights.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks.tofu_target import TofuAuthorSplit, learn_tofu_target, tofu_sets  # noqa: E402
from hf_unlearn.data.loaders import load_tofu_folder  # noqa: E402
from hf_unlearn.training.adapters import lora_config  # noqa: E402


def split_of(tofu_dir: str, offset: int) -> Any:
    authors = sorted({int(row["author"]) for row in load_tofu_folder(tofu_dir)["authors"]})
    return TofuAuthorSplit.in_order(
        authors, num_forget=2, num_retain=4, num_calibration=4, num_holdout=4, offset=offset
    )  # fmt: skip


def learn(options: argparse.Namespace) -> None:
    """The TOFU target of the split (compare's learn stage), saved to ``--target_dir``, and its learn time."""
    split = split_of(options.tofu_dir, options.author_offset)
    began = time.perf_counter()
    model, tokenizer, info = learn_tofu_target(options.tofu_dir, split.learned, cache_dir=options.cache_dir)
    seconds = time.perf_counter() - began
    model.save_pretrained(options.target_dir)
    tokenizer.save_pretrained(options.target_dir)
    summary = {
        "learn_seconds": seconds,
        "cached": bool(info.get("cached")),
        **{k: info.get(k) for k in ("epochs", "rouge_l_recall", "seconds")},
    }
    with open(os.path.join(options.target_dir, "learn.json"), "w") as f:
        json.dump(summary, f, indent=2)
    print(json.dumps(summary))


class Timeline(TrainerCallback):
    """One JSON line per step (seconds since `train()` began, the step's own seconds) and per probe of
    ``trainer``'s stopping rule."""

    def __init__(self, out: Any, trainer: Any) -> None:
        self.out, self.trainer = out, trainer
        self.began = self.step_began = 0.0  # set when train() begins, and at each step's beginning
        self.probes_written = 0
        self.step_seconds: list[float] = []

    def write(self, row: dict[str, Any]) -> None:
        self.out.write(json.dumps(row) + "\n")
        self.out.flush()

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_began = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        self.step_seconds.append(now - self.step_began)
        self.write({"step": state.global_step, "elapsed": now - self.began, "step_seconds": now - self.step_began})
        history = self.trainer.stopping_callback.history if self.trainer.stopping_callback is not None else []
        for entry in history[self.probes_written :]:
            self.write({"probe": {k: v for k, v in entry.items() if isinstance(v, (int, float, str))}})
        self.probes_written = len(history)


def run(options: argparse.Namespace) -> None:
    """MASC in the calibrated mode (the rest default) of the imported checkout on the saved target, timed from
    `train()` to its end."""
    import hf_unlearn

    split = split_of(options.tofu_dir, options.author_offset)
    sets = tofu_sets(options.tofu_dir, split)
    tokenizer = AutoTokenizer.from_pretrained(options.target_dir)
    model = AutoModelForCausalLM.from_pretrained(options.target_dir, torch_dtype=torch.float32)
    data = {name: build_qa_dataset(sets[name], tokenizer) for name in ("forget", "retain", "calibration")}
    args = UnlearnConfig(
        output_dir=options.output_dir, overwrite_output_dir=True, method="masc", seed=options.seed,
        per_device_train_batch_size=4, report_to="none", save_strategy="no", logging_strategy="no",
        disable_tqdm=True, masc_threshold="calibration", stop_target="membership",  # the calibrated mode
    )  # fmt: skip
    trainer = UnlearnTrainer(
        model=model, args=args, train_dataset=data["forget"], retain_dataset=data["retain"],
        processing_class=tokenizer, calibration_dataset=data["calibration"],
        peft_config=lora_config(16, dropout=0.0),  # as compare --benchmark tofu: r16, alpha 32, q/k/v/o
    )  # fmt: skip
    with open(options.out, "w") as out:
        timeline = Timeline(out, trainer)
        trainer.add_callback(timeline)
        timeline.write({"library": os.path.dirname(hf_unlearn.__file__), "threads": torch.get_num_threads()})
        timeline.began = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - timeline.began
        record = trainer.record
        timeline.write(
            {
                "train_seconds": seconds,
                "steps": trainer.state.global_step,
                "outside_steps_seconds": seconds - sum(timeline.step_seconds),
                "stop_reason": getattr(record, "stop_reason", None),
                "probe_seconds": getattr(record, "probe_seconds", None),
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("learn", "run"))
    parser.add_argument("--tofu_dir", default=os.path.join("..", "shared", "tofu"))
    parser.add_argument("--target_dir", required=True)
    parser.add_argument("--author_offset", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache_dir", default=None, help="learn: the library's model cache (default its own)")
    parser.add_argument("--out", default="tofu_wall_time.jsonl")
    parser.add_argument("--output_dir", default=os.path.join("/tmp", "tofu_wall_time"))
    options = parser.parse_args()
    (learn if options.command == "learn" else run)(options)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
