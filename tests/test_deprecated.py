"""The options on their way out (hf_unlearn.deprecated): each still works, warns with a FutureWarning naming
its replacement and the version that removes it, and no default path of the library sets one."""

import warnings

import pytest
from conftest import forget_set, make_tiny_model, retain_set
from transformers import HfArgumentParser

from hf_unlearn import METHODS, UnlearnConfig, UnlearnTrainer
from hf_unlearn.data.pairing import ContinuationScoring
from hf_unlearn.deprecated import ALIASES, SCORING_ALIASES
from hf_unlearn.objectives import objective_hyperparameters

# alias -> (a method whose objective declares its hyperparameter, a value other than the default)
ALIAS_RUNS = {
    "npo_beta": ("npo_klr", 0.25),
    "simnpo_beta": ("simnpo", 3.0),
    "simnpo_delta": ("simnpo", 0.5),
    "dpo_beta": ("idk_dpo", 0.2),
    "undial_beta": ("undial", 5.0),
    "wga_beta": ("wga", 2.0),
    "satimp_beta1": ("satimp", 3.0),
    "satimp_beta2": ("satimp", 2.0),
    "ceu_ignore_first_n_answer_tokens": ("ce_u", 0),
    "altpo_beta": ("altpo", 0.5),
    "pdu_epsilon": ("pdu", 0.5),
    "pdu_epsilon_slack": ("pdu", 0.2),
    "pdu_dual_init": ("pdu", 2.0),
    "pdu_dual_step": ("pdu", 0.5),
    "pdu_dual_warmup_steps": ("pdu", 3),
    "rmu_layer": ("rmu", 0),
    "rmu_trainable_layers": ("rmu", [0, 1]),
    "rmu_steering_coefficient": ("rmu", 4.0),
    "refusal_answers": ("idk_dpo", ["No idea."]),
    "alternate_column": ("altpo", "other_answer"),
}


def config(**values):
    return UnlearnConfig(output_dir="unused", report_to="none", use_cpu=True, **values)


def test_every_alias_is_covered():
    assert set(ALIAS_RUNS) == set(ALIASES)


@pytest.mark.parametrize("name", sorted(ALIAS_RUNS))
def test_a_deprecated_alias_still_sets_its_hyperparameter_and_warns(name):
    method, value = ALIAS_RUNS[name]
    alias = ALIASES[name]
    with pytest.warns(FutureWarning, match=rf"{name} is deprecated and will be removed in 0\.3: use {alias.part}_"):
        args = config(method=method, **{name: value})
    assert objective_hyperparameters(args, alias.part)[alias.key] == value
    assert getattr(args, f"{alias.part}_loss_kwargs") == {alias.key: value} and getattr(args, name) is None
    if name == "rmu_layer":  # RMU's terms share the layer
        assert objective_hyperparameters(args, "retain")["layer"] == value


def test_an_alias_for_another_method_warns_and_is_unused():
    with pytest.warns(FutureWarning, match=r"npo_beta is deprecated.*unused here"):
        args = config(method="simnpo", npo_beta=0.3)
    assert args.forget_loss_kwargs is None and objective_hyperparameters(args, "forget") == {"beta": 4.5, "delta": 0.0}


def test_an_alias_and_kwargs_that_disagree_are_refused_before_training():
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ValueError, match=r"npo_beta=0\.2 and forget_loss_kwargs\['beta'\]=0\.3"),
    ):
        config(method="npo", npo_beta=0.2, forget_loss_kwargs={"beta": 0.3})
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=r"pdu_dual_step=0\.5 and retain_loss_kwargs"):
        config(method="pdu", pdu_dual_step=0.5, retain_loss_kwargs={"dual_step": 1.0})
    # RMU's layer given to the forget term by the alias and another to the retain term
    with pytest.warns(FutureWarning), pytest.raises(ValueError, match=r"retain_loss_kwargs\['layer'\]=1"):
        config(method="rmu", rmu_layer=0, retain_loss_kwargs={"layer": 1})
    with pytest.warns(FutureWarning):  # the same value both ways is one value
        assert config(method="npo", npo_beta=0.3, forget_loss_kwargs={"beta": 0.3}).forget_loss_kwargs == {"beta": 0.3}


def test_a_bad_value_is_refused_by_its_kwargs_name():
    with pytest.raises(ValueError, match=r"forget_loss_kwargs\['beta'\] must be > 0, got 0\.0"):
        config(method="npo", forget_loss_kwargs={"beta": 0.0})
    with (
        pytest.warns(FutureWarning),
        pytest.raises(ValueError, match=r"retain_loss_kwargs\['dual_step'\] must be >= 0"),
    ):
        config(method="pdu", pdu_dual_step=-1.0)
    with pytest.raises(ValueError, match=r"forget_loss_kwargs\['layer'\] must be a decoder layer index"):
        config(method="rmu", forget_loss_kwargs={"layer": "7"})


