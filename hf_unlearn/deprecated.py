"""The options of :class:`~hf_unlearn.training.config.UnlearnConfig` on their way out. Each one still works, warns with
a ``FutureWarning`` that names its replacement and :data:`REMOVED_IN`, the version that removes it, and is no longer
in the docs' option tables.

* The baselines' former flags (``npo_beta``, ``rmu_layer``, ...) are aliases of the hyperparameters their objectives
  declare in their registrations: a value given to one is moved into ``forget_loss_kwargs`` (``retain_loss_kwargs``
  for PDU's retain term) when the run's objective declares it, and is otherwise unused, as it always was
  (:func:`merge_aliases`).
* ``continuation_cut_min_ratio``, ``continuation_cut_max_ratio``, ``continuation_min_prefix_tokens`` and
  ``continuation_min_suffix_tokens``: aliases of the options of ``forget_scoring_kwargs``
  (:func:`merge_scoring_aliases`).
* Options and values that only a study used, none of which a default, an example, a recommendation of the docs or a
  supported path reads (:func:`warn_retired`); what they did is in the MASC landing study's "What was tried and
  failed" table."""

from __future__ import annotations

import json
import os
import sys
import warnings
from dataclasses import field
from typing import Any, NamedTuple

#: The version that removes what this module deprecates.
REMOVED_IN = "0.3"


class Alias(NamedTuple):
    """A deprecated ``UnlearnConfig`` field that sets the declared hyperparameter ``key`` of the ``objectives`` (the
    first is the one its replacement names; ``part`` says which kwargs hold it); ``what`` says what it sets."""

    part: str
    objectives: tuple[str, ...]
    key: str
    what: str


#: Deprecated field -> the declared hyperparameter it sets, and what it sets (its help).
ALIASES: dict[str, Alias] = {
    "npo_beta": Alias("forget", ("npo",), "beta", "NPO's inverse temperature beta (0.1)."),
    "simnpo_beta": Alias("forget", ("simnpo",), "beta", "SimNPO's inverse temperature beta (4.5)."),
    "simnpo_delta": Alias("forget", ("simnpo",), "delta", "SimNPO's reward margin delta (0)."),
    "dpo_beta": Alias("forget", ("idk_dpo",), "beta", "IdkDPO's (DPO) inverse temperature beta (0.1)."),
    "undial_beta": Alias("forget", ("undial",), "beta", "UNDIAL: how far the target token's logit is lowered (10)."),
    "wga_beta": Alias("forget", ("wga",), "beta", "WGA: exponent of the token-probability weight p^beta (1)."),
    "satimp_beta1": Alias("forget", ("satimp",), "beta1", "SatImp: exponent of the saturation weight p^beta1 (5)."),
    "satimp_beta2": Alias(
        "forget", ("satimp",), "beta2", "SatImp: exponent of the importance weight (1 - p)^beta2 (1)."
    ),
    "ceu_ignore_first_n_answer_tokens": Alias(
        "forget",
        ("ce_u",),
        "ignore_first_n_answer_tokens",
        "CE-U: answer tokens at the start of each answer that are not unlearned (1).",
    ),
    "altpo_beta": Alias("forget", ("altpo",), "beta", "AltPO's (DPO) inverse temperature beta (0.1)."),
    "pdu_epsilon": Alias(
        "retain",
        ("pdu_dual",),
        "epsilon",
        "PDU: the bound on the retain loss (None: (1 + epsilon_slack) x the first step's).",
    ),
    "pdu_epsilon_slack": Alias(
        "retain",
        ("pdu_dual",),
        "epsilon_slack",
        "PDU: relative slack of the default epsilon over the starting retain loss (0.1).",
    ),
    "pdu_dual_init": Alias(
        "retain", ("pdu_dual",), "dual_init", "PDU: initial value of the dual variable lambda (1)."
    ),
    "pdu_dual_step": Alias("retain", ("pdu_dual",), "dual_step", "PDU: step size of the dual ascent on lambda (1)."),
    "pdu_dual_warmup_steps": Alias(
        "retain", ("pdu_dual",), "dual_warmup_steps", "PDU: optimizer steps before lambda starts to move (0)."
    ),
    "rmu_layer": Alias(
        "forget",
        ("rmu", "rmu_retain"),
        "layer",
        "RMU: decoder layer steered (None: 7, or the second-to-last; also the retain term's).",
    ),
    "rmu_trainable_layers": Alias(
        "forget",
        ("rmu",),
        "trainable_layers",
        "RMU: layers whose MLP weights train (None: the steered layer and the two before it).",
    ),
    "rmu_steering_coefficient": Alias(
        "forget", ("rmu",), "steering_coefficient", "RMU: norm c of the random target direction c * u (6.5)."
    ),
    # () : every objective that declares the key (each objective with needs_refusal / needs_alternate does)
    "refusal_answers": Alias(
        "forget", (), "refusal_answers", "IdkDPO: the refusals preferred over forget answers (a few 'I don't know')."
    ),
    "alternate_column": Alias(
        "forget",
        (),
        "alternate_column",
        "AltPO: the forget records' column of alternative answers (perturbed_answer).",
    ),
}


