"""MASC, margin self-correction (Di Gennaro, Shevchenko, Yang, "Fast Unlearning at Scale via Margin
Self-Correction", arXiv 2606.02920, 2026), in one place:

* :mod:`.margin`: the restricted margin, the buffered hinge and the violation statistic (§3), Proposition 1's bound;
* :mod:`.calibration`: thresholds from never-seen data (beyond the paper);
* :mod:`.loss`: the forget objective, registered as ``"masc"`` (its retain terms are :mod:`..retain`'s);
* :mod:`.probe`: what the stopping rule measures while training (:mod:`.stop_read`: the exact read a calibrated stop
  decides on; :mod:`.kept_states`: the weights the utility floor may put back; :mod:`.probe_checkpoint`: what of it
  a checkpoint keeps);
* :mod:`.stopping`: the online stopping rule and the utility floor, a ``TrainerCallback``;
* :mod:`.options`: its parameters (:class:`MascArguments`, inherited by ``UnlearnConfig``), and their checks.

``UnlearnTrainer`` only wires these together. The defaults are the paper's mode (``masc_threshold='rho'``,
``stop_target='alpha'``: no calibration set read); ours, asked for by name with a calibration set
(``masc_threshold='calibration'``, ``stop_target='membership'``), is listed by :func:`masc_beyond_paper`."""

from . import loss  # noqa: F401  (registers the "masc" objective)
from .calibration import (
    NeverSeenLevels,
    NeverSeenReference,
    calibration_gap,
    matched_thresholds,
    spread_by_id,
    token_levels,
)
from .loss import MASC_PAPER, masc_beyond_paper, masc_loss, rival_kl
from .margin import (
    MarginResult,
    exact_reproduction_bound,
    masc_hinge,
    measure_violations,
    restricted_margin,
    threshold_from_probability,
    violation_fractions,
)
from .options import MascArguments, resolved_for_data, resolved_for_run
from .probe import ProbeSets, ProbeState
from .stop_read import last_exact_read
from .stopping import ViolationStoppingCallback, hoeffding_upper_bound

__all__ = [
    "MASC_PAPER",
    "MarginResult",
    "MascArguments",
    "NeverSeenLevels",
    "NeverSeenReference",
    "ProbeSets",
    "ProbeState",
    "ViolationStoppingCallback",
    "calibration_gap",
    "exact_reproduction_bound",
    "hoeffding_upper_bound",
    "last_exact_read",
    "masc_beyond_paper",
    "masc_hinge",
    "masc_loss",
    "matched_thresholds",
    "measure_violations",
    "resolved_for_data",
    "resolved_for_run",
    "restricted_margin",
    "rival_kl",
    "spread_by_id",
    "threshold_from_probability",
    "token_levels",
    "violation_fractions",
]
