"""match_prompt_copies (beyond the MASC paper): a forget token that repeats the prompt (an author's name the question
spells) is matched with the calibration tokens that repeat theirs, the other tokens with the other calibration tokens;
every read that matches thresholds (the loss, the calibration gap, a resumed run) sees the same split."""

import dataclasses
import types

import pytest
import torch
from conftest import make_example, make_tiny_model, unlearn_config

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.data import pad_examples, prompt_copies
from hf_unlearn.objectives import FORGET_OBJECTIVES, LossInputs
from hf_unlearn.objectives.masc.calibration import calibrated_thresholds, matched_thresholds, never_seen_reference
from hf_unlearn.objectives.masc.margin import measure_violations, restricted_margin
from hf_unlearn.scores import shift_for_causal_lm

# One row: two prompt tokens, then a 3-token answer (labels 1, 2, 3). Position t predicts token t + 1.
LOGITS = torch.tensor(
    [[[0.0] * 6, [2.0, 3.0, 0.0, -1.0, 0.5, 0.0], [0.5, 0.0, 2.5, -0.5, 0.0, 1.0], [0.0, 1.0, 0.0, 2.0, 0.0, 0.0],
      [0.0] * 6]]
)  # fmt: skip
LABELS = torch.tensor([[-100, -100, 1, 2, 3]])
CONFIG = types.SimpleNamespace(
    masc_k=2, masc_beta=1.0, masc_tau=0.0, masc_eta=0.5, masc_threshold="calibration", masc_hinge="one_sided",
    competitor_source="self", competitor_delta=None, masc_rival_kl=0.0, masc_rival_temperature=1.0,
    match_prompt_copies=True, calibration_match="rank", seed=0,
)  # fmt: skip


def echoing(seed: int) -> dict:
    """A tokenized example whose answer starts with its prompt's first three tokens (a name the question spells)."""
    example = make_example(seed, length=12, prompt=6)
    example["input_ids"][6:9] = example["input_ids"][:3]
    example["labels"] = [-100] * 6 + example["input_ids"][6:]
    return example


def test_a_copy_is_matched_with_never_seen_copies_and_the_rest_with_the_rest():
    """Answer tokens 1 and 2 repeat the prompt: they are ranked against the never-seen copies' margins, token 3 alone
    against the other never-seen margins (one token: their median); without the copies all three are ranked
    against the other never-seen margins."""
    logits, labels = shift_for_causal_lm(LOGITS, LABELS)
    margins = restricted_margin(logits, labels, k=2).margins[0, 1:]
    copies = torch.tensor([[False, False, True, True, False]])
    rest, copy_margins = torch.tensor([-4.0, -2.0, 0.0]), torch.tensor([1.0, 3.0])
    thresholds = torch.cat([calibrated_thresholds(margins[:2], copy_margins), torch.tensor([-2.0])])
    expected = torch.relu(margins - (thresholds - 0.5)).sum() / 0.5 / 3
    inputs = LossInputs(
        logits=LOGITS, labels=LABELS, config=CONFIG, calibration_margins=rest, prompt_copies=copies,
        calibration_copy_margins=copy_margins,
    )  # fmt: skip
    assert FORGET_OBJECTIVES["masc"].fn(inputs).item() == pytest.approx(expected.item(), rel=1e-6)
    pooled = torch.relu(margins - (calibrated_thresholds(margins, rest) - 0.5)).sum() / 0.5 / 3
    inputs = LossInputs(logits=LOGITS, labels=LABELS, config=CONFIG, calibration_margins=rest)
    assert FORGET_OBJECTIVES["masc"].fn(inputs).item() == pytest.approx(pooled.item(), rel=1e-6)
    assert pooled.item() != pytest.approx(expected.item())
    assert FORGET_OBJECTIVES["masc"].needs_prompt_copies(CONFIG)
    paper = types.SimpleNamespace(**{**vars(CONFIG), "masc_threshold": "rho"})
    assert not FORGET_OBJECTIVES["masc"].needs_prompt_copies(paper)
    assert any(d.startswith("match_prompt_copies") for d in FORGET_OBJECTIVES["masc"].beyond_paper(CONFIG))
    # Without never-seen copies to match with, the copies are matched like the rest.
    same = matched_thresholds(margins, rest, copies=copies[0, 2:], copy_margins=torch.zeros(0))
    assert torch.equal(same, calibrated_thresholds(margins, rest))


