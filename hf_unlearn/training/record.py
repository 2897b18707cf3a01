"""The record of one unlearning run: what was forgotten, how, when it stopped and why, and what it cost.

:class:`UnlearnRecord` is produced by :class:`~hf_unlearn.UnlearnTrainer` (a partial one with every checkpoint, the
final one once at the end of training) and saved next to the model as ``unlearn_record.json``. The report, the
model card, the quantization check and the command line read it; none of them reaches into the trainer or runs
the model again. Measurements made outside training (before/after metrics, the quantization check) are added to
it with :meth:`UnlearnRecord.update`. This module imports nothing else of the package: it is plain data.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

RECORD_FILE = "unlearn_record.json"


@dataclass
class UnlearnRecord:
    """One unlearning run, as data (JSON-serialisable).

    Attributes:
        method: the ``UnlearnConfig.method``; ``forget_objective`` / ``retain_objective`` what it resolved to
            (``"none"``: no retain term).
        gradient_surgery: how the two gradients were combined (``"sum"``: the weighted sum of the losses).
        hyperparameters: the training settings that shape the run, then each objective's own (from its
            registration), then the stopping rule's when it was on.
        papers: ``{"title", "url", "authors"}`` of every method that shaped the run; beyond_paper: the run's
            settings that depart from those papers, in words (the objectives' and the stopping rule's).
        base_model: the model's ``name_or_path``: a Hub id, or a local folder by its absolute path
            (:mod:`hf_unlearn.training.base_model`); ``adapter``: the PEFT method (``"lora"``) when adapters were
            trained, else ``None``.
        base_model_weights: file name -> SHA-256 of each weights file of a local base (``None`` for a Hub id), written
            when the run is saved: what a LoRA adapter's base must hold.
        forget_dataset / retain_dataset: ``{"name", "num_examples"}`` (``name`` ``None`` when unknown), the forget
            one with ``num_trained`` and ``num_held_out`` (examples kept out of training for the stopping probe).
        calibration_dataset: ``{"name", "num_examples"}`` of the never-trained examples a calibrated stopping rule
            compared the forget set with.
        stopped_early: whether the stopping rule ended the run by reaching its target.
        stop_kind: how the run ended: ``"target"`` (the stopping rule's target reached), ``"utility_floor"`` (a
            failure: the retain side fell through the floor), ``"budget"`` (every step ran), ``"other"``.
        stop_reason: the same in words, with the numbers; stop_step: the probe step that stopped it.
        restored_step: the step whose weights the model was put back to (after a utility-floor failure); ``None``
            when the model is the last step's.
        global_step / max_steps: optimizer steps taken and the budget.
        violation_rate: the last probed violation rate of the stopping probe.
        probe_history: every probe (step 0 = the start), violation rates and answer probabilities.
        surgery_history: the logged gradient-surgery statistics (cosines, conflict fraction) per logging step.
        exact_reproduction_bound: MASC Proposition 1 over the trained forget examples at the end (``mean``,
            ``max``, ``violation_rate``, ``rho``, ``k``); ``None`` in a checkpoint's record.
        wall_seconds: training time of the ``train()`` call that finished the run, probes included; probe_seconds:
            the part of it spent in probes; probe_seconds_by_set: that part per probe set (``train``, ``holdout``,
            ``calibration``, ``retain``; a running 'train' probe costs no forward and is absent).
        complete: ``False`` for the record saved with a checkpoint, while training goes on.
        before / after: per split (``forget``, ``retain``) metric dicts, when measured (TOFU's ROUGE-L recall,
            probability, exact match and truth ratio; open-unlearning's exact memorisation and extraction strength).
        evaluation: evaluation summaries (e.g. forget quality, model utility) ``{"before": ..., "after": ...}``.
        lm_eval: utility on standard benchmarks through lm-evaluation-harness, ``{"before": ..., "after": ...}``, each
            the result of :func:`hf_unlearn.evaluation.utility.lm_eval_utility` (``{"tasks": {task: {metric: value}},
            "settings", "lm_eval_version", "seconds"}``); ``hf-unlearn eval`` / ``audit`` of a saved run put theirs
            under ``"after"`` (the saved model is the unlearned one). Empty when not measured.
        quantization: the result of :func:`hf_unlearn.robustness.quantize.check_quantization_robustness`, when run.
        relearning: the result of :func:`hf_unlearn.robustness.relearn.check_relearning_robustness`, when run.
        audit: the verdicts of :func:`hf_unlearn.robustness.audit.run_audit` (and its membership part), when run.
        distillation: the result of :func:`hf_unlearn.robustness.distill.distill_into_perturbed` (UNDO: the saved
            model is a noised copy of the unlearned one distilled to it), when run (``hf-unlearn distill``).
        extra: anything else a job records (benchmark, split, target model).
        forget_fingerprint: ``sha256:...`` of the forget set's content (:func:`hf_unlearn.training.ledger.
            forget_set_fingerprint`), what the request ledger names the request by.
        finished_at: when training ended (UTC, ISO 8601); ``None`` in a checkpoint's record.
        earlier_requests: the ledger entries of the unlearning requests the model had gone through before this run
            (read from the folder it was loaded from; :mod:`hf_unlearn.training.ledger`).
        objective_state: the state stateful objectives ended with, by objective (PDU: the dual variable ``dual``,
            the bound ``epsilon`` it used, ``updates``).
    """

    method: str
    forget_objective: str
    retain_objective: str
    gradient_surgery: str = "sum"
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    papers: list[dict[str, str]] = field(default_factory=list)
    beyond_paper: list[str] = field(default_factory=list)
    base_model: str | None = None
    base_model_weights: dict[str, str] | None = None
    adapter: str | None = None
    forget_dataset: dict[str, Any] | None = None
    retain_dataset: dict[str, Any] | None = None
    calibration_dataset: dict[str, Any] | None = None
    stopping_rule: bool = False
    stopped_early: bool = False
    stop_kind: str | None = None
    stop_reason: str = ""
    stop_step: int | None = None
    restored_step: int | None = None
    global_step: int = 0
    max_steps: int = 0
    violation_rate: float | None = None
    probe_history: list[dict[str, Any]] = field(default_factory=list)
    surgery_history: list[dict[str, Any]] = field(default_factory=list)
    exact_reproduction_bound: dict[str, Any] | None = None
    wall_seconds: float | None = None
    probe_seconds: float = 0.0
    probe_seconds_by_set: dict[str, float] = field(default_factory=dict)
    complete: bool = False
    before: dict[str, dict[str, Any]] = field(default_factory=dict)
    after: dict[str, dict[str, Any]] = field(default_factory=dict)
    evaluation: dict[str, Any] = field(default_factory=dict)
    lm_eval: dict[str, dict[str, Any]] = field(default_factory=dict)
    quantization: dict[str, Any] | None = None
    relearning: dict[str, Any] | None = None
    audit: dict[str, Any] | None = None
    distillation: dict[str, Any] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    forget_fingerprint: str | None = None
    finished_at: str | None = None
    earlier_requests: list[dict[str, Any]] = field(default_factory=list)
    objective_state: dict[str, Any] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """False when the run ended as a failure (the utility floor)."""
        return self.stop_kind != "utility_floor"

    def update(self, **values: Any) -> UnlearnRecord:
        """Set fields by name (an unknown name is an error that names it); returns the record."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise AttributeError(f"UnlearnRecord has no field {', '.join(unknown)}; fields: {sorted(known)}.")
        for name, value in values.items():
            setattr(self, name, value)
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> UnlearnRecord:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def save(self, output_dir: str) -> str:
        """Write ``unlearn_record.json`` into ``output_dir``; returns its path."""
        os.makedirs(output_dir, exist_ok=True)
        path = os.path.join(output_dir, RECORD_FILE)
        with open(path, "w") as f:
            json.dump(self.to_dict(), f, indent=2)
        return path

    @classmethod
    def load(cls, path: str) -> UnlearnRecord:
        """Read a record from ``unlearn_record.json`` or the folder holding it."""
        if os.path.isdir(path):
            path = os.path.join(path, RECORD_FILE)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No unlearning record at {path!r}: it is written by UnlearnTrainer.save_model().")
        with open(path) as f:
            return cls.from_dict(json.load(f))


def dataset_description(dataset: Any, num_examples: int | None = None) -> dict[str, Any]:
    """Name (when the dataset knows it: a Hub dataset's name and config) and size, for the run record."""
    info = getattr(dataset, "info", None)
    name = getattr(info, "dataset_name", None) if info is not None else None
    config_name = getattr(info, "config_name", None) if info is not None else None
    if name and config_name and config_name != "default":
        name = f"{name} / {config_name}"
    return {"name": name, "num_examples": len(dataset) if num_examples is None else num_examples}


def run_datasets(forget: Any, retain: Any, calibration: Any, trained: Any, held_out: Any) -> dict[str, Any]:
    """The record's ``datasets``: each dataset's description, and how many forget examples were trained on and held
    out (``trained`` / ``held_out``: their indices)."""
    return {
        "forget_dataset": {**dataset_description(forget), "num_trained": len(trained), "num_held_out": len(held_out)},
        "retain_dataset": dataset_description(retain) if retain is not None else None,
        "calibration_dataset": dataset_description(calibration) if calibration is not None else None,
    }


__all__ = ["RECORD_FILE", "UnlearnRecord", "dataset_description", "run_datasets"]
