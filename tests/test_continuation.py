"""MASC's continuation mode (forget_scoring='continuation'): the cut, the training batches, the probes, the loss."""

import math

import pytest
import torch
from conftest import make_example, make_tiny_model, memorize, unlearn_config

from hf_unlearn import UnlearnTrainer
from hf_unlearn.data.examples import tokenize_text
from hf_unlearn.data.pairing import ContinuationScoring, continuation_labels, pad_examples
from hf_unlearn.objectives.masc.margin import restricted_margin
from hf_unlearn.scores import shift_for_causal_lm

IGNORE = -100


def test_cut_counts_scored_tokens_and_is_clamped():
    labels = [IGNORE, IGNORE, 5, 6, 7, 8, 9, 10, 11, 12]  # 8 scored tokens
    # floor(0.5 * 8) = 4 scored tokens become context.
    assert continuation_labels(labels, 0.5, 2, 2) == [IGNORE] * 6 + [9, 10, 11, 12]
    # floor(0.1 * 8) = 0 is raised to the minimum prefix of 2.
    assert continuation_labels(labels, 0.1, 2, 2) == [IGNORE] * 4 + [7, 8, 9, 10, 11, 12]
    # floor(0.95 * 8) = 7 would leave 1 scored token: lowered so that 2 remain.
    assert continuation_labels(labels, 0.95, 2, 2) == [IGNORE] * 8 + [11, 12]
    # 8 < 5 + 4: too short to split, every token stays scored.
    assert continuation_labels(labels, 0.5, 5, 4) == labels
    # A first label that is scored (no BOS) is never predicted: it does not count towards the cut.
    unmasked = [5, 6, 7, 8, 9, 10, 11, 12, 13]  # 8 predicted tokens, as above
    assert continuation_labels(unmasked, 0.5, 2, 2)[5:] == [10, 11, 12, 13]
    assert continuation_labels(unmasked, 0.5, 2, 2)[1:5] == [IGNORE] * 4


def test_scoring_is_seeded_per_example_and_epoch():
    scoring = ContinuationScoring(enabled=True, min_ratio=0.2, max_ratio=0.6, min_prefix_tokens=1, min_suffix_tokens=1)
    ratios = {scoring.cut_ratio(i, e) for i in range(20) for e in (None, 0, 1)}
    assert all(0.2 <= r <= 0.6 for r in ratios) and len(ratios) == 60
    assert scoring.cut_ratio(3, 1) == ContinuationScoring(enabled=True).cut_ratio(3, 1)  # same seed, same cut
    assert scoring.cut_ratio(3, 1) != ContinuationScoring(enabled=True, seed=1).cut_ratio(3, 1)
    example = make_example(0, length=40, prompt=2)
    assert ContinuationScoring()(example, 0)["labels"] == example["labels"]  # disabled: unchanged


def config(tmp_path, **overrides):
    return unlearn_config(
        tmp_path,
        **{
            **dict(
                method="masc",
                forget_scoring="continuation",
                forget_scoring_kwargs={"min_prefix_tokens": 4, "min_suffix_tokens": 4},
                max_steps=4,
                per_device_train_batch_size=4,
                probe_interval=2,
                retain_loss="none",
            ),
            **overrides,
        },
    )


@pytest.fixture
def texts():
    """Plain texts: every token after the first is scored, as tokenize_text makes them."""
    return [make_example(i, length=30, prompt=1) for i in range(8)]


def test_training_batches_score_only_a_continuation_that_changes_with_the_epoch(tmp_path, texts):
    trainer = UnlearnTrainer(make_tiny_model(), config(tmp_path), texts)
    dataset = trainer.train_dataset
    first = dataset[0]["forget"]["labels"]
    original = texts[0]["labels"]  # no holdout: the dataset's first forget example is the first text
    scored = [i for i, label in enumerate(first) if label != IGNORE]
    assert 4 <= len(scored) <= 29 - 4 and scored == list(range(scored[0], 30))  # one contiguous suffix
    assert [first[i] for i in scored] == [original[i] for i in scored]
    cuts = set()
    for epoch in range(6):
        dataset.set_epoch(epoch)
        cuts.add(sum(label == IGNORE for label in dataset[0]["forget"]["labels"]))
    assert len(cuts) > 1  # a new cut each epoch
    # The probe's cut is fixed: the same examples every time they are read.
    assert trainer.probes.sets.train == UnlearnTrainer(make_tiny_model(), config(tmp_path), texts).probes.sets.train
    assert all(sum(label != IGNORE for label in e["labels"]) < 29 for e in trainer.probes.sets.train)
    recorded = trainer._make_record(final=False).hyperparameters["forget_scoring_kwargs"]
    assert recorded == {"cut_min_ratio": 0.2, "cut_max_ratio": 0.6, "min_prefix_tokens": 4, "min_suffix_tokens": 4}


def test_answer_scoring_leaves_examples_whole(tmp_path, texts):
    trainer = UnlearnTrainer(make_tiny_model(), config(tmp_path, forget_scoring="answer"), texts)
    assert trainer.train_dataset[0]["forget"]["labels"] == texts[0]["labels"]
    assert [e["labels"] for e in trainer.probes.sets.train] == [e["labels"] for e in texts]
    assert "forget_scoring_kwargs" not in trainer._make_record(final=False).hyperparameters