def test_the_measurement_marks_the_copies_and_the_reference_keeps_them_apart():
    """``measure_violations`` says which scored token repeats the prompt (as :func:`prompt_copies` does on the
    batch), and the never-seen reference built from it holds the copies' margins apart from the rest."""
    model = make_tiny_model().eval()
    examples = [echoing(seed) for seed in range(3)] + [make_example(7)]
    measured = measure_violations(model, examples, pad_token_id=0, k=4, tau=0.0, with_copies=True)
    assert "copies" not in measure_violations(model, examples, pad_token_id=0, k=4, tau=0.0)
    batch = pad_examples(examples, 0)
    expected = prompt_copies(batch["input_ids"], batch["labels"], batch["attention_mask"])[:, 1:]
    assert torch.equal(measured["copies"], expected[batch["labels"][:, 1:] != -100])
    assert 9 <= int(measured["copies"].sum()) < len(measured["copies"])  # three tokens of each echoing answer
    reference = never_seen_reference(measured, torch.arange(64), "id_spread", "cpu", by_copies=True)
    copies = measured["copies"]
    assert torch.equal(reference.copy_margins, measured["margins"][copies].sort().values)
    together = never_seen_reference(measured, torch.arange(64), "rank", "cpu")
    apart = never_seen_reference(measured, torch.arange(64), "rank", "cpu", by_copies=True)
    assert together.copy_margins is None and torch.equal(apart.margins, measured["margins"][~copies].sort().values)


def test_the_trainer_gives_masc_the_copies_and_a_resumed_run_keeps_the_never_seen_copies(tmp_path):
    """With match_prompt_copies the loss gets each row's copies and the start's never-seen copy margins, which a
    checkpoint keeps; it is refused without a calibrated threshold and with the calibration gap's stop."""
    seen = []
    masc = FORGET_OBJECTIVES["masc"]

    def spy(inputs):
        seen.append((inputs.prompt_copies is not None and bool(inputs.prompt_copies.any()),
                     inputs.calibration_copy_margins))  # fmt: skip
        return masc.fn(inputs)

    forget = [echoing(seed) for seed in range(8)]
    calibration = [echoing(100 + seed) for seed in range(8)]
    settings = dict(max_steps=2, probe_interval=1, masc_threshold="calibration", stop_target="membership",
                    stop_at_target=False, match_prompt_copies=True, retain_loss="none")  # fmt: skip
    FORGET_OBJECTIVES["masc"] = dataclasses.replace(masc, fn=spy)
    try:
        trainer = UnlearnTrainer(
            make_tiny_model(), unlearn_config(tmp_path / "a", **settings), forget, calibration_dataset=calibration
        )
        trainer.train()
    finally:
        FORGET_OBJECTIVES["masc"] = masc
    start = trainer.probes.start_reference
    assert start.copy_margins is not None and start.copy_margins.numel() == 8 * 3
    assert seen and all(copied and torch.equal(margins, start.copy_margins) for copied, margins in seen)
    resumed = UnlearnTrainer(
        make_tiny_model(), unlearn_config(tmp_path / "b", **settings), forget, calibration_dataset=calibration
    )
    resumed.probes.restore_running(trainer.probes.export_running())
    assert torch.equal(resumed.probes.start_reference.copy_margins, start.copy_margins)
    with pytest.raises(ValueError, match="match_prompt_copies .* needs masc_threshold='calibration'"):
        UnlearnConfig(output_dir=str(tmp_path), method="masc", match_prompt_copies=True, report_to="none")
    with pytest.raises(ValueError, match="match_prompt_copies is not read by stop_target='calibration'"):
        UnlearnConfig(output_dir=str(tmp_path), method="masc", match_prompt_copies=True, report_to="none",
                      masc_threshold="calibration", stop_target="calibration")  # fmt: skip


def test_the_exact_gap_on_a_holdout_probe_reads_the_copies_apart(tmp_path):
    """The calibration gap a held-out probe records at the last step equals the gap of a fresh measurement with the
    copies matched apart, and differs from the gap that matches them with the rest."""
    forget = [echoing(seed) for seed in range(16)]
    calibration = [echoing(100 + seed) for seed in range(8)]
    config = unlearn_config(tmp_path, max_steps=2, probe_interval=1, masc_threshold="calibration",
                            stop_target="membership", stop_at_target=False, match_prompt_copies=True,
                            retain_loss="none", stop_probe="holdout", holdout_fraction=0.25)  # fmt: skip
    trainer = UnlearnTrainer(make_tiny_model(), config, forget, calibration_dataset=calibration)
    trainer.train()
    probes = trainer.probes
    held_out, never_seen = probes.measure_margins(probes.sets.holdout), probes.measure_margins(probes.sets.calibration)
    apart = never_seen_reference(never_seen, probes.sets.forget_ids, "id_spread", "cpu", by_copies=True)
    together = never_seen_reference(never_seen, probes.sets.forget_ids, "id_spread", "cpu")
    recorded = trainer.record.probe_history[-1]["calibration_gap"]
    assert recorded == pytest.approx(apart.gap(held_out), rel=1e-5)
    assert recorded != pytest.approx(together.gap(held_out), rel=1e-3)
