"""`hf-unlearn compare`: every method on the same target model and split, side by side, over learning rates and seeds.

It answers the MASC paper's question (arXiv 2606.02920, §5): how much compute does each method need to reach a
good forget/retain trade-off, and does it know when it got there?

* The region is defined against a model that never trained on the forget set (the retain-only model, learned the
  same way without the forget authors): the forget answers are reproduced no more than that model reproduces them
  (forget ROUGE-L recall <= its + ``forget_rouge_tolerance``), they are as recognisable to every membership attack
  as that model finds them (each attack's AUC of the forget answers against never-learned holdout authors' answers,
  given the questions, within ``membership_tolerance`` of the never-trained model's: MUSE's PrivLeak near 0), and
  the kept side holds (:mod:`hf_unlearn.jobs.compare_region`). TOFU's forget quality is reported, not used: with 20
  forget questions its KS test already fails to tell the target model from the never-trained one on some machines
  (p = 0.081 on the AMD EPYC of the README).
* Baselines run the way a practitioner runs them: a fixed budget of ``epochs`` at each learning rate of a grid,
  with the metrics measured after every epoch. A run lands in the region at the end of its budget, or at some
  epoch (what checkpoint selection would find). Time to the region is training plus evaluation up to the first
  epoch inside it.
* MASC runs once per seed at ``UnlearnConfig``'s learning rate (``masc_learning_rates`` for a grid): it promises
  one run with no grid and no checkpoint selection. Each run stops itself (with the benchmark's calibration authors
  unless ``calibrate`` is off); it lands when the state it stopped at is in the region, and its time is its wall
  clock until the stop, probes included (it needs no evaluation to decide).
* Every (learning rate, seed) pair is run. Per method: how many runs land, the learning rate where most seeds land
  (ties: the faster), the mean time to the region there, and the grid cost (one seed's whole grid, averaged).
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.utils import logging

from ..evaluation.bundle import measure_qa_sets, qa_attack_scores, real_knowledge_utility
from ..evaluation.fluency import answer_fluency, fluent_like
from ..evaluation.membership import ATTACKS, membership_auc
from ..objectives.masc.options import CALIBRATED_MODE
from ..training.choices import BASELINES
from ..training.config import UnlearnConfig
from .compare_region import build_region, in_region, region_misses
from .compare_report import compare_table, write_compare
from .models import build_trainer

logger = logging.get_logger(__name__)


class _EpochEvaluator(TrainerCallback):
    """Measure forget and retain metrics after every epoch; the time spent counts towards the run."""

    def __init__(self, measure, start: float, show: Any = None) -> None:
        self.measure = measure
        self.start = start
        self.show = show  # shows the stage in the race's bar
        self.epochs: list[dict[str, Any]] = []
        self.measure_seconds = 0.0

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if self.show is not None:
            self.show(f"measuring epoch {round(state.epoch or 0)}")
        began = time.perf_counter()
        # With fluency where the benchmark measures it: it is part of the region, so checkpoint selection needs it.
        row = self.measure(model)
        self.measure_seconds += time.perf_counter() - began
        row.update(epoch=round(state.epoch or 0), step=state.global_step, seconds=time.perf_counter() - self.start)
        self.epochs.append(row)


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """``["retain_weight=3", "masc_threshold=rho"]`` -> UnlearnConfig keyword arguments, each value
    typed by its field (``none`` for an optional field's None); a key that is not a field is an error naming it."""
    import dataclasses
    import typing

    fields = {f.name: f for f in dataclasses.fields(UnlearnConfig)}
    hints = typing.get_type_hints(UnlearnConfig)
    parsed: dict[str, Any] = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        if not sep or key not in fields:
            raise ValueError(f"--masc_overrides takes UnlearnConfig key=value pairs; {item!r} is not one.")
        kinds = [k for k in typing.get_args(hints[key]) or (hints[key],) if k is not type(None)]
        if text.lower() == "none" and type(None) in typing.get_args(hints[key]):
            parsed[key] = None
        elif kinds[0] is bool:
            if text.lower() not in ("true", "false"):
                raise ValueError(f"--masc_overrides {key} takes true or false, got {text!r}.")
            parsed[key] = text.lower() == "true"
        elif kinds[0] in (int, float):
            try:
                parsed[key] = kinds[0](text)
            except ValueError:
                raise ValueError(f"--masc_overrides {key} takes a number, got {text!r}.") from None
        else:
            parsed[key] = text
    return parsed


def save_partial(output_dir: str, region: dict, runs: dict) -> None:
    """The runs finished so far, in ``compare_partial.json``: a long comparison (hours on a CPU) that is stopped
    keeps what it measured."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, "compare_partial.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"region": region, "runs": runs}, f, indent=2)
    os.replace(path + ".tmp", path)


def lm_eval_scorer(cli: Any) -> Any:
    """``score(model, tokenizer) -> {task: {metric: value}}`` through lm-evaluation-harness, or ``None`` without
    ``--lm_eval_tasks``; the tasks are checked here, before any work."""
    if not cli.lm_eval_tasks:
        return None
    import tempfile

    from ..evaluation.utility import LmEvalSettings, check_lm_eval_tasks, lm_eval_utility, write_tofu_tasks

    include = []
    if cli.lm_eval_tofu_dir:
        include.append(write_tofu_tasks(cli.lm_eval_tofu_dir, tempfile.mkdtemp(prefix="hf-unlearn-lm-eval-")))
    settings = LmEvalSettings(tasks=list(cli.lm_eval_tasks), include_path=include, limit=cli.lm_eval_limit)
    manager = check_lm_eval_tasks(settings)

    def score(model: Any, tokenizer: Any) -> dict[str, Any]:
        result = lm_eval_utility(model, tokenizer, settings, task_manager=manager)
        return {**result["tasks"], "seconds": result["seconds"]}

    return score


def nf4_forget_check(model: Any, tokenizer: Any, forget_records: Any, full_precision: dict) -> dict:
    """The forget set's ROUGE-L recall and probability after reloading ``model`` in NF4 (bitsandbytes), beside full
    precision: does the forgetting survive 4-bit quantization (MASC's claim, where NPO's comes back)?"""
    from ..robustness.quantize import check_quantization_robustness

    keys = ("rouge_l_recall", "probability", "exact_match", "num_examples")
    checked = check_quantization_robustness(
        model, tokenizer, forget_records, None, modes=("nf4",),
        full_precision={"forget": {k: full_precision[k] for k in keys}},
    )  # fmt: skip
    nf4 = checked["nf4"]
    return {
        "forget_rouge_l_recall": nf4["forget"]["rouge_l_recall"],
        "forget_probability": nf4["forget"]["probability"],
        "rouge_l_change": nf4["change"]["forget"]["rouge_l_recall"],
        "knowledge_returned": nf4["knowledge_returned"],
        "quantized_layers": nf4["quantized_layers"],
    }


def summarize_runs(runs: list[dict], landed_key: str, time_key: str) -> dict:
    """Per method, over its (lr, seed) runs: how many land, the lr where most seeds land (ties: the faster mean
    time), the mean time to the region there, and the cost of one seed's whole grid."""
    rates = sorted({run["learning_rate"] for run in runs})
    seeds = sorted({run["seed"] for run in runs})

    def score(lr: float) -> tuple[int, float]:
        landed = [run for run in runs if run["learning_rate"] == lr and run[landed_key]]
        times = [run[time_key] for run in landed]
        return len(landed), -(statistics.mean(times) if times else float("inf"))

    best = max(rates, key=score)
    landed_at_best = [run for run in runs if run["learning_rate"] == best and run[landed_key]]
    grid = [sum(run["seconds"] for run in runs if run["seed"] == seed) for seed in seeds]
    single = [run["seconds"] for run in runs if run["learning_rate"] == best]
    shown = next(iter(landed_at_best), None) or next(run for run in runs if run["learning_rate"] == best)
    return {
        "runs": len(runs),
        "landed": sum(run[landed_key] for run in runs),
        "best_learning_rate": best,
        "seeds_landed_at_best": len(landed_at_best),
        "time_to_region_seconds": statistics.mean(run[time_key] for run in landed_at_best) if landed_at_best else None,
        "grid_seconds": statistics.mean(grid),
        "single_run_seconds": statistics.mean(single),
        "shown": {
            key: shown[key]
            for key in ("learning_rate", "seed", "forget", "retain", "steps", "real_knowledge")
            if key in shown
        },
    }


@dataclass
class CompareSetting:
    """What every run of a comparison shares: the target model (its weights copied into each run), the never-trained
    reference, the tokenized forget/retain/calibration sets, and the records measured after each epoch."""

    target_model: Any
    tokenizer: Any
    reference_model: Any
    reference_tokenizer: Any
    forget: Any
    retain: Any
    calibration: Any
    forget_records: Any
    retain_eval: Any
    holdout_records: Any
    reference_ratios: list[float] | None
    peft_config: Any
    learn_info: dict[str, Any]
    description: dict[str, Any]
    real_knowledge: dict[str, Any] = field(default_factory=dict)
    measure_fluency: bool = False
    calibration_records: Any = None

    def reference_check(self) -> dict[str, float] | None:
        """Whether the calibrated stop aims where the region is: under the never-trained model, the Min-K% AUC of
        the forget answers against the calibration authors' (0.5: the calibration set, the stop's never-seen
        reference, reads as familiar as the forget set does to a model that never saw it) and of the calibration
        against the holdout authors' (the attack's non-members). None without calibration records."""
        if self.calibration_records is None:
            return None
        model, tokenizer = self.reference_model, self.reference_tokenizer
        forget, calibration, holdout = (
            qa_attack_scores(model, tokenizer, records)
            for records in (self.forget_records, self.calibration_records, self.holdout_records)
        )  # each set scored once, the calibration set read against both
        return {
            "forget_vs_calibration_auc": membership_auc(forget, calibration),
            "calibration_vs_holdout_auc": membership_auc(calibration, holdout),
        }

    def measure(self, model: Any, tokenizer: Any = None, with_fluency: bool | None = None) -> dict:
        """:func:`measure_for_region` on this setting's sets; ``with_fluency`` defaults to ``measure_fluency``."""
        with_fluency = self.measure_fluency if with_fluency is None else with_fluency
        return measure_for_region(
            model, tokenizer or self.tokenizer, self.forget_records, self.retain_eval, self.holdout_records,
            target_model=self.target_model, fluency_reference=self.reference_model if with_fluency else None,
            retain_only_truth_ratios=self.reference_ratios, real_knowledge=self.real_knowledge,
        )  # fmt: skip


def measure_for_region(
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any,
    holdout: Any,
    target_model: Any,
    fluency_reference: Any = None,
    retain_only_truth_ratios: list[float] | None = None,
    real_knowledge: dict[str, Any] | None = None,
) -> dict:
    """One model measured the way compare's region reads it (:func:`~.compare_region.region_misses`): forget/retain
    metrics with every membership attack against the ``holdout`` authors' answers, the reference attack's reference
    being the ``target_model`` (the model an attacker who had it would compare with); with ``real_knowledge`` (TOFU),
    the real-knowledge utility; with ``fluency_reference`` (the never-trained model), the forget answers' fluency
    under it, read from the answers the forget ROUGE-L scored (no second generation)."""
    with_fluency = fluency_reference is not None
    row = measure_qa_sets(
        model, tokenizer, {"forget": forget, "retain": retain}, forget_set="forget",
        retain_only_truth_ratios=retain_only_truth_ratios, membership_holdout=holdout,
        return_predictions=with_fluency, membership_attacks=ATTACKS, attack_reference_model=target_model,
    )  # fmt: skip
    if real_knowledge:
        row["real_knowledge"] = real_knowledge_utility(model, tokenizer, real_knowledge)
    if with_fluency:
        answers = row["forget"].pop("predictions")
        row["retain"].pop("predictions", None)
        row["forget"]["fluency"] = answer_fluency(model, tokenizer, forget, reference_model=fluency_reference,
                                                  answers=answers)  # fmt: skip
    return row


class Race:
    """One race's shared state: the target's weights, the region (measured once), the settings every run gets, and
    the one run builder both the MASC and the baseline runs go through (:meth:`train`)."""

    def check_reference(self, check: dict[str, float] | None) -> None:
        """Record :meth:`CompareSetting.reference_check` with the region, and say when the calibration authors read
        further from the forget authors than the membership tolerance: MASC's calibrated stop ends the forget set
        near its calibration set, so its membership AUC then lands by chance (docs/studies/masc_landing.md, §6)."""
        if check is None:
            return
        self.region["calibration_reference"] = check
        off = abs(check["forget_vs_calibration_auc"] - 0.5)
        if off > self.region["membership_tolerance"]:
            logger.warning(
                "hf-unlearn compare: to the never-trained model the calibration authors read "
                f"{'more' if check['forget_vs_calibration_auc'] > 0.5 else 'less'} familiar than the forget authors "
                f"(Min-K% AUC {check['forget_vs_calibration_auc']:.3f}, 0.5 = alike): MASC's calibrated stop aims at "
                "the calibration set, so whether it ends inside the membership region depends on that difference."
            )

    def __init__(self, cli: Any, setting: CompareSetting, lm_eval: Any = None) -> None:
        self.cli, self.setting, self.lm_eval = cli, setting, lm_eval
        self.state = {k: v.clone() for k, v in setting.target_model.state_dict().items()}
        with tqdm(total=2, desc="hf-unlearn compare: the region", unit="model") as region_bar:
            region_bar.set_postfix_str("measuring the target")
            self.before = setting.measure(setting.target_model)
            if lm_eval is not None:
                self.before["lm_eval"] = lm_eval(setting.target_model, setting.tokenizer)
            region_bar.update()
            region_bar.set_postfix_str("measuring the never-trained model")
            self.never_trained = setting.measure(setting.reference_model, setting.reference_tokenizer)
            if lm_eval is not None:
                self.never_trained["lm_eval"] = lm_eval(setting.reference_model, setting.reference_tokenizer)
            region_bar.update()
        self.region = build_region(self.before, self.never_trained, cli)
        self.region["never_trained_misses"] = region_misses(self.never_trained, self.region)
        self.check_reference(setting.reference_check())
        if self.region["never_trained_misses"]:
            logger.warning(
                "hf-unlearn compare: the never-trained model lies outside its own region "
                f"({self.region['never_trained_misses']}): the region cannot tell a model that never saw the forget "
                "set from one that did; widen the tolerances."
            )
        self.common = dict(
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            logging_strategy="no",
            per_device_train_batch_size=cli.per_device_train_batch_size,
        )
        self.masc_options = {
            **(CALIBRATED_MODE if cli.calibrate else {}),  # ours, asked for by name (the paper's mode without)
            **parse_overrides(cli.masc_overrides),
            **{
                key: value
                for key, value in (
                    ("probe_interval", cli.masc_probe_interval),
                    ("probe_size", cli.masc_probe_size),
                    ("self_stop_max_steps", cli.masc_max_steps),
                )
                if value is not None
            },
        }
        self.epochs = cli.epochs if cli.epochs is not None else setting.description["epochs"]
        self.progress: Any = None
        self.label = ""  # the run under way, as the race's bar shows it

    def fresh_model(self) -> Any:
        model = type(self.setting.target_model)(self.setting.target_model.config)
        model.load_state_dict(self.state)
        return model

    def train(self, method: str, lr: float, seed: int, options: dict, calibration: Any = None, callbacks=None) -> Any:
        """One run: a fresh copy of the target trained with ``method`` at ``lr`` and ``seed`` (``options``: its other
        UnlearnConfig settings) in ``output_dir/runs/<method>-<lr>-seed<seed>``, shown in the race's progress bar;
        returns the trainer."""
        self.label = label = f"{method} lr={lr:g} seed={seed}"
        self.progress.set_postfix_str(label)
        folder = os.path.join(self.cli.output_dir, "runs", f"{method}-{lr:g}-seed{seed}")
        args = UnlearnConfig(
            output_dir=folder, overwrite_output_dir=True, method=method, learning_rate=lr, seed=seed, **options,
            **self.common,
        )  # fmt: skip
        setting = self.setting
        trainer = build_trainer(
            self.fresh_model(), setting.tokenizer, args, setting.forget, setting.retain, calibration,
            setting.peft_config, callbacks=callbacks, progress=(self.progress, label),
        )  # fmt: skip
        trainer.train()
        if self.cli.save_models:
            trainer.save_model()  # the weights with the run's record and card, as `hf-unlearn run` leaves them
        self.progress.set_postfix_str(f"{label}: measuring")
        return trainer

    def finish(self, model: Any, row: dict) -> dict:
        """The final model's extra checks: fluency (TOFU) and NF4 (when asked)."""
        setting, tokenizer, extra = self.setting, self.setting.tokenizer, {}
        if setting.measure_fluency and "fluency" not in row["forget"]:
            row["forget"]["fluency"] = answer_fluency(
                model, tokenizer, setting.forget_records, reference_model=setting.reference_model
            )
        if setting.measure_fluency:
            # the NLL level of fluent answers the never-trained model did not write: the target's, before unlearning
            extra["fluent"] = fluent_like(
                row["forget"]["fluency"], self.never_trained["forget"]["fluency"],
                fluent_nll=self.before["forget"]["fluency"].get("reference_nll"),
                levels=self.region.get("fluency_levels"),
            )  # fmt: skip
        if self.lm_eval is not None:
            extra["lm_eval"] = self.lm_eval(model, tokenizer)
        if self.cli.quantization_check:
            self.progress.set_postfix_str(f"{self.label}: NF4 check")
            start = time.perf_counter()
            extra["nf4"] = nf4_forget_check(model, tokenizer, setting.forget_records, row["forget"])
            extra["nf4"]["seconds"] = time.perf_counter() - start
        return extra

    def masc_run(self, lr: float, seed: int) -> dict:
        """A MASC run, stopping itself; it lands when the state it stopped at is in the region."""
        trainer = self.train("masc", lr, seed, self.masc_options, calibration=self.setting.calibration)
        record = trainer.record
        start = time.perf_counter()
        row = self.setting.measure(trainer.model)
        measure_seconds = time.perf_counter() - start
        return {
            "learning_rate": lr,
            "seed": seed,
            "seconds": record.wall_seconds,
            "probe_seconds": record.probe_seconds,
            "probe_seconds_by_set": record.probe_seconds_by_set,
            "measure_seconds": measure_seconds,
            "steps": record.global_step,
            "stop_kind": record.stop_kind,
            "stop_reason": record.stop_reason,
            # where the stop fired: every probe's forget / never-seen / retain readings
            "probe_history": record.probe_history,
            "landed": record.stop_kind == "target" and in_region(row, self.region),
            "misses": region_misses(row, self.region),
            **row,
            **self.finish(trainer.model, row),
        }

    def baseline_run(self, method: str, lr: float, seed: int) -> dict:
        """A baseline run: a fixed budget of epochs, measured after each; it lands at the end or at some epoch."""
        start = time.perf_counter()
        evaluator = _EpochEvaluator(
            self.setting.measure, start, show=lambda stage: self.progress.set_postfix_str(f"{self.label}: {stage}")
        )
        options = dict(num_train_epochs=self.epochs, probe_interval=0, stop_at_target=False)
        trainer = self.train(method, lr, seed, options, callbacks=[evaluator])
        first = next((row for row in evaluator.epochs if in_region(row, self.region)), None)
        final = evaluator.epochs[-1]
        seconds = time.perf_counter() - start
        return {
            "learning_rate": lr,
            "seed": seed,
            "seconds": seconds,
            "measure_seconds": evaluator.measure_seconds,
            "steps": final["step"],
            "landed_at_end": in_region(final, self.region),
            "misses": region_misses(first or final, self.region),
            "landed_at_some_epoch": first is not None,
            "time_to_region_seconds": first["seconds"] if first else None,
            "forget": (first or final)["forget"],
            "retain": (first or final)["retain"],
            **({"real_knowledge": (first or final)["real_knowledge"]} if "real_knowledge" in final else {}),
            "epochs": evaluator.epochs,
            # at the budget's end: the model a fixed-budget run hands over
            **self.finish(trainer.model, final),
        }


def default_learning_rate() -> float:
    """``UnlearnConfig``'s learning rate, MASC's one rate in a comparison unless ``--masc_learning_rates`` is given."""
    return UnlearnConfig.__dataclass_fields__["learning_rate"].default


def race(cli: Any, setting: CompareSetting, lm_eval: Any = None) -> dict:
    """Every method at every learning rate and seed from the same target (module docstring); ``lm_eval`` a scorer
    from :func:`lm_eval_scorer`, or ``None``."""
    state = Race(cli, setting, lm_eval)
    masc_rates = (cli.masc_learning_rates or [default_learning_rate()]) if cli.masc else []
    baselines = [m for m in cli.methods if m != "none"]
    total = len(cli.seeds) * (len(masc_rates) + len(baselines) * len(cli.learning_rates))
    state.progress = tqdm(total=total, desc="hf-unlearn compare", unit="run")
    methods: dict[str, dict] = {}
    runs: dict[str, list[dict]] = {"masc": []} if masc_rates else {}
    grid = [("masc", lr) for lr in masc_rates] + [(m, lr) for m in baselines for lr in cli.learning_rates]
    for method, lr in grid:
        for seed in cli.seeds:
            run = state.masc_run(lr, seed) if method == "masc" else state.baseline_run(method, lr, seed)
            runs.setdefault(method, []).append(run)
            state.progress.update()
            save_partial(cli.output_dir, state.region, runs)
    for method in runs:
        if method == "masc":
            methods["masc"] = summarize_runs(runs["masc"], "landed", "seconds")
        else:
            methods[method] = summarize_runs(runs[method], "landed_at_some_epoch", "time_to_region_seconds")
            methods[method]["landed_at_end"] = sum(run["landed_at_end"] for run in runs[method])
    state.progress.close()
    result = {
        "benchmark": cli.benchmark,
        "region": state.region,
        "methods": methods,
        "runs": runs,
        "epochs": state.epochs,
        "seeds": cli.seeds,
        "learning_rates": cli.learning_rates,
        "masc_learning_rates": masc_rates,
        "masc_options": state.masc_options,
        "calibrate": cli.calibrate,
        **{k: v for k, v in setting.description.items() if k != "epochs"},
        "target_model": {
            k: v
            for k, v in setting.learn_info.items()
            if k in ("epochs", "exact_match", "rouge_l_recall", "num_parameters", "seconds", "cached", "authors")
        },
    }
    write_compare(result, cli.output_dir)
    print("\n" + compare_table(result))
    return result


__all__ = [
    "BASELINES",
    "CompareSetting",
    "build_region",
    "in_region",
    "parse_overrides",
    "region_misses",
    "race",
    "summarize_runs",
]
