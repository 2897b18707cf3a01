"""What the stopping rule measures, and the weights it may keep: one object the trainer and the stopping callback
share. The trainer feeds it the forget batches' own logits while training (the running 'train' probe, MASC §3: the
violation rate of the examples just trained on, at the weights that trained on them); the stopping callback calls
:meth:`probe` every ``probe_interval`` optimizer steps and hands it the states to keep (the last above the utility
floor, the first that met the target). Measurements use the one restricted-margin implementation with the run's k,
competitor source and rho, so the loss, the stopping rule and the record's exact-reproduction bound agree on what a
violation is."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import torch
from torch import nn
from transformers.utils import logging

from ...data.pairing import model_inputs
from ...scores import (
    answer_probabilities,
    leave_out_final,
    membership_auc,
    min_k_per_example,
    probabilities_of,
    shift_for_causal_lm,
    token_log_probs,
)
from .calibration import NeverSeenLevels, calibration_gap, prompt_copies, spread_by_id, token_levels
from .margin import exact_reproduction_bound, measure_violations, restricted_margin, violation_fractions
from .probe_checkpoint import ProbeCheckpointing

logger = logging.get_logger(__name__)


def has_dropout(model: nn.Module) -> bool:
    """Whether training-mode forwards are random (dropout modules, or attention/residual dropout in the config)."""
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in model.modules()):
        return True
    config = getattr(model, "config", None)
    values = config.to_dict().items() if config is not None and hasattr(config, "to_dict") else []
    return any(
        ("dropout" in key or "pdrop" in key) and isinstance(value, (int, float)) and value > 0
        for key, value in values
        if not key.startswith("classifier")
    )


def runs_from_training_forwards(args: Any, forget_objective: Any, model: nn.Module) -> bool:
    """Whether the 'train' probe can come from the forget batches' own forwards, where that equals an eval-mode probe:
    no dropout, and teacher competitors only when the objective brings the teacher's logits."""
    running = (
        bool(args.running_probe)
        and args.probe_interval > 0
        and (args.competitor_source == "self" or forget_objective.needs_reference(args))
    )
    if running and has_dropout(model):
        logger.info("UnlearnTrainer: the model has dropout, so the probes run extra eval-mode forwards.")
        return False
    return running


@dataclass
class ProbeSets:
    """The fixed examples of every probe, chosen at construction: a sample of the trained forget examples, the
    held-out forget examples (never trained on), a retain sample (the utility floor) and a calibration sample (data of
    the same kind never trained on: the calibrated target)."""

    train: list[dict[str, Any]]
    holdout: list[dict[str, Any]]
    retain: list[dict[str, Any]]
    calibration: list[dict[str, Any]]
    #: every token id the trained forget answers score (``calibration_match='token'``: the ids they share)
    forget_ids: torch.Tensor = dataclass_field(default_factory=lambda: torch.empty(0, dtype=torch.long))

    @classmethod
    def sample(
        cls,
        trained: Sequence[Mapping[str, Any]],
        held_out: Sequence[tuple[int, Mapping[str, Any]]],
        retain: Sequence[Mapping[str, Any]] | None,
        calibration: Sequence[Mapping[str, Any]] | None,
        size: int,
        seed: int,
        score: Callable[[dict[str, Any], int], dict[str, Any]],
        calibration_size: int | None = None,
    ) -> ProbeSets:
        """Up to ``size`` examples of each set (``calibration_size`` of the calibration set when given; seeded, in
        their order), the forget-like ones through ``score`` (the fixed continuation cut of
        ``forget_scoring='continuation'``, seeded by the example's index, else unchanged); every held-out forget
        example (``(index in the forget set, example)`` pairs)."""
        scored = sorted({t for i, e in enumerate(trained) for t in score(model_inputs(e), i)["labels"] if t >= 0})
        return cls(
            forget_ids=torch.tensor(scored, dtype=torch.long),
            train=[score(e, i) for i, e in enumerate(_sample(trained, size, seed))],
            holdout=[score(model_inputs(e), i) for i, e in held_out],
            retain=_sample(retain, size, seed + 1) if retain is not None else [],
            calibration=(
                [score(e, i) for i, e in enumerate(_sample(calibration, calibration_size or size, seed + 2))]
                if calibration is not None
                else []
            ),
        )


#: calibration_reference='start' measures the calibration set once, so it reads up to this many times probe_size of
#: it: a probe_size sample of a few authors' answers moves the reference's Min-K% AUC by about the region's
#: tolerance (docs/studies/masc_landing.md, sections 13-14).
START_REFERENCE_SIZE_FACTOR = 16