def alias_field(name: str) -> Any:
    """The dataclass field of the deprecated alias ``name`` (default ``None``): its help names the replacement
    first, then what it sets."""
    alias = ALIASES[name]
    replacement = f'{alias.part}_loss_kwargs={{"{alias.key}": ...}}'
    return field(
        default=None, metadata={"help": f"Deprecated (removed in {REMOVED_IN}): use {replacement}. {alias.what}"}
    )


#: Deprecated field -> the key of ``forget_scoring_kwargs`` it sets (the continuation cut of
#: ``forget_scoring='continuation'``; defaults in ``hf_unlearn.data.pairing.CONTINUATION_DEFAULTS``).
SCORING_ALIASES: dict[str, str] = {
    "continuation_cut_min_ratio": "cut_min_ratio",
    "continuation_cut_max_ratio": "cut_max_ratio",
    "continuation_min_prefix_tokens": "min_prefix_tokens",
    "continuation_min_suffix_tokens": "min_suffix_tokens",
}


def scoring_alias_field(name: str) -> Any:
    """The dataclass field of the deprecated continuation flag ``name`` (default ``None``)."""
    return field(
        default=None,
        metadata={
            "help": f"Deprecated (removed in {REMOVED_IN}): use "
            f'forget_scoring_kwargs={{"{SCORING_ALIASES[name]}": ...}}. The continuation cut\'s option.'
        },
    )


def merge_scoring_aliases(config: Any) -> None:
    """Each deprecated ``continuation_*`` flag ``config`` sets: a ``FutureWarning``, and its value moved into
    ``forget_scoring_kwargs`` (the flag then reads ``None``); the same option given both ways with different values is
    refused."""
    for name, key in SCORING_ALIASES.items():
        value = getattr(config, name)
        if value is None:
            continue
        warn_deprecated(name, f"use forget_scoring_kwargs={json.dumps({key: value})}")
        given = config.forget_scoring_kwargs or {}
        if key in given and given[key] != value:
            raise ValueError(
                f"{name}={value!r} and forget_scoring_kwargs[{key!r}]={given[key]!r} set the same option to different "
                f"values: keep forget_scoring_kwargs ({name} is deprecated)."
            )
        config.forget_scoring_kwargs = {**given, key: value}
        setattr(config, name, None)


def warn_deprecated(name: str, replacement: str) -> None:
    """The one ``FutureWarning`` of a deprecated option: its name, ``replacement`` and the version that removes it,
    shown at the first caller outside this package (the line that made the config or the trainer)."""
    package = os.path.dirname(os.path.abspath(__file__))  # hf_unlearn/
    frame, level = sys._getframe(0), 1
    while frame is not None and (
        frame.f_code.co_filename.startswith(package) or frame.f_code.co_filename == "<string>"
    ):
        frame, level = frame.f_back, level + 1  # "<string>": the dataclass's generated __init__
    warnings.warn(
        f"UnlearnConfig: {name} is deprecated and will be removed in {REMOVED_IN}: {replacement}.",
        FutureWarning,
        stacklevel=level,
    )