def test_probe_violation_rate_is_the_suffix_fraction_by_hand(tmp_path, texts):
    """The stopping probe's rate, against margins of the whole text restricted to the continuation by hand."""
    model = memorize(make_tiny_model(), texts, steps=12)  # partly learned: some tokens violate, some do not
    trainer = UnlearnTrainer(model, config(tmp_path, masc_k=3, masc_rho=0.5), texts)
    measured = trainer.probes.measure_margins(trainer.probes.sets.train)["fractions"]
    scoring = trainer._score_forget
    expected = []
    for i, text in enumerate(texts):
        ids = torch.tensor([text["input_ids"]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits
        shifted, labels = shift_for_causal_lm(logits, torch.tensor([text["labels"]]))
        margins = restricted_margin(shifted, labels, k=3).margins[0]
        n = 29  # scored tokens of a 30-token text whose first token is context
        cut = max(4, min(math.floor(scoring.cut_ratio(i) * n), n - 4))
        suffix = margins[cut:]  # shifted position j predicts token j + 1; scored tokens start at position 0
        expected.append((suffix > 0.0).float().mean().item())  # tau = log(0.5 / 0.5) = 0
    assert measured.tolist() == pytest.approx(expected, abs=1e-6)
    assert 0.0 < sum(expected) / len(expected) < 1.0
    # The whole-text rate differs, so the test would notice the cut being ignored.
    whole = UnlearnTrainer(model, config(tmp_path, masc_k=3, masc_rho=0.5, forget_scoring="answer"), texts)
    whole_fractions = whole.probes.measure_margins(whole.probes.sets.train)["fractions"].tolist()
    assert whole_fractions != pytest.approx(expected, abs=1e-6)


def test_masc_loss_is_the_hinge_over_the_continuation(tmp_path, texts):
    """The trainer's forget loss on a batch equals the buffered hinge over the batch's continuation tokens only."""
    model = memorize(make_tiny_model(), texts, steps=12)
    args = config(tmp_path, masc_k=3, masc_rho=0.5, masc_eta=0.5, forget_weight=1.0)
    trainer = UnlearnTrainer(model, args, texts)
    batch = [trainer.train_dataset[i]["forget"] for i in range(4)]
    padded = pad_examples(batch, 0)
    with torch.no_grad():
        logits = model(input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]).logits
        shifted, labels = shift_for_causal_lm(logits, padded["labels"])
        result = restricted_margin(shifted, labels, k=3)
        hand = (torch.relu(result.margins - (0.0 - 0.5)) / 0.5)[result.mask].mean().item()
        loss = trainer.compute_loss(model, {"forget": padded, "retain": None})
    assert loss.item() == pytest.approx(hand, rel=1e-5) and hand > 0
    full = pad_examples(texts[:4], 0)
    with torch.no_grad():
        whole = trainer.compute_loss(model, {"forget": full, "retain": None})
    assert whole.item() != pytest.approx(hand, rel=1e-5)


def test_tokenize_text_scores_every_token_but_bos():
    from hf_unlearn.benchmarks import build_tokenizer

    tokenizer = build_tokenizer()
    encoded = tokenize_text(tokenizer, "Quiet rivers run past the mill.")
    assert encoded["input_ids"][0] == tokenizer.bos_token_id and encoded["labels"][0] == IGNORE
    assert encoded["labels"][1:] == encoded["input_ids"][1:] and encoded["input_ids"][-1] == tokenizer.eos_token_id
    with pytest.raises(ValueError, match="max_length=4"):
        tokenize_text(tokenizer, "Quiet rivers run past the mill.", max_length=4)


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"forget_scoring": "prefix"}, "forget_scoring must be one of"),
        ({"forget_scoring_kwargs": {"cut_min_ratio": 0.7}}, "0 <= min <= max <= 1"),
        ({"forget_scoring_kwargs": {"min_suffix_tokens": 0}}, "min_suffix_tokens >= 1"),
        ({"forget_scoring_kwargs": {"min_prefix": 4}}, r"has \['min_prefix'\], which continuation scoring does not"),
        ({"forget_scoring_kwargs": "min_prefix_tokens=4"}, "must be a dict or a JSON object"),
    ],
)
def test_bad_continuation_settings_are_named(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        config(tmp_path, **overrides)


def test_examples_too_short_to_cut_are_named(tmp_path, texts, caplog):
    with caplog.at_level("WARNING", logger="hf_unlearn.training.trainer"):
        UnlearnTrainer(make_tiny_model(), config(tmp_path), texts)  # 29 scored tokens, minimums 4 + 4
    assert "scored whole" not in caplog.text
    with caplog.at_level("WARNING", logger="hf_unlearn.training.trainer"):
        trainer = UnlearnTrainer(
            make_tiny_model(),
            config(tmp_path, forget_scoring_kwargs={"min_prefix_tokens": 20, "min_suffix_tokens": 20}),
            texts,
        )
    assert "8 of 8 forget examples have fewer than 40 scored tokens" in caplog.text
    assert [e["labels"] for e in trainer.probes.sets.train] == [e["labels"] for e in texts]
