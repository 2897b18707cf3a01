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
    groups_of,
    leave_out_final,
    min_k_per_example,
    probabilities_of,
    shift_for_causal_lm,
    token_log_probs,
)
from .calibration import NeverSeenLevels, NeverSeenReference, never_seen_reference
from .kept_states import KeptStates
from .margin import MarginResult, exact_reproduction_bound, measure_violations, restricted_margin, violation_fractions
from .probe_checkpoint import ProbeCheckpointing
from .stop_read import STOP_STATISTICS, StopReadState, min_k_auc, min_k_auc_interval, stop_statistic

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
    running = args.probe_interval > 0 and (args.competitor_source == "self" or forget_objective.needs_reference(args))
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
    #: every token id the trained forget answers score (``calibration_match='id_spread'``: the ids they share)
    forget_ids: torch.Tensor = dataclass_field(default_factory=lambda: torch.empty(0, dtype=torch.long))
    #: the author (``group`` or ``author`` column) of each example of ``train``, ``holdout`` and ``calibration``, where
    #: the data names one: the stop's interval resamples authors as the evaluation's does (:func:`~hf_unlearn.scores.
    #: groups_of`)
    groups: dict[str, list[Any] | None] = dataclass_field(default_factory=dict)

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
        train_rows = _sample_rows(trained, size, seed)
        calibration_rows = (
            _sample_rows(calibration, calibration_size or size, seed + 2) if calibration is not None else []
        )
        return cls(
            forget_ids=torch.tensor(scored, dtype=torch.long),
            train=[score(model_inputs(e), i) for i, e in enumerate(train_rows)],
            holdout=[score(model_inputs(e), i) for i, e in held_out],
            retain=_sample(retain, size, seed + 1) if retain is not None else [],
            calibration=[score(model_inputs(e), i) for i, e in enumerate(calibration_rows)],
            groups={
                "train": groups_of(train_rows),
                "holdout": groups_of([e for _, e in held_out]),
                "calibration": groups_of(calibration_rows),
            },
        )


#: The calibration answers the probes read: every one, up to this many times probe_size (a probe_size sample of a few
#: authors' answers moves the Min-K% AUC by about the region's tolerance: docs/studies/masc_landing.md, 13-14).
CALIBRATION_SIZE_FACTOR = 16


def calibration_sample_size(args: Any) -> int:
    """How many calibration answers the probes measure: every one up to ``CALIBRATION_SIZE_FACTOR`` x
    ``probe_size``."""
    return args.probe_size * CALIBRATION_SIZE_FACTOR


def _sample_rows(dataset: Sequence[Mapping[str, Any]], size: int, seed: int) -> list[Mapping[str, Any]]:
    """Up to ``size`` rows of ``dataset``, seeded, in their order, with every column."""
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(seed)).tolist()
    return [dataset[i] for i in sorted(order[:size])]


def _sample(dataset: Sequence[Mapping[str, Any]], size: int, seed: int) -> list[dict[str, list[int]]]:
    return [model_inputs(row) for row in _sample_rows(dataset, size, seed)]


