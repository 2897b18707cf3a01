"""The stopping rule's decisions, driven through Trainer's callback interface with a scripted probe."""

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from hf_unlearn.objectives.masc.stopping import ViolationStoppingCallback, hoeffding_upper_bound


def drive(callback, rates, steps, num_examples=50):
    """Call on_step_end for steps 1..steps; the probe returns the next scripted rate each time it is asked."""
    script = iter(rates)
    callback.bind(lambda: {"violation_rate": next(script), "num_examples": num_examples})
    args, state, control = TrainingArguments("unused", report_to="none"), TrainerState(), TrainerControl()
    for step in range(1, steps + 1):
        state.global_step = step
        callback.on_step_end(args, state, control)
        if control.should_training_stop:
            return step
    return None


def test_stops_at_the_first_probe_at_or_under_alpha():
    callback = ViolationStoppingCallback(alpha=0.4, probe_interval=5)
    assert drive(callback, [0.9, 0.6, 0.4, 0.1], steps=40) == 15  # 0.4 <= alpha at the third probe
    assert callback.stop_step == 15 and callback.probes_done == 3 and callback.last_violation_rate == 0.4
    assert [h["step"] for h in callback.history] == [5, 10, 15]


def test_does_not_stop_above_alpha_or_when_only_measuring():
    assert drive(ViolationStoppingCallback(alpha=0.1, probe_interval=2), [0.5] * 10, steps=20) is None
    measuring = ViolationStoppingCallback(alpha=0.9, probe_interval=2, stop=False)
    assert drive(measuring, [0.1] * 10, steps=20) is None
    assert measuring.probes_done == 10 and not measuring.stopped_early


def test_hoeffding_waits_for_the_upper_bound():
    rates = [0.3, 0.2, 0.1, 0.05, 0.0]
    plain = drive(ViolationStoppingCallback(alpha=0.3, probe_interval=1), rates, steps=5, num_examples=100)
    careful = ViolationStoppingCallback(alpha=0.3, probe_interval=1, violation_bound_delta=0.05)
    stopped = drive(careful, rates, steps=5, num_examples=100)
    assert plain == 1
    first_safe = next(j for j, r in enumerate(rates) if hoeffding_upper_bound(r, 100, j, 0.05) <= 0.3)
    assert stopped == first_safe + 1 > plain


def test_state_round_trip_restores_counters_and_keeps_stopping():
    callback = ViolationStoppingCallback(alpha=0.4, probe_interval=5)
    drive(callback, [0.9, 0.3], steps=10)
    exported = callback.state()
    restored = ViolationStoppingCallback(**exported["args"])
    for name, value in exported["attributes"].items():
        setattr(restored, name, value)
    assert (restored.stop_step, restored.probes_done, restored.history) == (10, 2, callback.history)
    control = TrainerControl()
    restored.on_step_end(TrainingArguments("unused", report_to="none"), TrainerState(global_step=10), control)
    assert control.should_training_stop


def test_unbound_callback_says_what_is_missing():
    callback = ViolationStoppingCallback(alpha=0.4, probe_interval=1)
    with pytest.raises(RuntimeError, match="no probe"):
        callback.on_step_end(
            TrainingArguments("unused", report_to="none"), TrainerState(global_step=1), TrainerControl()
        )
