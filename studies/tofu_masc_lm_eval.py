"""One MASC run on TOFU's real rows with SmolLM2-135M-Instruct: lm-eval (the shipped tofu_real_authors task, first 40
questions) and forget/retain QA before and after. docs/studies/tofu_smollm2.md has the result.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 python studies/tofu_masc_lm_eval.py [--learning_rate 1e-3] [--json out.json]

The target is learned (or loaded from the cache) by hf_unlearn.benchmarks.tofu_target.learn_tofu_target on authors 0-2
of ../shared/tofu (2 forget authors = 40 questions, 1 retain author); authors 3-4 are MASC's calibration set. Each
line printed starts with the seconds since the start.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from hf_unlearn import UnlearnConfig
from hf_unlearn.benchmarks.tofu_target import TofuAuthorSplit, learn_tofu_target, tofu_sets
from hf_unlearn.data.examples import build_qa_dataset
from hf_unlearn.evaluation.metrics import evaluate_qa
from hf_unlearn.evaluation.utility import LmEvalSettings, check_lm_eval_tasks, lm_eval_utility, write_tofu_tasks
from hf_unlearn.jobs.models import build_trainer
from hf_unlearn.training.adapters import lora_config

TOFU_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "shared", "tofu")
START = time.perf_counter()


def say(*values) -> None:
    print(f"[{time.perf_counter() - START:6.0f}s]", *values, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--tofu_dir", default=TOFU_DIR)
    parser.add_argument("--json", default="tofu_masc_lm_eval.json")
    cli = parser.parse_args()
    split = TofuAuthorSplit.in_order(range(15), num_forget=2, num_retain=1, num_calibration=2, num_holdout=2)
    model, tokenizer, info = learn_tofu_target(cli.tofu_dir, split.learned)
    say("target", {k: info.get(k) for k in ("cached", "epochs", "rouge_l_recall", "seconds")})
    sets = tofu_sets(cli.tofu_dir, split)
    tasks = write_tofu_tasks(cli.tofu_dir, tempfile.mkdtemp())
    settings = LmEvalSettings(["tofu_real_authors"], include_path=[tasks], limit=40)
    manager = check_lm_eval_tasks(settings)
    result: dict = {"learning_rate": cli.learning_rate}
    result["target"] = {k: info.get(k) for k in ("epochs", "rouge_l_recall")}

    def measure(when: str, scored) -> None:
        scores = lm_eval_utility(scored, tokenizer, settings, task_manager=manager)
        result[f"lm_eval_{when}"] = scores["tasks"]
        say(f"lm-eval {when}", scores["tasks"]["tofu_real_authors"], f"{scores['seconds']:.0f}s")
        for name in ("forget", "retain"):
            began = time.perf_counter()
            result[f"{name}_{when}"] = evaluate_qa(scored, tokenizer, sets[name])
            say(f"{name} {when}", result[f"{name}_{when}"], f"{time.perf_counter() - began:.0f}s")
        with open(cli.json, "w") as f:
            json.dump(result, f, indent=2)

    measure("before", model)
    args = UnlearnConfig(
        output_dir=os.path.join(tempfile.gettempdir(), "tofu_masc_run"),
        overwrite_output_dir=True,
        method="masc",
        learning_rate=cli.learning_rate,
        probe_size=16,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_strategy="no",
        seed=0,
    )
    forget, retain, calibration = (build_qa_dataset(sets[n], tokenizer) for n in ("forget", "retain", "calibration"))
    trainer = build_trainer(
        model, tokenizer, args, forget, retain, calibration, lora_config(16, "all-linear", dropout=0.0)
    )  # fmt: skip
    trainer.train()
    record = trainer.record
    result["masc"] = {
        key: getattr(record, key)
        for key in ("stop_kind", "stop_reason", "global_step", "wall_seconds", "probe_seconds", "probe_seconds_by_set")
    }
    say("MASC", json.dumps(result["masc"]))
    measure("after", trainer.model)


if __name__ == "__main__":
    main()