class ProbeState(KeptStates, ProbeCheckpointing):
    """Probes, running sums and the start's never-seen reference of one run (the weight states it keeps:
    :class:`~.kept_states.KeptStates`; what a checkpoint keeps: :class:`~.probe_checkpoint.ProbeCheckpointing`).

    ``model`` returns the unwrapped model being trained, ``trainable`` its trainable parameters as the optimizer steps
    them, ``reference_logits`` the frozen start model's logits of a batch (for teacher competitors). ``running``: the
    'train' probe comes from the forget batches' own forwards (:meth:`accumulate`) instead of an extra forward.
    ``last_step`` says whether the probe is at the run's last step (read exactly, so the record states what the saved
    model reads).
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
        last_step: Callable[[], bool] = lambda: False,
    ) -> None:
        self.args = args
        self.sets = sets
        self.pad_token_id = pad_token_id
        self.accelerator = accelerator
        self._model = model
        self._trainable = trainable
        self._reference_logits = reference_logits
        self._last_step = last_step
        self.running = running
        self.calibrated = calibrated
        self.can_snapshot = can_snapshot
        self.running_sums: dict[str, torch.Tensor] = {}
        self.running_margins: list[torch.Tensor] = []  # forget margins since the last probe (calibrated target)
        self.running_tokens: list[torch.Tensor] = []  # and their token ids
        # The Min-K% stop's running read takes the forget answers trained on: their scores since the last probe, and
        # the last probe_size of them (across probes), the window it reads between exact reads (.stop_read).
        self.reads_membership = args.stop_target == "membership"
        self.min_k_leaves_out = min_k_leaves_out  # the appended EOS, which the evaluation's attack does not score
        self.running_min_k: list[torch.Tensor] = []
        self.recent_min_k = torch.zeros(0, dtype=torch.float64)
        # The calibration answers read by the start model: the loss's thresholds for the whole run, and the
        # reference of the stop's running read (the stop itself decides on exact reads: .stop_read).
        self.start_reference: NeverSeenReference | None = None
        self.stop_read = StopReadState()
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
        margins: MarginResult | None = None,
    ) -> None:
        """Per-example statistics of a forget batch from its own logits, summed on the device until the next probe:
        [violation fraction, answer probability, examples] (and the token margins, for the calibrated target). They
        are what a probe would measure on these examples in eval mode (no dropout: checked at construction), at the
        weights of the step that trained on them. The retain batches only screen the utility floor
        (:meth:`accumulate_retain`): it needs the current weights and more than one batch to decide (the running retain
        probability lags an update behind and swings far more than a fixed sample: docs/stopping.md). ``margins``:
        the batch's restricted margin where the loss computed it (MASC's), else computed here."""
        logits = logits.detach()
        log_probs, mask = token_log_probs(logits, labels)  # one log-softmax for the probability and Min-K%
        probabilities, scored = probabilities_of(log_probs, mask)
        shifted, shifted_labels = shift_for_causal_lm(logits, labels)
        if self.reads_membership:
            min_k = min_k_per_example(log_probs, leave_out_final(mask, shifted_labels, self.min_k_leaves_out))
            self.running_min_k.append(min_k[~torch.isnan(min_k)])
        if margins is None:  # not computed by the loss (another objective than MASC's): the probe's own
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
        else:
            margins = MarginResult(margins.margins.detach(), margins.mask)
        fractions, _ = violation_fractions(margins, self.args.masc_tau)
        stats = torch.stack([(fractions * scored).sum(), probabilities.sum(), scored.sum()]).double()
        self.running_sums["forget"] = self.running_sums["forget"] + stats if "forget" in self.running_sums else stats
        if self.calibrated:
            self.running_margins.append(margins.margins[margins.mask].float())
            self.running_tokens.append(shifted_labels[margins.mask])

    @torch.no_grad()
    def accumulate_retain(self, logits: torch.Tensor, labels: torch.Tensor) -> None:
        """[answer probability, examples] of a retain batch from its own training forward, summed on the device:
        the utility floor's screen. It lags an update behind and is noisier than the
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
            if processes > 1:
                margins = self.accelerator.gather(
                    self.accelerator.pad_across_processes(margins, pad_index=float("nan"))
                )
                tokens = self.accelerator.gather(self.accelerator.pad_across_processes(tokens, pad_index=-1))
                margins, tokens = margins[~torch.isnan(margins)], tokens[tokens >= 0]
            sums["forget_margins"], sums["forget_tokens"] = margins.cpu(), tokens.cpu()
            self.running_margins, self.running_tokens = [], []
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
            with_copies=self.args.match_prompt_copies,
        )

    @property
    def calibration_levels(self) -> NeverSeenLevels | None:
        """The start's never-seen levels a forget token whose id they use is matched with (a token match)."""
        return None if self.start_reference is None else self.start_reference.levels

    @property
    def calibration_copy_margins(self) -> torch.Tensor | None:
        """The start's never-seen margins of the calibration tokens that repeat their prompt (``match_prompt_copies``:
        what a forget token that repeats its prompt is matched with); ``None`` otherwise."""
        return None if self.start_reference is None else self.start_reference.copy_margins

    def calibration_thresholds(self) -> torch.Tensor:
        """The calibration set's sorted margins under the start model (measured at the first use, kept for the run):
        what ``masc_threshold='calibration'`` compares each forget token with."""
        if self.start_reference is None:
            self._measure_start_reference()
        return self.start_reference.margins

    def _timed(self, name: str, examples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """:meth:`measure_margins` of one probe set, its seconds added to ``seconds_by_set[name]``."""
        began = time.perf_counter()
        result = self.measure_margins(examples)
        self.seconds_by_set[name] = self.seconds_by_set.get(name, 0.0) + time.perf_counter() - began
        return result

    def _read_calibration(self) -> NeverSeenReference:
        """The calibration answers at the current weights, in eval mode, each once."""
        measured = self._timed("calibration", self.sets.calibration)
        return never_seen_reference(
            measured,
            self.sets.forget_ids,
            self.args.calibration_match,
            self.args.device,
            by_copies=self.args.match_prompt_copies,
        )

    def _measure_start_reference(self) -> NeverSeenReference:
        self.start_reference = self._read_calibration()
        return self.start_reference

    def _calibrated_reads(self, forget: dict[str, dict[str, Any]], first: bool, last: bool) -> dict[str, float]:
        """The calibrated stop's reads at this probe (:mod:`.stop_read`): the running one against the start's
        never-seen scores, and, when it is due, the exact one, the only one a stop decides on. ``forget``: each probe
        set's forget measurement; ``first``: the start reference was measured at this probe (the step-0 probe), so
        the running read is the exact one; ``last``: the run's last step, read exactly so that the record states what
        the saved model reads."""
        target, stop_probe = self.args.stop_target, self.args.stop_probe
        side = forget.get(stop_probe)
        running = None if side is None else stop_statistic(target, side, self.start_reference)
        measured: dict[str, float] = {}
        if running is not None:
            measured[f"running_{STOP_STATISTICS[target]}"] = running
        threshold = 0.5 - self.args.calibration_auc_slack if target == "membership" else self.args.calibration_slack
        due = bool(self._agree_across_processes(first or last or self.stop_read.due(target, threshold, running)))
        measured["stop_read_exact"] = float(due)
        if not due:
            self.stop_read.skipped()
            return measured
        reference = self.start_reference if first else self._read_calibration()
        if stop_probe == "train" and not (side or {}).get("eval_forward"):  # the window: read the fixed sample
            side = self._timed("train", self.sets.train) if self.sets.train else None
        measured["violation_rate_calibration"] = reference.violation_rate
        measured["calibration_probability"] = reference.probability
        if side is None:  # no forget answer to read
            return measured
        measured["calibration_gap"] = reference.gap(side)
        measured["calibration_min_k_auc"] = min_k_auc(side["min_k"], reference.min_k)
        groups = (self.sets.groups.get(stop_probe), self.sets.groups.get("calibration"))
        low, high = min_k_auc_interval(side["min_k"], reference.min_k, *groups)
        measured["calibration_min_k_auc_low"], measured["calibration_min_k_auc_high"] = low, high
        self.stop_read.read(measured[STOP_STATISTICS[target]], running)
        return measured

    def _retain_reading(self, running: Mapping[str, torch.Tensor]) -> tuple[float | None, str]:
        """The retain answer probability the utility floor reads at this probe, and where it came from: the retain
        batches trained on since the last probe (the screen) while that reading stays at or above
        twice the floor (without a floor, nothing is decided on it), else the fixed retain sample."""
        floor = self.args.utility_floor or 0.0
        total = running.get("retain")
        if self.start_retain_probability is None or total is None or total[1] <= 0:
            return None, "sample"
        reading = float(total[0] / total[1])
        return (reading, "running") if reading >= 2 * floor * self.start_retain_probability else (None, "sample")

    def probe(self) -> dict[str, float]:
        """The stopping rule's measurement: violation rate of the stopping probe, plus the other probes' rates, the
        calibration set's rate and the retain answer probability the utility floor watches.

        With ``running`` the 'train' rate comes from the forget batches trained on since the last probe (no forward
        pass here); the retain sample, the held-out and the calibration sets are measured with a forward pass. Runs
        on every process (a sharded model's forward needs all of them); all processes use rank 0's numbers, so all
        stop at the same step. At the run's last step (``last_step()``) a calibrated stop reads exactly.
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
                    "margins": running["forget_margins"], "tokens": running["forget_tokens"]
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
            kept = ("margins", "tokens", "copies", "min_k")
            forget_margins[name] = {key: margins[key] for key in kept if key in margins}
            forget_margins[name]["eval_forward"] = True  # read in eval mode at the current weights: exact
            if name == "train":
                train_examples = len(margins["fractions"])
        # What to measure with a forward pass is decided before any of them, on rank 0's numbers: a sharded model's
        # forward is a collective that every process must enter.
        reading, source = self._retain_reading(running) if self.sets.retain else (None, "sample")
        reading, source = self._agree_across_processes((reading, source))
        if self.sets.calibration:
            first = self.start_reference is None
            if first:
                self._measure_start_reference()
            measured.update(self._calibrated_reads(forget_margins, first, self._last_step()))
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
        self.latest = {key: value for key, value in measured.items() if key != "num_examples"}
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

    def bind(self, callback: Any, guard: bool) -> None:
        """Give the stopping callback its probe and, with ``guard`` (the utility floor restores the last good state),
        the states to keep."""
        callback.bind(
            self.probe,
            on_good_state=self.keep_good_state if guard else None,
            on_failure=self.restore_after_failure if guard else None,
            export_running=self.export_running,
        )
