"""MASC's options: the fields of :class:`MascArguments` (which :class:`~hf_unlearn.UnlearnConfig` inherits), the
values each may take, and their checks. The defaults are the paper's mode, whole: ``masc_threshold='rho'`` and
``stop_target='alpha'`` read no calibration set (arXiv 2606.02920 §3). Ours is asked for by name:
``masc_threshold='calibration'`` and ``stop_target='membership'`` (or ``'calibration'``) with a calibration set, each
token's threshold and the stop from never-seen data (listed by :func:`~.loss.masc_beyond_paper`). Why the paper's
mode is the default: no measurement says otherwise (docs/studies/judge_size.md: on data that chose nothing neither
lands, ours under-unlearning and the paper's damaging), and ours needs a calibration set a default cannot assume."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import logging

from ..registry import check_one_of
from .margin import COMPETITOR_SOURCES, threshold_from_probability
from .probe import calibration_sample_size
from .stopping import DEFAULT_MEMBERSHIP_AUC_SLACK

logger = logging.get_logger(__name__)

#: The options of MASC's restricted margin and hinge, which no other forget objective reads (``hf-unlearn run
#: --method npo --help`` leaves them out); the stopping rule's and the retain guard's work with every objective.
MARGIN_OPTIONS = (
    "masc_k",
    "masc_beta",
    "masc_rho",
    "masc_eta",
    "masc_threshold",
    "masc_hinge",
    "calibration_match",
    "competitor_source",
    "competitor_delta",
    "masc_rival_kl",
    "masc_rival_temperature",
    "match_prompt_copies",
)

STOP_PROBES = ("train", "holdout")
STOP_TARGETS = ("alpha", "calibration", "membership")
MASC_THRESHOLDS = ("rho", "calibration")
MASC_HINGES = ("one_sided", "two_sided")
CALIBRATION_MATCHES = ("rank", "id_spread")


@dataclass
class MascArguments:
    r"""
    MASC's parameters, a part of [`~hf_unlearn.UnlearnConfig`] (which inherits them, so they come first among its
    own fields). The defaults follow the TOFU / Qwen2.5 row of the MASC paper (Di Gennaro et al., arXiv 2606.02920:
    rho 0.5, eta 0.5, k 10 self-competitors, beta 1); what goes beyond the paper says so.

    Parameters:

    > Parameters that control MASC's restricted margin and hinge (§3)

        masc_k (`int`, *optional*, defaults to `10`):
            MASC: number of competitor tokens k in the restricted margin.
        masc_beta (`float`, *optional*, defaults to `1.0`):
            MASC: inverse temperature beta of the margin.
        masc_rho (`float`, *optional*, defaults to `0.5`):
            MASC: restricted-posterior threshold rho; the margin threshold is tau = log(rho/(1-rho)).
        masc_eta (`float`, *optional*, defaults to `0.5`):
            MASC: hinge buffer eta; the hinge is relu(m-(tau-eta))/eta.
        masc_threshold (`str`, *optional*, defaults to `"rho"`):
            MASC: the hinge's threshold tau. 'rho': log(rho/(1-rho)) for every token, as in the paper. 'calibration'
            (beyond the paper; needs the trainer's calibration_dataset, never trained on): each forget token's
            never-seen counterpart there (see calibration_match), so margins go down to never-seen levels, not below.
        masc_hinge (`str`, *optional*, defaults to `"two_sided"`):
            MASC with masc_threshold='calibration': 'one_sided' (the paper's hinge, pushing each token down to tau -
            eta) or 'two_sided' (beyond the paper: zero between tau - eta and tau, so a token stops at its never-seen
            counterpart and one that fell below it is pulled back). With 'rho' the hinge is one-sided.
        calibration_match (`str`, *optional*, defaults to `"id_spread"`):
            How a forget token finds its never-seen counterpart (calibrated threshold and stop): 'rank' (the paper's
            quantile matching: the never-seen margin at its rank) or 'id_spread' (beyond the paper: a token the
            never-seen answers use too gets its id's mean never-seen margin plus that id's never-seen spread at its
            rank; the forget answers' own words are matched by rank to theirs; docs/studies/masc_landing.md).
        competitor_source (`str`, *optional*, defaults to `"self"`):
            MASC: who picks the k competitors: 'self' (current model, used for TOFU) or 'teacher' (the frozen start
            model, used for MUSE News).
        competitor_delta (`float` or `None`, *optional*, defaults to `None`):
            MASC, teacher source: keep only competitors within delta logits of the best (e.g. 0.5).
        masc_rival_kl (`float` or `None`, *optional*, defaults to `None`):
            MASC (beyond the paper): weight of a KL term that keeps, at every forget answer token, the model's
            distribution over the *other* tokens (the target left out and the rest renormalised) where the frozen
            start model has it, so the hinge may lower the forgotten token but not make one frequent rival (a year,
            a word piece) the answer everywhere. Needs the start model's logits (one more forward of the forget batch).
            None: 5 with a calibrated threshold (masc_threshold resolved to 'calibration'), 0 with the paper's tau.
        masc_rival_temperature (`float`, *optional*, defaults to `1.0`):
            MASC (beyond the paper), with masc_rival_kl: the temperature of the start model's distribution over the
            other tokens that the KL holds the model to. Below 1 it is sharper, so that what takes the forgotten
            token's place is as confident as a model that never saw the answer is at that position, not as
            uncertain as the start model's leftover mass (docs/studies/attack_landing.md).
        match_prompt_copies (`bool`, *optional*, defaults to `False`):
            MASC with masc_threshold='calibration' (beyond the paper): a forget token that repeats the prompt (each
            token of a pair of consecutive answer tokens the prompt also holds: the author's name a question spells)
            is matched with the calibration answers' tokens that repeat their prompts, the other tokens with the
            other calibration tokens (see calibration_match), so a copied name is held where a model copies a name it
            never learned, not pushed down with the facts (docs/studies/prompt_copies.md).

    > Parameters that control the stopping rule (§3, and the calibrated target)

        stop_at_target (`bool` or `None`, *optional*, defaults to `None`):
            Stop training at the first probe that meets stop_target. Default: True for a method whose objective stops
            itself (masc), False otherwise (the probe still measures and logs).
        stop_target (`str`, *optional*, defaults to `"alpha"`):
            When the run is done: 'alpha' (the paper's: the forget violation rate <= stop_alpha), 'calibration'
            (beyond the paper: the forget answers' margins no higher than those of the trainer's calibration_dataset,
            never-trained examples of the same kind: calibration gap <= calibration_slack) or 'membership' (beyond the
            paper: Min-K% AUC of forget against calibration answers >= 0.5 - calibration_auc_slack; it reads that AUC
            to within 0.1 only from about 20 answers of each, and warns with fewer).
        stop_alpha (`float`, *optional*, defaults to `0.2`):
            stop_target='alpha': stop once the violation rate of the probe <= alpha.
        calibration_slack (`float`, *optional*, defaults to `0.5`):
            stop_target='calibration': stop once the calibration gap (the mean excess, in logits, of the forget
            answers' margins over their never-seen counterparts, see calibration_match) is at most this.
        calibration_auc_slack (`float` or `None`, *optional*, defaults to `None`):
            stop_target='membership' (beyond the paper): stop once the Min-K% (k 0.4) AUC of the stop's forget sample
            (up to probe_size answers trained on) against the calibration answers, both read at the current weights,
            reaches 0.5 - this (None: 0.05).
        probe_interval (`int`, *optional*, defaults to `5`):
            Measure the violation rate every this many optimizer steps (0 disables probing).
        stop_probe (`str`, *optional*, defaults to `"train"`):
            Which forget examples the stopping rule measures: 'train' (a fixed sample of the forget examples being
            trained on) or 'holdout' (a held-out part of the forget set, never trained on).
        holdout_fraction (`float` or `None`, *optional*, defaults to `None`):
            Fraction of the forget set held out of training and probed. Default: 0.1 when stop_probe='holdout', else 0
            (set it with stop_probe='train' to log both rates).
        probe_size (`int`, *optional*, defaults to `64`):
            At most this many forget (and retain) examples are probed each time.
        violation_bound_delta (`float` or `None`, *optional*, defaults to `None`):
            stop_target='alpha': stop only when the one-sided Hoeffding upper bound of the violation rate, at
            confidence 1 - delta union-bounded over probes, is <= stop_alpha (e.g. 0.05). None: the rate itself, as in
            the paper.
        self_stop_max_steps (`int`, *optional*, defaults to `1000`):
            Budget of a run that stops itself (stop_at_target) when neither max_steps nor num_train_epochs is given:
            at most this many optimizer steps.

    > Parameters that guard the retain side

        utility_floor (`float` or `None`, *optional*, defaults to `0.25`):
            Stop as a failure when the retain answer probability at a probe falls below this fraction of its value at
            the start of training (0 or `None`: off; needs a retain set). The default is meant to catch a collapse, not
            the transient dip of a large learning rate's first steps (docs/studies/calibrated_target.md).
        restore_on_failure (`bool`, *optional*, defaults to `True`):
            When the utility floor stops a run, put back the weights of the last probe above the floor (a copy of the
            trainable parameters is kept in host memory: small for LoRA, up to two model copies for full fine-tuning,
            the last certified state and the candidate a retain screen passed).
    """

    # Parameters that control MASC's restricted margin and hinge (§3)
    masc_k: int = field(default=10, metadata={"help": "MASC: number of competitor tokens k in the restricted margin."})
    masc_beta: float = field(default=1.0, metadata={"help": "MASC: inverse temperature beta of the margin."})
    masc_rho: float = field(
        default=0.5,
        metadata={"help": "MASC: restricted-posterior threshold rho; the margin threshold is tau = log(rho/(1-rho))."},
    )
    masc_eta: float = field(
        default=0.5, metadata={"help": "MASC: hinge buffer eta; the hinge is relu(m-(tau-eta))/eta."}
    )
    masc_threshold: str = field(
        default="rho",
        metadata={"help": "MASC: the hinge's threshold: 'rho' (the paper's) or 'calibration' (never-seen; ours)."},
    )
    masc_hinge: str = field(
        default="two_sided",
        metadata={"help": "MASC with a calibrated threshold: 'one_sided' (the paper's) or 'two_sided' (beyond it)."},
    )
    calibration_match: str = field(
        default="id_spread",
        metadata={"help": "How a forget token finds its never-seen match: 'rank' (the paper's) or 'id_spread'."},
    )
    competitor_source: str = field(
        default="self",
        metadata={"help": "MASC: who picks the k competitors: 'self' (current model) or 'teacher' (start model)."},
    )
    competitor_delta: float | None = field(
        default=None,
        metadata={"help": "MASC, teacher source: keep only competitors within delta logits of the best (e.g. 0.5)."},
    )
    masc_rival_kl: float | None = field(
        default=None,
        metadata={"help": "MASC (beyond the paper): weight of a KL holding the other tokens' distribution at start."},
    )
    masc_rival_temperature: float = field(
        default=1.0,
        metadata={
            "help": "MASC (beyond the paper): temperature of the start distribution the rival KL holds (<1: sharper)."
        },
    )
    match_prompt_copies: bool = field(
        default=False,
        metadata={"help": "MASC, calibrated: match tokens that repeat the prompt with never-seen ones that do."},
    )

    # Parameters that control the stopping rule (§3, and the calibrated target)
    stop_at_target: bool | None = field(
        default=None,
        metadata={"help": "Stop once the probe meets the stop target. Default: True for masc, else False."},
    )
    stop_target: str = field(
        default="alpha",
        metadata={"help": "When the run is done: 'alpha' (the paper's), 'calibration' or 'membership' (beyond it)."},
    )
    stop_alpha: float = field(
        default=0.2, metadata={"help": "stop_target='alpha': stop once the violation rate of the probe <= alpha."}
    )
    calibration_slack: float = field(
        default=0.5,
        metadata={"help": "stop_target='calibration': stop once the calibration gap (in logits) is at most this."},
    )
    calibration_auc_slack: float | None = field(
        default=None,
        metadata={
            "help": "stop_target='membership': stop at Min-K%% AUC (forget vs calibration) >= 0.5 - this (None: 0.05)."
        },
    )
    probe_interval: int = field(
        default=5,
        metadata={"help": "Measure the violation rate every this many optimizer steps (0 disables probing)."},
    )
    stop_probe: str = field(
        default="train", metadata={"help": "Which forget examples the stop measures: 'train' or 'holdout'."}
    )
    holdout_fraction: float | None = field(
        default=None,
        metadata={"help": "Fraction of the forget set held out and probed (default 0.1 with holdout, else 0)."},
    )
    probe_size: int = field(
        default=64,
        metadata={"help": "At most this many forget (and retain) examples are probed each time."},
    )
    violation_bound_delta: float | None = field(
        default=None,
        metadata={
            "help": "stop_target='alpha': stop only when the violation rate's Hoeffding upper bound at confidence "
            "1 - this (union-bounded over probes) is <= stop_alpha. None: the rate itself (the paper's)."
        },
    )
    self_stop_max_steps: int = field(
        default=1000,
        metadata={"help": "Budget in optimizer steps of a self-stopping run given neither max_steps nor epochs."},
    )

    # Parameters that guard the retain side
    utility_floor: float | None = field(
        default=0.25,
        metadata={"help": "Stop as a failure below this fraction of the start's retain probability (0/None: off)."},
    )
    restore_on_failure: bool = field(
        default=True,
        metadata={"help": "When the utility floor stops a run, put back the last weights above the floor."},
    )

    @property
    def masc_tau(self) -> float:
        """Margin threshold ``tau = log(rho / (1 - rho))`` (MASC §3)."""
        return threshold_from_probability(self.masc_rho)


#: ``masc_rival_kl``'s weight with a calibrated threshold: 5 and 10 land the demo on 3 of 3 seeds (3 on 2, 20 and 30 do
#: not stop within the budget); with the Min-K% stop, 5 is the weight that landed TOFU (docs/studies/masc_landing.md,
#: sections 4 and 13-15).
DEFAULT_MASC_RIVAL_KL = 5.0


#: The Min-K% stop reads its AUC to within the never-trained region's tolerance (0.1) only from about 20 answers a
#: side; with fewer (one author's five, a user's ten facts) it warns (docs/studies/masc_landing.md, 15).
MEMBERSHIP_AUC_MAX_SPREAD = 0.1


def membership_auc_spread(forget_size: int, calibration_size: int) -> float:
    """The standard deviation of an AUC between ``forget_size`` and ``calibration_size`` scores drawn from one
    distribution (Hanley & McNeil 1982, at AUC 0.5): how finely the Min-K% stop can read 'never seen' at all."""
    return math.sqrt((forget_size + calibration_size + 1) / (12 * forget_size * calibration_size))


#: Ours, beyond the paper, as the demo and compare ask for it with a calibration set: each token's threshold and the
#: Min-K% stop from never-seen data (docs/stopping.md). With fewer than about 20 answers a side (one author's ten
#: facts, the chronicles' eight texts) the demo asks for the calibration gap instead (``stop_target='calibration'``).
CALIBRATED_MODE = {"masc_threshold": "calibration", "stop_target": "membership"}


def reads_calibration(args: Any) -> bool:
    """Whether a run with ``args`` reads a calibration set (ours, beyond the paper): a calibrated threshold or a
    calibrated stop."""
    return args.masc_threshold == "calibration" or args.stop_target in ("calibration", "membership")


def check_calibration_use(args: Any, has_calibration: bool) -> None:
    """Refuse a calibrated setting without a calibration set, and a calibration set that nothing reads (the paper's
    mode), each naming the options that would fix it; jobs call it before any measurement, the trainer before any
    weight changes."""
    if args.stop_target in ("calibration", "membership") and not has_calibration:
        raise ValueError(
            f"stop_target={args.stop_target!r} compares the forget set with data the model never trained on: pass "
            "calibration_dataset=... (same kind of examples, tokenized the same way), or stop_target='alpha'."
        )
    if args.masc_threshold == "calibration" and not has_calibration:
        raise ValueError(
            "masc_threshold='calibration' takes each token's threshold from data the model never trained on: "
            "pass calibration_dataset=..., or masc_threshold='rho'."
        )
    if has_calibration and not reads_calibration(args):
        raise ValueError(
            f"calibration_dataset is given, but masc_threshold={args.masc_threshold!r} with stop_target="
            f"{args.stop_target!r} is the MASC paper's mode, which reads no never-seen data: set "
            "masc_threshold='calibration' and stop_target='membership' (or 'calibration') to use it, or leave it out."
        )


def resolved_for_data(
    args: Any, has_calibration: bool, forget_size: int | None = None, calibration_size: int | None = None
) -> Any:
    """A copy of ``args`` with the settings whose default depends on another filled in: ``masc_rival_kl`` (5 with
    ``masc_threshold='calibration'``, 0 with the paper's tau) and ``calibration_auc_slack`` (0.05 with the Min-K%
    stop). The caller's config is left as it was. A calibrated setting without a calibration set is refused, a
    calibration set that nothing reads too; the Min-K% stop warns when ``forget_size`` forget and
    ``calibration_size`` calibration answers read its AUC no finer than :data:`MEMBERSHIP_AUC_MAX_SPREAD`."""
    check_calibration_use(args, has_calibration)
    resolved = copy.copy(args)
    if args.stop_target == "membership" and forget_size and calibration_size:
        spread = membership_auc_spread(forget_size, calibration_size)
        if spread > MEMBERSHIP_AUC_MAX_SPREAD:
            logger.warning(
                f"UnlearnTrainer: stop_target='membership' reads the Min-K% AUC of {forget_size} forget against "
                f"{calibration_size} calibration answers only to ±{spread:.2f}, wider than "
                f"{MEMBERSHIP_AUC_MAX_SPREAD}: more of either, or stop_target='calibration' (the calibration gap)."
            )
    if resolved.stop_target == "membership" and args.calibration_auc_slack is None:
        resolved.calibration_auc_slack = DEFAULT_MEMBERSHIP_AUC_SLACK
    if args.masc_rival_kl is None:
        # Measured with the calibrated threshold only (docs/studies/masc_landing.md, section 4); the paper's fixed tau
        # pushes every margin below it, which the KL slows by far (the paper's mode stays the paper's).
        resolved.masc_rival_kl = DEFAULT_MASC_RIVAL_KL if resolved.masc_threshold == "calibration" else 0.0
    return resolved


def check_masc(config: Any) -> None:
    """MASC's restricted margin and hinge."""
    check_one_of(
        config,
        (
            ("competitor_source", COMPETITOR_SOURCES),
            ("calibration_match", CALIBRATION_MATCHES),
            ("masc_hinge", MASC_HINGES),
            ("masc_threshold", MASC_THRESHOLDS),
        ),
    )
    if config.masc_k < 1:
        raise ValueError(f"masc_k must be at least 1, got {config.masc_k}.")
    if config.masc_eta <= 0:
        raise ValueError(f"masc_eta must be positive, got {config.masc_eta}.")
    weight = config.masc_rival_kl
    if weight is not None and (not weight >= 0 or weight == float("inf")):  # NaN fails the first test
        raise ValueError(f"masc_rival_kl must be a finite number >= 0 (0 turns it off) or None, got {weight}.")
    temperature = config.masc_rival_temperature
    if not 0 < temperature < float("inf"):  # NaN fails it too
        raise ValueError(
            f"masc_rival_temperature must be a finite number > 0 (1: the start model's), got {temperature}."
        )
    threshold_from_probability(config.masc_rho)  # validates rho
    if config.match_prompt_copies and config.masc_threshold != "calibration":
        raise ValueError(
            "match_prompt_copies matches the forget tokens that repeat the prompt with never-seen ones: it needs "
            f"masc_threshold='calibration' (got {config.masc_threshold!r})."
        )
    if config.match_prompt_copies and config.stop_target == "calibration":
        raise ValueError(
            "match_prompt_copies is not read by stop_target='calibration' (its running calibration gap matches "
            "every token alike): use stop_target='membership', or leave match_prompt_copies off."
        )


def check_stopping(config: Any) -> None:
    """The stopping rule and its probes; ``holdout_fraction`` completed (0.1 with ``stop_probe='holdout'``, else 0)."""
    check_one_of(
        config,
        (
            ("stop_probe", STOP_PROBES),
            ("stop_target", STOP_TARGETS),
        ),
    )
    if not 0.0 <= config.stop_alpha <= 1.0:
        raise ValueError(f"stop_alpha is a rate and must be in [0, 1], got {config.stop_alpha}.")
    delta = config.violation_bound_delta
    if delta is not None and not 0.0 < delta < 1.0:
        raise ValueError(f"violation_bound_delta is 1 - a confidence level and must be in (0, 1), got {delta}.")
    if delta is not None and config.stop_target != "alpha":
        raise ValueError(
            f"violation_bound_delta bounds the violation rate (stop_target='alpha'); stop_target="
            f"{config.stop_target!r} does not read it."
        )
    if config.calibration_auc_slack is not None and not 0.0 <= config.calibration_auc_slack <= 0.5:
        raise ValueError(
            f"calibration_auc_slack is an AUC distance and must be in [0, 0.5], got {config.calibration_auc_slack}."
        )
    if config.stop_target == "calibration" and config.calibration_auc_slack is not None:
        raise ValueError(
            "calibration_auc_slack is the Min-K% stop's (stop_target='membership'); stop_target='calibration' reads "
            "the calibration gap alone (calibration_slack)."
        )
    if config.probe_interval < 0:
        raise ValueError(f"probe_interval must be >= 0, got {config.probe_interval}.")
    if config.holdout_fraction is None:
        config.holdout_fraction = 0.1 if config.stop_probe == "holdout" else 0.0
    if config.stop_probe == "holdout" and config.holdout_fraction == 0:
        raise ValueError("stop_probe='holdout' needs holdout_fraction > 0.")
    if config.stop_at_target and config.probe_interval == 0:
        raise ValueError("stop_at_target needs probe_interval > 0.")


def check_retain_guard(config: Any) -> None:
    """The utility floor is a fraction of the start's retain probability."""
    if config.utility_floor is not None and not 0 <= config.utility_floor < 1:
        raise ValueError(
            f"utility_floor is a fraction of the start's retain probability and must be in [0, 1), got "
            f"{config.utility_floor}."
        )


def resolved_for_run(args: Any, forget: Any, calibration: Any) -> Any:
    """``args`` resolved for a trainer's ``forget`` and ``calibration`` data (:func:`resolved_for_data`, reading as
    many calibration answers as the probes measure)."""
    sizes = [len(data) if hasattr(data, "__len__") else None for data in (forget, calibration)]
    if sizes[1] is not None:
        sizes[1] = min(sizes[1], calibration_sample_size(args))  # the answers the probes measure
    return resolved_for_data(args, calibration is not None, *sizes)
