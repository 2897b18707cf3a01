"""Deprecated location (removed in 0.3): MASC's margin moved to :mod:`hf_unlearn.objectives.masc.margin`, the
thresholds from never-seen data to :mod:`hf_unlearn.objectives.masc.calibration`, the stop's Hoeffding bound to
:mod:`hf_unlearn.objectives.masc.stopping`, and the token-level scores every part reads to :mod:`hf_unlearn.scores`.
Each name still resolves here, with a FutureWarning naming its new module."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

#: Where each name that this module held lives now.
MOVED = {
    **dict.fromkeys(
        (
            "COMPETITOR_SOURCES threshold_from_probability MarginResult restricted_margin masc_hinge "
            "violation_fractions exact_reproduction_bound measure_violations"
        ).split(),
        "hf_unlearn.objectives.masc.margin",
    ),
    **dict.fromkeys(
        (
            "calibrated_thresholds prompt_copies NeverSeenLevels token_levels spread_by_id deviations_by_id "
            "matched_thresholds calibration_gap"
        ).split(),
        "hf_unlearn.objectives.masc.calibration",
    ),
    "hoeffding_upper_bound": "hf_unlearn.objectives.masc.stopping",
    **dict.fromkeys(
        (
            "upcast_half shift_for_causal_lm token_log_probs min_k_count min_k_per_example leave_out_final "
            "answer_probabilities probabilities_of"
        ).split(),
        "hf_unlearn.scores",
    ),
}


def __getattr__(name: str) -> Any:
    if name not in MOVED:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(
        f"hf_unlearn.objectives.margin.{name} moved to {MOVED[name]}.{name}; the old path is removed in 0.3.",
        FutureWarning,
        stacklevel=2,
    )
    return getattr(importlib.import_module(MOVED[name]), name)