def merge_aliases(config: Any) -> None:
    """Each deprecated alias ``config`` sets: a ``FutureWarning``, and its value moved into the kwargs of the part of
    the run whose objective declares its hyperparameter (the alias then reads ``None``). The same hyperparameter given
    both ways with different values is refused. An alias for an objective the run does not use stays unused."""
    from .objectives.registry import FORGET_OBJECTIVES, RETAIN_OBJECTIVES  # the registry imports this module's users

    objectives = dict(zip(("forget", "retain"), config.objectives))
    registries = {"forget": FORGET_OBJECTIVES, "retain": RETAIN_OBJECTIVES}
    for name, alias in ALIASES.items():
        value = getattr(config, name)
        if value is None:
            continue
        parts = [
            part
            for part, objective in objectives.items()
            if objective in alias.objectives
            or (not alias.objectives and alias.key in getattr(registries[part].get(objective), "declared", {}))
        ]
        unused = "" if parts else f" (unused here: this run's objectives are {config.objectives})"
        warn_deprecated(name, f"use {alias.part}_loss_kwargs={json.dumps({alias.key: value})}{unused}")
        for part in parts:
            option = f"{part}_loss_kwargs"
            given = getattr(config, option) or {}
            if alias.key in given and given[alias.key] != value:
                raise ValueError(
                    f"{name}={value!r} and {option}[{alias.key!r}]={given[alias.key]!r} set the same hyperparameter "
                    f"of {objectives[part]!r} to different values: keep {option} ({name} is deprecated)."
                )
            setattr(config, option, {**given, alias.key: value})
        if parts:
            setattr(config, name, None)


#: Where the retired study options' measurements are recorded.
STUDY = "docs/studies/masc_landing.md, 'What was tried and failed'"

#: Options that no default, example, recommendation of the docs or supported path uses (all but one only a study
#: did): the field, the one value kept (any other warns) and what to do instead.
RETIRED_OPTIONS: dict[str, tuple[Any, str]] = {
    "calibration_reference": ("start", f"the never-seen margins measured before unlearning ({STUDY})"),
    "calibration_refresh_margin": (1.0, f"it is read only with calibration_reference='current' ({STUDY})"),
    "calibration_refresh_every": (4, f"it is read only with calibration_reference='current' ({STUDY})"),
    "score_answer_end": (True, f"an answer's closing tokens are scored, as in the MASC paper ({STUDY})"),
    "keep_best_state": (False, "stop_on_violation=True ends the run at the first probe that meets the target"),
    "running_probe": (True, "the 'train' probe reads the training forwards (a model with dropout gets the forward)"),
    "retain_probe": ("screen", "the retain batches screen the floor and the fixed sample decides each failure"),
}
#: ``calibration_match`` values that only a study used; 'id_spread' (the default) and 'rank' (the paper's) stay.
RETIRED_CALIBRATION_MATCHES = ("token", "token_spread", "prompt")


def warn_retired(config: Any) -> None:
    """A ``FutureWarning`` for each retired study option ``config`` sets (:data:`RETIRED_OPTIONS`, the
    :data:`RETIRED_CALIBRATION_MATCHES`, and ``calibration_auc_slack`` as a second condition of the calibration gap's
    stop); each still works until :data:`REMOVED_IN`."""
    for name, (kept, instead) in RETIRED_OPTIONS.items():
        if getattr(config, name) != kept:
            warn_deprecated(f"{name}={getattr(config, name)!r}", f"leave it at {kept!r}: {instead}")
    if config.calibration_match in RETIRED_CALIBRATION_MATCHES:
        warn_deprecated(
            f"calibration_match={config.calibration_match!r}", f"use 'id_spread' (the default) or 'rank' ({STUDY})"
        )
    if config.stop_target == "calibration" and config.calibration_auc_slack is not None:
        warn_auc_slack_with_gap()


def warn_auc_slack_with_gap() -> None:
    """``calibration_auc_slack`` with the calibration gap's stop (a second condition) is retired; with the Min-K%
    stop (``stop_target='membership'``) it stays."""
    warn_deprecated(
        "calibration_auc_slack with stop_target='calibration' (the Min-K% AUC as a second condition of the gap)",
        f"use stop_target='membership' for the Min-K% stop, or the gap alone ({STUDY})",
    )