def test_the_alias_on_the_command_line_reaches_the_run(tmp_path):
    parser = HfArgumentParser(UnlearnConfig)
    argv = ["--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu", "true", "--method", "npo",
            "--npo_beta", "0.25", "--max_steps", "1", "--probe_interval", "0"]  # fmt: skip
    with pytest.warns(FutureWarning, match="npo_beta is deprecated"):
        (args,) = parser.parse_args_into_dataclasses(argv)
    trainer = UnlearnTrainer(make_tiny_model(), args, forget_set(), retain_set())
    assert trainer.objective_kwargs["forget"] == {"beta": 0.25}
    assert trainer.record.hyperparameters["forget_loss_kwargs"] == {"beta": 0.25}


def test_no_default_sets_a_deprecated_option():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        for method in METHODS:
            args = config(method=method)
            assert all(getattr(args, name) is None for name in (*ALIASES, *SCORING_ALIASES)), method


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ({"calibration_match": "token"}, r"calibration_match='token'"),
        ({"calibration_match": "token_spread"}, r"calibration_match='token_spread'"),
        ({"calibration_match": "prompt"}, r"calibration_match='prompt'"),
        ({"calibration_reference": "current"}, r"calibration_reference='current'"),
        ({"calibration_refresh_margin": None}, r"calibration_refresh_margin=None"),
        ({"calibration_refresh_every": 2}, r"calibration_refresh_every=2"),
        ({"score_answer_end": False}, r"score_answer_end=False"),
        ({"keep_best_state": True, "stop_on_violation": False}, r"keep_best_state=True"),
        ({"running_probe": False}, r"running_probe=False"),
        ({"retain_probe": "every_probe"}, r"retain_probe='every_probe'"),
        ({"stop_target": "calibration", "calibration_auc_slack": 0.1}, r"calibration_auc_slack with stop_target="),
    ],
)
def test_a_retired_study_option_still_works_and_warns(setting, named):
    with pytest.warns(FutureWarning, match=named + r".* is deprecated and will be removed in 0\.3"):
        args = config(method="masc", **setting)
    assert all(getattr(args, name) == value for name, value in setting.items())


@pytest.mark.parametrize(
    ("name", "key", "value"),
    [
        ("continuation_cut_min_ratio", "cut_min_ratio", 0.1),
        ("continuation_cut_max_ratio", "cut_max_ratio", 0.5),
        ("continuation_min_prefix_tokens", "min_prefix_tokens", 8),
        ("continuation_min_suffix_tokens", "min_suffix_tokens", 4),
    ],
)
def test_a_continuation_flag_sets_its_forget_scoring_option_and_warns(name, key, value):
    with pytest.warns(FutureWarning, match=rf'{name} is deprecated .*forget_scoring_kwargs={{"{key}": {value}}}'):
        args = config(method="masc", forget_scoring="continuation", **{name: value})
    assert args.forget_scoring_kwargs == {key: value} and getattr(args, name) is None
    assert getattr(ContinuationScoring.from_config(args), CUT_FIELDS[key]) == value
    with pytest.raises(ValueError, match=f"{name}={value!r} and forget_scoring_kwargs"):
        config(method="masc", forget_scoring_kwargs={key: value + 1}, **{name: value})


#: forget_scoring_kwargs key -> ContinuationScoring field
CUT_FIELDS = {
    "cut_min_ratio": "min_ratio",
    "cut_max_ratio": "max_ratio",
    "min_prefix_tokens": "min_prefix_tokens",
    "min_suffix_tokens": "min_suffix_tokens",
}


def test_the_warning_points_at_the_line_that_made_the_config():
    """The FutureWarning names the user's line (here, this file), not a frame inside the library."""
    with pytest.warns(FutureWarning, match="score_answer_end") as caught:
        config(method="masc", score_answer_end=False)
    assert [w.filename for w in caught if "score_answer_end" in str(w.message)] == [__file__]


def test_the_kept_values_of_the_study_options_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        config(method="masc", calibration_match="rank", stop_target="membership", calibration_auc_slack=0.1)
        config(method="masc", stop_target="calibration")


@pytest.mark.parametrize("name", ["restricted_margin", "token_levels", "hoeffding_upper_bound", "token_log_probs"])
def test_the_old_margin_module_still_resolves_each_name_and_warns(name):
    """MASC moved into hf_unlearn.objectives.masc (issue 56): the old module resolves each of its names to the very
    object of the new module, with a FutureWarning naming where it lives now."""
    import importlib

    from hf_unlearn.objectives import margin as old

    with pytest.warns(FutureWarning, match=rf"moved to {old.MOVED[name]}\.{name}.*removed in 0\.3"):
        value = getattr(old, name)
    assert value is getattr(importlib.import_module(old.MOVED[name]), name)
    with pytest.raises(AttributeError):
        old.no_such_name  # noqa: B018