def calibration_sample_size(args: Any) -> int:
    """How many calibration answers the probes measure: every one up to ``START_REFERENCE_SIZE_FACTOR`` x
    ``probe_size`` when they are measured once (``calibration_reference='start'``), else ``probe_size`` (they are
    measured again during the run)."""
    if args.calibration_reference == "start":
        return args.probe_size * START_REFERENCE_SIZE_FACTOR
    return args.probe_size


def _sample(dataset: Sequence[Mapping[str, Any]], size: int, seed: int) -> list[dict[str, list[int]]]:
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    return [model_inputs(dataset[i]) for i in sorted(order[:size])]


class ProbeState(ProbeCheckpointing):
    """Probes, running sums, the calibration margins and the kept weight states of one run.

    ``model`` returns the unwrapped model being trained, ``trainable`` its trainable parameters as the optimizer steps
    them, ``reference_logits`` the frozen start model's logits of a batch (for teacher competitors). ``running``: the
    'train' probe comes from the forget batches' own forwards (:meth:`accumulate`) instead of an extra forward.
    """

    def __init__(
        self,
        args: Any,
        sets: ProbeSets,
        pad_token_id: int,
        accelerator: Any,
        model: Callable[[], nn.Module],
        trainable: Callable[[], list[torch.Tensor]],
        reference_logits: Callable[[Mapping[str, torch.Tensor]], torch.Tensor],
        running: bool,
        calibrated: bool,
        can_snapshot: bool,
        min_k_leaves_out: int | None = None,
    ) -> None:
        self.args = args
        self.sets = sets
        self.pad_token_id = pad_token_id
        self.accelerator = accelerator
        self._model = model
        self._trainable = trainable
        self._reference_logits = reference_logits
        self.running = running
        self.calibrated = calibrated
        self.can_snapshot = can_snapshot
        self.running_sums: dict[str, torch.Tensor] = {}
        self.running_margins: list[torch.Tensor] = []  # forget margins since the last probe (calibrated target)
        self.running_tokens: list[torch.Tensor] = []  # and their token ids
        self.running_copied: list[torch.Tensor] = []  # and whether their prompt holds them ('prompt' matching)
        # The Min-K% stop (calibration_auc_slack) reads the forget answers trained on: their scores since the last
        # probe, and the last probe_size of them (across probes), the sample its AUC is read on.
        self.reads_membership = calibrated and args.calibration_auc_slack is not None
        self.min_k_leaves_out = min_k_leaves_out  # the appended EOS, which the evaluation's attack does not score
        self.running_min_k: list[torch.Tensor] = []
        self.recent_min_k = torch.zeros(0, dtype=torch.float64)
        # calibration_match='token'/'prompt'/'token_spread': what the ids the forget answers share are matched with
        self.calibration_levels: NeverSeenLevels | None = None
        self.calibration_margins: torch.Tensor | None = None  # sorted, on the device: the calibrated threshold's
        self.calibration_latest: dict[str, float] = {}  # the last calibration measurement's rate and probability
        self.calibration_min_k: torch.Tensor | None = None  # its answers' Min-K% (calibration_auc_slack)
        self.probes_since_calibration = 0
        self.start_retain_probability: float | None = None  # the fixed retain sample's, at the first probe
        # Whether the last probe's retain reading was the fixed sample at the current weights (else the screen).
        self.retain_verified = True
        self.latest: dict[str, float] = {}  # the last probe's numbers, for Trainer's next log
        self.seconds = 0.0
        # Seconds per probe set ('train', 'holdout', 'calibration', 'retain'), the split of ``seconds``.
        self.seconds_by_set: dict[str, float] = {}
        self.snapshots: dict[str, tuple[int, list[torch.Tensor]]] = {}
        self.restored_step: int | None = None

    # --- the running 'train' probe ------------------------------------------------------------------------

    @torch.no_grad()
    def accumulate(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        reference_logits: torch.Tensor | None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
    ) -> None:
        """Per-example statistics of a forget batch from its own logits, summed on the device until the next probe:
        [violation fraction, answer probability, examples] (and the token margins, for the calibrated target). They
        are what a probe would measure on these examples in eval mode (no dropout: checked at construction), at the
        weights of the step that trained on them. The retain batches only screen the utility floor
        (:meth:`accumulate_retain`): it needs the current weights and more than one batch to decide (the running retain
        probability lags an update behind and swings far more than a fixed sample: docs/stopping.md)."""
        logits = logits.detach()
        log_probs, mask = token_log_probs(logits, labels)  # one log-softmax for the probability and Min-K%
        probabilities, scored = probabilities_of(log_probs, mask)
        shifted, shifted_labels = shift_for_causal_lm(logits, labels)
        if self.reads_membership:
            min_k = min_k_per_example(log_probs, leave_out_final(mask, shifted_labels, self.min_k_leaves_out))
            self.running_min_k.append(min_k[~torch.isnan(min_k)])
        teacher = None
        if self.args.competitor_source == "teacher":
            teacher, _ = shift_for_causal_lm(reference_logits.detach(), labels)
        margins = restricted_margin(
            shifted,
            shifted_labels,
            k=self.args.masc_k,
            beta=self.args.masc_beta,
            teacher_logits=teacher,
            delta=self.args.competitor_delta,
        )
        fractions, _ = violation_fractions(margins, self.args.masc_tau)
        stats = torch.stack([(fractions * scored).sum(), probabilities.sum(), scored.sum()]).double()
        self.running_sums["forget"] = self.running_sums["forget"] + stats if "forget" in self.running_sums else stats
        if self.calibrated:
            self.running_margins.append(margins.margins[margins.mask].float())
            self.running_tokens.append(shifted_labels[margins.mask])
            if input_ids is not None and self.args.calibration_match == "prompt":
                self.running_copied.append(prompt_copies(input_ids, labels, attention_mask)[:, 1:][margins.mask])

    @torch.no_grad()
    def accumulate_retain(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """[answer probability, examples] of a retain batch from its own training forward, summed on the device:
        the utility floor's screen (``retain_probe='screen'``). It lags an update behind and is noisier than the
        fixed sample (see :meth:`accumulate`), which is why it only decides when the fixed sample is measured."""
        probabilities, scored = answer_probabilities(logits, labels)
        stats = torch.stack([probabilities.sum(), scored.sum()]).double()
        self.running_sums["retain"] = self.running_sums["retain"] + stats if "retain" in self.running_sums else stats

    def _read_running(self) -> dict[str, torch.Tensor]:
        """The running sums since the last probe, summed over processes, then cleared."""
        sums: dict[str, torch.Tensor] = {}
        processes = self.accelerator.num_processes
        if self.running_margins:
            margins, tokens = torch.cat(self.running_margins), torch.cat(self.running_tokens)
            copied = torch.cat(self.running_copied).long() if self.running_copied else torch.zeros_like(tokens)
            if processes > 1:
                margins = self.accelerator.gather(
                    self.accelerator.pad_across_processes(margins, pad_index=float("nan"))
                )
                copied = self.accelerator.gather(self.accelerator.pad_across_processes(copied, pad_index=-1))
                tokens = self.accelerator.gather(self.accelerator.pad_across_processes(tokens, pad_index=-1))
                margins, tokens, copied = margins[~torch.isnan(margins)], tokens[tokens >= 0], copied[copied >= 0]
            sums["forget_margins"], sums["forget_tokens"] = margins.cpu(), tokens.cpu()
            sums["forget_copied"] = copied.bool().cpu()
            self.running_margins, self.running_tokens, self.running_copied = [], [], []
        if self.running_min_k:
            # each process's most recent answers, so that the gathered window is the latest steps of all of them
            min_k = torch.cat(self.running_min_k)[-max(1, self.args.probe_size // processes) :]
            if processes > 1:
                min_k = self.accelerator.gather(self.accelerator.pad_across_processes(min_k, pad_index=float("nan")))
                min_k = min_k[~torch.isnan(min_k)]
            sums["forget_min_k"] = min_k.cpu()
            self.running_min_k = []
        for part, size in (("forget", 3), ("retain", 2)):
            total = self.running_sums.get(part)
            if total is None:
                total = torch.zeros(size, dtype=torch.float64, device=self.args.device)
            if processes > 1:
                total = self.accelerator.reduce(total, reduction="sum")
            sums[part] = total.cpu()
        self.running_sums.clear()
        return sums

    # --- measurements -------------------------------------------------------------------------------------

    @torch.no_grad()
    def measure_margins(
        self, examples: Sequence[Mapping[str, Any]], beta: float | None = None, batch_size: int | None = None
    ) -> dict[str, Any]:
        """Violation fractions, answer lengths and answer probabilities of ``examples`` under the current model."""
        reference = self._reference_logits if self.args.competitor_source == "teacher" else None
        return measure_violations(
            self._model(),
            examples,
            self.pad_token_id,
            k=self.args.masc_k,
            tau=self.args.masc_tau,
            beta=self.args.masc_beta if beta is None else beta,
            delta=self.args.competitor_delta,
            reference_logits=reference,
            batch_size=batch_size or max(self.args.per_device_eval_batch_size, 8),
            min_k_leaves_out=self.min_k_leaves_out,
        )

    def calibration_thresholds(self) -> torch.Tensor:
        """The calibration set's sorted margins under the current model (measured at the first use, then at every
        probe): what ``masc_threshold='calibration'`` compares each forget token with."""
        if self.calibration_margins is None:
            self._measure_calibration()
        return self.calibration_margins

    def _timed(self, name: str, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """:meth:`measure_margins` of one probe set, its seconds added to ``seconds_by_set[name]``."""
        began = time.perf_counter()
        result = self.measure_margins(examples)
        self.seconds_by_set[name] = self.seconds_by_set.get(name, 0.0) + time.perf_counter() - began
        return result

    def _measure_calibration(self) -> dict[str, torch.Tensor]:
        calibration = self._timed("calibration", self.sets.calibration)
        margins = calibration["margins"]
        match = self.args.calibration_match
        if match != "rank":  # every other match holds the ids the never-seen answers share with the forget set
            copied = calibration["copied"] if match == "prompt" else None
            ids, levels, own_margins, copied_margins, spread = token_levels(
                margins, calibration["tokens"], self.sets.forget_ids, copied
            )
            offsets = None
            if match == "id_spread":
                spread, offsets = spread_by_id(margins, calibration["tokens"], ids, levels)
            self.calibration_levels = NeverSeenLevels(
                ids,
                levels,
                copied_margins if copied is not None else None,
                spread if match in ("token_spread", "id_spread") else None,
                offsets,
            ).to(self.args.device)
            margins = own_margins
        self.calibration_margins = margins.sort().values.to(self.args.device)
        self.calibration_min_k = calibration["min_k"]
        self.calibration_latest = {
            "violation_rate_calibration": calibration["fractions"].mean().item(),
            "calibration_probability": calibration["probabilities"].mean().item(),
        }
        self.probes_since_calibration = 0
        return calibration

    def gap(self, forget: Mapping[str, torch.Tensor]) -> float:
        """The calibration gap of one probe's forget margins and tokens against the never-seen reference held now."""
        levels = None if self.calibration_levels is None else self.calibration_levels.to("cpu")
        return calibration_gap(
            forget["margins"], self.calibration_margins.cpu(), forget.get("tokens"), levels, forget.get("copied")
        )

    def _calibration_is_stale(self, forget_margins: Mapping[str, Any]) -> tuple[bool, float | None]:
        """Whether this probe can keep the never-seen margins last measured, and the gap against them.

        ``calibration_reference='start'``: always (they were measured once, before unlearning). ``'current'``: they
        are re-measured when ``calibration_refresh_margin`` is None, when ``calibration_refresh_every`` probes have
        passed, or when the gap against them is within ``calibration_refresh_margin`` of the stop's slack, so a stop
        (gap <= slack) is always decided on margins measured at the same probe; with ``stop_target='membership'`` at
        every probe (its AUC can stop any probe). The saving is one forward pass over the calibration sample per
        probe."""
        if self.calibration_margins is None:
            return False, None
        start_reference = self.args.calibration_reference == "start"
        margin = self.args.calibration_refresh_margin
        due = margin is None or self.probes_since_calibration + 1 >= self.args.calibration_refresh_every
        due = due or self.args.stop_target == "membership"
        if not start_reference and due:
            return False, None
        stop_probe = self.args.stop_probe
        if stop_probe not in forget_margins:  # no forget margins to compare (no batch since the last probe)
            return start_reference, None
        gap = self.gap(forget_margins[stop_probe])
        return (True, gap) if start_reference else (gap > self.args.calibration_slack + margin, gap)

    def _membership_due(self, measured: Mapping[str, float]) -> bool:
        """Whether this probe reads the Min-K% AUC of the forget answers against the calibration answers (beyond the
        MASC paper): at every probe for ``stop_target='membership'`` (its forget side costs no forward pass: the
        training forwards' scores, or the probe's own forward); with the gap's stop only once the gap has met its
        slack. Every process decides alike (the gap comes from gathered margins)."""
        if not self.reads_membership or self.calibration_min_k is None:
            return False
        if self.args.stop_target == "membership":
            return True
        gap = measured.get("calibration_gap")
        return bool(self._agree_across_processes(gap is not None and gap <= self.args.calibration_slack))

    def _retain_reading(self, running: Mapping[str, torch.Tensor]) -> tuple[float | None, str]:
        """The retain answer probability the utility floor reads at this probe, and where it came from: the retain
        batches trained on since the last probe (``retain_probe='screen'``) while that reading stays at or above
        twice the floor (without a floor, nothing is decided on it), else the fixed retain sample."""
        floor = self.args.utility_floor or 0.0
        total = running.get("retain")
        if (
            self.args.retain_probe != "screen"
            or self.start_retain_probability is None
            or total is None
            or total[1] <= 0
        ):
            return None, "sample"
        reading = float(total[0] / total[1])
        return (reading, "running") if reading >= 2 * floor * self.start_retain_probability else (None, "sample")

    def probe(self) -> dict[str, float]:
        """The stopping rule's measurement: violation rate of the stopping probe, plus the other probes' rates, the
        calibration set's rate and the retain answer probability the utility floor watches.

        With ``running`` the 'train' rate comes from the forget batches trained on since the last probe (no forward
        pass here); the retain sample, the held-out and the calibration sets are measured with a forward pass. Runs
        on every process (a sharded model's forward needs all of them); all processes use rank 0's numbers, so all
        stop at the same step.
        """
        start = time.perf_counter()
        measured: dict[str, float] = {}
        running = self._read_running() if self.running else {}
        forget_running = running.get("forget")
        forget_margins = {}
        train_examples = 0
        if forget_running is not None and forget_running[2] > 0:
            measured["violation_rate_train"] = float(forget_running[0] / forget_running[2])
            measured["forget_probability_train"] = float(forget_running[1] / forget_running[2])
            train_examples = int(forget_running[2])
            if "forget_margins" in running:
                forget_margins["train"] = {
                    "margins": running["forget_margins"], "tokens": running["forget_tokens"],
                    "copied": running["forget_copied"],
                }  # fmt: skip
            if "forget_min_k" in running:
                recent = torch.cat([self.recent_min_k, running["forget_min_k"].double()])
                self.recent_min_k = recent[-self.args.probe_size :]
                forget_margins.setdefault("train", {})["min_k"] = self.recent_min_k

        for name, examples in (("train", self.sets.train), ("holdout", self.sets.holdout)):
            if not examples or f"violation_rate_{name}" in measured:
                continue
            margins = self._timed(name, examples)
            measured[f"violation_rate_{name}"] = margins["fractions"].mean().item()
            measured[f"forget_probability_{name}"] = margins["probabilities"].mean().item()
            forget_margins[name] = {key: margins[key] for key in ("margins", "tokens", "copied", "min_k")}
            if name == "train":
                train_examples = len(margins["fractions"])
        # What to measure with a forward pass is decided before any of them, on rank 0's numbers: a sharded model's
        # forward is a collective that every process must enter.
        stale, stale_gap = self._calibration_is_stale(forget_margins) if self.sets.calibration else (False, None)
        reading, source = self._retain_reading(running) if self.sets.retain else (None, "sample")
        stale, stale_gap, reading, source = self._agree_across_processes((stale, stale_gap, reading, source))
        if self.sets.calibration:
            if stale:
                self.probes_since_calibration += 1
                measured.update(self.calibration_latest)
                if stale_gap is not None:
                    measured["calibration_gap"] = stale_gap
            else:
                self._measure_calibration()
                measured.update(self.calibration_latest)
                if self.args.stop_probe in forget_margins:
                    measured["calibration_gap"] = self.gap(forget_margins[self.args.stop_probe])
            measured["calibration_measured"] = float(not stale)
            if self._membership_due(measured):
                # the stopping probe's forget side brings its Min-K%: the training forwards' window, else its forward
                forget_min_k, never_seen = forget_margins[self.args.stop_probe]["min_k"], self.calibration_min_k
                measured["calibration_min_k_auc"] = membership_auc(  # answers with nothing left to score: not read
                    forget_min_k[~forget_min_k.isnan()].tolist(), never_seen[~never_seen.isnan()].tolist()
                )
        stop_probe = self.args.stop_probe
        measured["violation_rate"] = measured[f"violation_rate_{stop_probe}"]
        measured["num_examples"] = train_examples if stop_probe == "train" else len(self.sets.holdout)
        if self.sets.retain:
            if reading is None:
                reading = self._timed("retain", self.sets.retain)["probabilities"].mean().item()
            measured["retain_probability"] = reading
            measured["retain_probability_measured"] = float(source == "sample")
        measured = self._agree_across_processes(measured)
        self.retain_verified = measured.get("retain_probability_measured", 1.0) == 1.0
        if self.start_retain_probability is None and self.sets.retain:
            self.start_retain_probability = measured["retain_probability"]  # rank 0's, like every decision
        self.latest.update({key: value for key, value in measured.items() if key != "num_examples"})
        self.seconds += time.perf_counter() - start
        return measured

    def _agree_across_processes(self, measured: Any) -> Any:
        """Every process probes the same examples; take rank 0's numbers (or decisions) so that all run the same
        forward passes and stop at the same step."""
        if self.accelerator.num_processes == 1:
            return measured
        from accelerate.utils import broadcast_object_list

        holder = [measured]
        broadcast_object_list(holder, from_process=0)
        return holder[0]

    def exact_reproduction_bound(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, float]:
        """MASC Proposition 1 on ``examples`` at beta = 1: a forget answer of length L with a fraction v of violating
        tokens is reproduced exactly with probability <= rho ** ((1 - v) L)."""
        margins = self.measure_margins(examples, beta=1.0)
        bounds = exact_reproduction_bound(margins["fractions"], margins["lengths"], self.args.masc_rho)
        return {
            "mean": bounds.mean().item(),
            "max": bounds.max().item(),
            "violation_rate": margins["fractions"].mean().item(),
            "rho": self.args.masc_rho,
            "k": self.args.masc_k,
        }

    # --- kept states: the last one above the utility floor, the first that met the target -----------------

    def snapshot(self, name: str, step: int) -> None:
        """Copy the trainable parameters to host memory (not possible when DeepSpeed partitions them)."""
        if not self.can_snapshot:
            return
        self.snapshots[name] = (step, [p.detach().to("cpu", copy=True) for p in self._trainable()])

    def restore(self, name: str) -> None:
        if name not in self.snapshots:
            logger.warning(f"UnlearnTrainer: no '{name}' state was kept, so the weights stay as they are.")
            return
        step, saved = self.snapshots[name]
        with torch.no_grad():
            for param, value in zip(self._trainable(), saved):
                param.copy_(value.to(param.device))
        self.restored_step = step
        logger.warning(f"UnlearnTrainer: restored the weights of step {step} ({name.replace('_', ' ')} state).")

    def keep_good_state(self, step: int) -> None:
        """The utility floor's fallback, called at every probe that passed it: the weights to put back if a later
        probe falls through. A pass read on the fixed sample certifies the current weights. A pass read on the
        screen does not (its batches ran at the weights *before* each update, so an update that broke the model
        just before this probe is not in it): the current weights become a candidate, promoted at the next probe
        whose reading passes, when the screen's batches include a forward at exactly those weights."""
        if self.retain_verified:
            self.snapshots.pop("candidate", None)
            self.snapshot("last_good", step)
            return
        if "candidate" in self.snapshots:
            self.snapshots["last_good"] = self.snapshots.pop("candidate")
        self.snapshot("candidate", step)

    def restore_after_failure(self, step: int) -> None:
        """The floor fell through: put back the candidate state if the fixed retain sample, measured at its
        weights now, is above the floor (one forward pass, only at a failure); else the last certified state."""
        floor = (self.args.utility_floor or 0.0) * (self.start_retain_probability or 0.0)
        if "candidate" in self.snapshots and self.sets.retain:
            self.restore("candidate")
            reading = self._timed("retain", self.sets.retain)["probabilities"].mean().item()
            if self._agree_across_processes(reading) >= floor:
                return
            logger.warning(
                f"UnlearnTrainer: the state of step {self.restored_step} was under the utility floor too "
                f"(retain answer probability {reading:.4g} < {floor:.4g}); going back further."
            )
        self.restore("last_good")

    def bind(self, callback: Any, guard: bool, keep_best: bool) -> None:
        """Give the stopping callback its probe and the states to keep (``guard``: the utility floor restores the
        last good state; ``keep_best``: the first state that met the target)."""
        callback.bind(
            self.probe,
            on_good_state=self.keep_good_state if guard else None,
            on_target=(lambda step: self.snapshot("best", step)) if keep_best else None,
            on_failure=self.restore_after_failure if guard else None,
            export_running=self.export_running,
        )
