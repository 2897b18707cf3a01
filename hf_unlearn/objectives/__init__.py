"""Forget and retain objectives: small pure functions registered by name with what each one needs
(:mod:`.registry`), and MASC whole (:mod:`.masc`: its margin, which the evaluation reads too, loss, calibration, probe,
stopping rule and options). Importing the package registers every built-in objective."""

from ..scores import upcast_half
from . import classic, masc, recent, retain  # noqa: F401  (registration)
from .masc.loss import MASC_PAPER
from .masc.margin import restricted_margin, threshold_from_probability
from .registry import (
    CUSTOM_METHOD,
    FORGET_OBJECTIVES,
    METHODS,
    NORMALIZATIONS,
    RETAIN_OBJECTIVES,
    LossInputs,
    Objective,
    Paper,
    answer_nll,
    check_bounds,
    get_objective,
    log_ratio,
    mean_over_items,
    objective_hyperparameters,
    preference_margin,
    register_forget_objective,
    register_retain_objective,
    require_answer_tokens,
    resolve_hyperparameters,
    sequence_log_prob,
)

__all__ = [
    "CUSTOM_METHOD",
    "FORGET_OBJECTIVES",
    "METHODS",
    "MASC_PAPER",
    "NORMALIZATIONS",
    "RETAIN_OBJECTIVES",
    "LossInputs",
    "Objective",
    "Paper",
    "answer_nll",
    "check_bounds",
    "log_ratio",
    "mean_over_items",
    "objective_hyperparameters",
    "preference_margin",
    "require_answer_tokens",
    "resolve_hyperparameters",
    "sequence_log_prob",
    "get_objective",
    "register_forget_objective",
    "register_retain_objective",
    "restricted_margin",
    "threshold_from_probability",
    "upcast_half",
]
