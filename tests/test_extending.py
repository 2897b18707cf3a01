"""Extending the library from outside the package: an objective with its own hyperparameter, a method declared by
its objective's registration, and the docs' method tables held against the registry."""

import os
import re

import pytest
import torch
from conftest import forget_set, retain_set
from transformers import HfArgumentParser
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging

from hf_unlearn import UnlearnConfig, UnlearnTrainer
from hf_unlearn.objectives import FORGET_OBJECTIVES, METHODS, answer_nll, register_forget_objective
from hf_unlearn.outputs.model_card import build_model_card

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORGET, RETAIN = forget_set(), retain_set()


@pytest.fixture
def scaled_ascent():
    """A forget objective of this test file: gradient ascent scaled by its own declared hyperparameter."""
    seen = []

    @register_forget_objective("test_scaled_ascent", hyperparameters={"scale": 1.0, "label": "plain"})
    def scaled_ascent_loss(inputs):
        seen.append(dict(inputs.hyperparameters))
        return -inputs.hyperparameters["scale"] * answer_nll(inputs)

    yield seen
    del FORGET_OBJECTIVES["test_scaled_ascent"]


def config(tmp_path, **overrides):
    values = dict(
        output_dir=str(tmp_path), report_to="none", save_strategy="no", use_cpu=True, disable_tqdm=True, max_steps=2
    )
    return UnlearnConfig(**{**values, **overrides})


def test_an_objective_of_the_users_reads_its_own_hyperparameter_and_the_record_keeps_it(
    tmp_path, memorized_llama, scaled_ascent
):
    trainer = UnlearnTrainer(
        memorized_llama, config(tmp_path, forget_loss="test_scaled_ascent", forget_loss_kwargs={"scale": 2}), FORGET
    )
    trainer.train()
    assert scaled_ascent and all(seen == {"scale": 2.0, "label": "plain"} for seen in scaled_ascent)
    record = trainer.record
    assert record.method == "custom" and record.retain_objective == "none"
    assert record.hyperparameters["forget_loss_kwargs"] == {"scale": 2.0, "label": "plain"}
    assert "retain_loss_kwargs" not in record.hyperparameters
    card = str(build_model_card(record, str(tmp_path)))
    assert "| `forget_loss_kwargs` | {'scale': 2.0, 'label': 'plain'} |" in card


def test_the_declared_value_changes_the_loss(tmp_path, memorized_llama, scaled_ascent):
    trainers = [
        UnlearnTrainer(
            memorized_llama, config(tmp_path / str(scale), forget_loss="test_scaled_ascent", **kwargs), FORGET
        )
        for scale, kwargs in ((1, {}), (3, {"forget_loss_kwargs": {"scale": 3.0}}))
    ]
    batch = next(iter(trainers[0].get_train_dataloader()))
    losses = [trainer.compute_loss(trainer.model.eval(), batch).item() for trainer in trainers]
    assert losses[1] == pytest.approx(3 * losses[0])


def test_an_unknown_key_is_refused_by_name_before_any_weight_changes(tmp_path, memorized_llama, scaled_ascent):
    with pytest.raises(ValueError, match=r"forget_loss_kwargs has unknown key\(s\) \['scael'\].*\['label', 'scale'\]"):
        config(tmp_path, forget_loss="test_scaled_ascent", forget_loss_kwargs={"scael": 2.0})
    with pytest.raises(ValueError, match=r"forget_loss_kwargs\['scale'\] must be a float"):
        config(tmp_path, forget_loss="test_scaled_ascent", forget_loss_kwargs={"scale": "big"})
    with pytest.raises(ValueError, match=r"retain_loss_kwargs has unknown key\(s\) \['beta'\]: the objective 'nll'"):
        config(tmp_path, method="graddiff", retain_loss_kwargs={"beta": 1.0})
    # An objective registered after the config was made is checked by the trainer, before it touches the model.
    del FORGET_OBJECTIVES["test_scaled_ascent"]
    args = config(tmp_path, forget_loss="test_scaled_ascent", forget_loss_kwargs={"scael": 2.0})
    register_forget_objective("test_scaled_ascent", hyperparameters={"scale": 1.0})(lambda inputs: None)
    before = {name: p.clone() for name, p in memorized_llama.named_parameters()}
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['scael'\]"):
        UnlearnTrainer(memorized_llama, args, FORGET)
    assert all(torch.equal(p, before[name]) for name, p in memorized_llama.named_parameters())


def test_the_kwargs_are_a_json_string_on_the_command_line(tmp_path, scaled_ascent):
    parser = HfArgumentParser(UnlearnConfig)
    (args,) = parser.parse_args_into_dataclasses(
        [
            "--output_dir",
            str(tmp_path),
            "--forget_loss",
            "test_scaled_ascent",
            "--forget_loss_kwargs",
            '{"scale": 0.5}',
        ]
    )
    assert args.forget_loss_kwargs == {"scale": 0.5}
    with pytest.raises(ValueError, match="forget_loss_kwargs must be a dict or a JSON object"):
        parser.parse_args_into_dataclasses(["--forget_loss", "test_scaled_ascent", "--forget_loss_kwargs", "scale=2"])


def test_a_forget_loss_without_a_method_gets_no_retain_term_and_no_stop_and_says_so(tmp_path):
    logger = logging.get_logger("hf_unlearn.training.choices")
    with CaptureLogger(logger) as captured:
        args = config(tmp_path, forget_loss="masc")
    assert (args.method, args.objectives, args.stop_at_target) == ("custom", ("masc", "none"), False)
    assert "method='custom'" in captured.out and "stop_at_target=False" in captured.out
    assert args.forget_weight == 0.1  # the objective's registered weight still applies
    asked = config(tmp_path, forget_loss="masc", retain_loss="kl", stop_at_target=True, probe_interval=1)
    assert asked.objectives == ("masc", "kl") and asked.stop_at_target
    named = config(tmp_path, method="masc", forget_loss="npo")  # a named method keeps its retain term and its stop
    assert named.objectives == ("npo", "kl") and named.stop_at_target
    with pytest.raises(ValueError, match="method='custom' runs the objectives you name: set forget_loss"):
        config(tmp_path, method="custom")


def test_a_method_is_declared_by_its_objectives_registration(tmp_path, scaled_ascent):
    register_forget_objective(
        "test_scaled_ascent", hyperparameters={"scale": 1.0}, methods={"test_scaled": "nll"}, retain_weight=0.5
    )(lambda inputs: None)
    try:
        args = config(tmp_path, method="test_scaled")
        assert args.objectives == ("test_scaled_ascent", "nll") and args.retain_weight == 0.5
        assert not args.stop_at_target
        with pytest.raises(ValueError, match=r"Method name\(s\) \['npo'\] already name another method"):
            register_forget_objective("test_other", methods={"npo": "none"})
    finally:
        del METHODS["test_scaled"]


@pytest.mark.parametrize("page", ["docs/unlearn_trainer.md", "README.md"])
def test_the_method_tables_of_the_docs_match_the_registry(page):
    with open(os.path.join(ROOT, page)) as f:
        rows = re.findall(r"^\| `(\w+)`(?: \(default\))? \| `(\w+)`.* \| `(\w+)`.*\|$", f.read(), flags=re.M)
    assert {method: (forget, retain) for method, forget, retain in rows} == METHODS
