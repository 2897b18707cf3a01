"""Forget and retain objectives: small pure functions registered by name, with what each one needs.

Each objective takes :class:`LossInputs` (the current model's logits on one batch, its labels, the frozen
reference model's logits when the objective asked for them, and the config) and returns a scalar loss to
*minimise*. A registration says everything the trainer must know about an objective, so the trainer never
branches on a method name: whether it needs the reference model, hidden states or refusal answers, its
hyperparameters (they go into the run record and the model card), the methods it defines, what its mean is taken over
(answer tokens, sequences or attended tokens: the trainer counts that unit over the whole gradient-accumulation
window and all processes and passes the count as ``num_items``, as Trainer does with ``num_items_in_batch``),
the paper it comes from, and an optional ``prepare`` hook that checks the model and chooses what trains.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.utils import logging

from ..data.examples import IGNORE_INDEX
from ..scores import token_log_probs

logger = logging.get_logger(__name__)

#: What an objective's mean is taken over; the trainer counts the same unit over the accumulation window.
NORMALIZATIONS = ("answer_tokens", "sequences", "attended_tokens")


@dataclass
class LossInputs:
    """What an objective may read. ``logits`` and ``labels`` are unshifted, as the model returns them, and cover the
    positions from the batch's first predicted answer token on (the LM head runs only there), as do
    ``reference_logits``, ``attention_mask`` and ``input_ids``; an objective registered with ``needs_hidden_states``
    or ``normalized_by='attended_tokens'`` gets the whole sequence.

    ``hidden_states`` / ``reference_hidden_states`` are the per-layer tuples of ``output_hidden_states=True``
    (only for objectives registered with ``needs_hidden_states``); ``refusal`` holds the same fields for the
    batch whose answers were replaced by a refusal (only for ``needs_refusal`` objectives). ``num_items`` is the
    number of the objective's units (answer tokens, sequences, attended tokens) in the whole accumulated batch of
    every process; the loss is a sum over this batch divided by it. ``None``: this batch's own count (a plain mean).
    ``calibration_margins`` (only for objectives registered with ``needs_calibration``): the restricted margins of
    every answer token of the calibration set (data of the same kind the model never trained on), measured under the
    start model; with ``calibration_match='id_spread'``, those of the never-seen answers' own words, and
    ``calibration_levels`` (a :class:`~hf_unlearn.objectives.masc.calibration.NeverSeenLevels`) the ids the forget
    answers share with them, their mean margins and each id's spread. ``input_ids``: the batch's tokens (unshifted).
    ``prompt_copies`` (only for objectives registered with ``needs_prompt_copies``): which positions of ``labels``
    hold an answer token that repeats the prompt (:func:`~hf_unlearn.data.prompt_copies`), and
    ``calibration_copy_margins`` the start model's margins of the calibration answers' tokens that repeat theirs.
    ``margins``: set by an objective that computed the restricted margin of this batch (MASC), so that the stop's
    running read takes it instead of computing it again.
    ``hyperparameters``: the values of the hyperparameters the
    objective declared in its registration, the defaults updated with the user's ``forget_loss_kwargs`` /
    ``retain_loss_kwargs``.
    """

    logits: torch.Tensor
    labels: torch.Tensor
    config: Any
    reference_logits: torch.Tensor | None = None
    attention_mask: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    reference_hidden_states: tuple[torch.Tensor, ...] | None = None
    refusal: LossInputs | None = None
    num_items: torch.Tensor | float | None = None
    calibration_margins: torch.Tensor | None = None
    calibration_levels: tuple[torch.Tensor, ...] | None = None
    input_ids: torch.Tensor | None = None
    state: dict[str, Any] | None = None
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    prompt_copies: torch.Tensor | None = None
    calibration_copy_margins: torch.Tensor | None = None
    margins: Any = None


@dataclass(frozen=True)
class Paper:
    """Where an objective (or a gradient surgery) comes from: one entry of the citations in the model card."""

    title: str
    url: str
    authors: str = ""

    def __str__(self) -> str:
        return f"{self.authors}. {self.title}. {self.url}" if self.authors else f"{self.title}. {self.url}"


@dataclass(frozen=True)
class Objective:
    """A registered objective and what the trainer must supply for it.

    ``needs_reference(config)``: logits (and hidden states) of the frozen start model; ``needs_hidden_states``:
    ``output_hidden_states=True``; ``needs_refusal``: a second batch with refusal answers (IdkDPO); ``declared``: the
    hyperparameters it declared with their defaults (``hyperparameters={"beta": 0.1}`` at registration, as every
    built-in baseline does), set with ``forget_loss_kwargs`` / ``retain_loss_kwargs`` and read from
    :attr:`LossInputs.hyperparameters` (code outside the loss reads them with :func:`objective_hyperparameters`);
    ``hyperparameters``: the names of config fields the objective reads (``hyperparameters=("masc_k", ...)`` at
    registration: MASC's, which are ``UnlearnConfig`` fields); ``shared``: declared hyperparameters that are one value
    for the run's forget and retain objectives when both declare them (RMU's ``layer``): given in either part's kwargs,
    it holds for both; ``check(values, option)``: refuses a bad value of the declared hyperparameters by name
    (``option``: ``'forget_loss_kwargs'`` or ``'retain_loss_kwargs'``), wherever they are resolved; ``methods``: the
    ``UnlearnConfig.method`` names this forget objective defines, each with its retain objective (``"none"``: no retain
    term); ``forget_weight`` / ``retain_weight``: the weights a run with this forget objective gets unless it sets
    them; ``stops_itself``: its methods stop on the violation rate by default (``stop_at_target``);
    ``normalized_by``: one of :data:`NORMALIZATIONS`; ``prepare(model, config)``: called once before training, before
    any weight changes, to refuse a model the objective cannot work with or to choose which parameters train (it may
    write the declared values it chose for the model into the config's kwargs, as RMU does with its layers);
    ``needs_calibration(config)``: the calibration set's margins (:attr:`LossInputs.calibration_margins`);
    ``needs_prompt_copies(config)``: which answer tokens repeat the prompt (:attr:`LossInputs.prompt_copies`);
    ``needs_alternate``: a second batch whose answers are plausible alternatives from the forget records' column
    named by the declared hyperparameter ``alternate_column`` (AltPO; added to ``declared`` with the default
    :data:`DEFAULT_ALTERNATE_COLUMN`), in the same field as the refusal batch (``needs_refusal`` declares
    ``refusal_answers`` likewise, default :data:`DEFAULT_REFUSALS`); ``initial_state(config)``: the
    objective keeps state across steps (PDU's dual variable), given to it as :attr:`LossInputs.state`, updated after
    each optimizer step by ``update_state(state, config, step, across_processes)`` and saved with checkpoints (JSON
    values; keys starting with ``_`` are not saved); ``beyond_paper(config)``: the run's settings that depart from
    ``paper``, in words (the run record lists them).
    """

    name: str
    fn: Callable[[LossInputs], torch.Tensor]
    needs_reference: Callable[[Any], bool]
    paper: Paper | None = None
    hyperparameters: tuple[str, ...] = ()
    normalized_by: str = "answer_tokens"
    needs_hidden_states: bool = False
    needs_refusal: bool = False
    prepare: Callable[[Any, Any], None] | None = None
    needs_calibration: Callable[[Any], bool] = lambda _config: False
    needs_prompt_copies: Callable[[Any], bool] = lambda _config: False
    needs_alternate: bool = False
    initial_state: Callable[[Any], dict[str, Any]] | None = None
    update_state: Callable[..., None] | None = None
    declared: Mapping[str, Any] = field(default_factory=dict)
    methods: Mapping[str, str] = field(default_factory=dict)
    forget_weight: float = 1.0
    retain_weight: float = 1.0
    stops_itself: bool = False
    beyond_paper: Callable[[Any], tuple[str, ...]] = lambda _config: ()
    shared: tuple[str, ...] = ()
    check: Callable[[Mapping[str, Any], str], None] | None = None


#: The refusals an objective with ``needs_refusal`` prefers over the forget answers unless its ``refusal_answers``
#: hyperparameter names others (IdkDPO's "I don't know" forms, as open-unlearning's idk set).
DEFAULT_REFUSALS = (
    "I don't know.",
    "I'm not sure about that.",
    "I have no information about that.",
    "That is something I cannot answer.",
)
#: The forget records' column of plausible alternative answers an objective with ``needs_alternate`` reads unless its
#: ``alternate_column`` hyperparameter names another (TOFU's answers with changed facts).
DEFAULT_ALTERNATE_COLUMN = "perturbed_answer"

FORGET_OBJECTIVES: dict[str, Objective] = {}
RETAIN_OBJECTIVES: dict[str, Objective] = {}
#: ``UnlearnConfig.method`` -> (forget objective, retain objective), filled by the forget objectives' registrations
#: (``methods={"npo": "none", "npo_klr": "kl"}``); ``"none"`` means no retain term.
METHODS: dict[str, tuple[str, str]] = {}
#: The method of a run that names its own objectives (``forget_loss`` and ``retain_loss``) and nothing else.
CUSTOM_METHOD = "custom"
OPTIONS = frozenset(Objective.__dataclass_fields__) - {"name", "fn", "needs_reference", "declared"}


def _register(registry: dict[str, Objective], name: str, needs_reference: bool | Callable[[Any], bool], **options):
    if options.get("normalized_by", "answer_tokens") not in NORMALIZATIONS:
        raise ValueError(f"normalized_by must be one of {NORMALIZATIONS}, got {options['normalized_by']!r}.")
    unknown = set(options) - OPTIONS
    if unknown:
        raise TypeError(f"Unknown objective option(s) {sorted(unknown)}.")
    hyperparameters = options.pop("hyperparameters", ())
    if isinstance(hyperparameters, Mapping):
        options["declared"] = dict(hyperparameters)
    else:
        options["hyperparameters"] = tuple(hyperparameters)
    # Where the preferred answers come from is a declared hyperparameter of every objective that reads them.
    answers = {"refusal_answers": list(DEFAULT_REFUSALS)} if options.get("needs_refusal") else {}
    answers |= {"alternate_column": DEFAULT_ALTERNATE_COLUMN} if options.get("needs_alternate") else {}
    if answers:
        options["declared"] = {**answers, **options.get("declared", {})}
    methods = dict(options.pop("methods", {}))
    taken = [method for method in methods if method == CUSTOM_METHOD or METHODS.get(method, (name,))[0] != name]
    if taken:
        raise ValueError(f"Method name(s) {taken} already name another method (or '{CUSTOM_METHOD}').")

    def decorator(fn: Callable[[LossInputs], torch.Tensor]) -> Callable[[LossInputs], torch.Tensor]:
        needs = needs_reference if callable(needs_reference) else (lambda _config, value=needs_reference: value)
        registry[name] = Objective(name, fn, needs, methods=methods, **options)
        METHODS.update({method: (name, retain) for method, retain in methods.items()})
        return fn

    return decorator


def register_forget_objective(name: str, needs_reference: bool | Callable[[Any], bool] = False, **options: Any):
    """Register a forget objective under ``name`` (usable as ``UnlearnConfig(forget_loss=name)``).

    ``needs_reference``: a bool, or a function of the config. ``options`` are :class:`Objective`'s fields:
    ``paper``, ``hyperparameters`` (a dict of names and defaults, or a tuple of config field names), ``check``,
    ``shared``, ``methods``, ``forget_weight``, ``retain_weight``, ``stops_itself``, ``normalized_by``,
    ``needs_hidden_states``, ``needs_refusal``, ``prepare``, ...
    """
    return _register(FORGET_OBJECTIVES, name, needs_reference, **options)


def register_retain_objective(name: str, needs_reference: bool | Callable[[Any], bool] = False, **options: Any):
    """Register a retain objective under ``name`` (usable as ``UnlearnConfig(retain_loss=name)``); the options
    are :func:`register_forget_objective`'s, except ``needs_refusal``."""
    if options.get("needs_refusal") or options.get("needs_alternate") or options.get("methods"):
        raise ValueError("Only forget objectives can ask for refusal or alternate answers, or define methods.")
    return _register(RETAIN_OBJECTIVES, name, needs_reference, **options)


def get_objective(registry: dict[str, Objective], name: str, kind: str) -> Objective:
    if name not in registry:
        raise ValueError(f"Unknown {kind} objective {name!r}; registered: {sorted(registry)}.")
    return registry[name]


def resolve_hyperparameters(objective: Objective | None, given: Mapping[str, Any] | None, option: str) -> dict:
    """The values of the hyperparameters ``objective`` declared: its defaults updated with ``given`` (the user's
    ``forget_loss_kwargs`` / ``retain_loss_kwargs``). A key it did not declare, a value of another type than the
    default's (an int for a float is taken), or a value its ``check`` refuses, is refused by name."""
    given = dict(given or {})
    declared = dict(objective.declared) if objective is not None else {}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        what = f"the objective {objective.name!r}" if objective is not None else "no objective ('none')"
        raise ValueError(
            f"{option} has unknown key(s) {unknown}: {what} declares {sorted(declared) or 'no hyperparameters'}."
        )
    for key, value in given.items():
        default = declared[key]
        numeric = isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool)
        if default is not None and not numeric and not isinstance(value, type(default)):
            raise ValueError(
                f"{option}[{key!r}] must be a {type(default).__name__} like its default {default!r}, got {value!r}."
            )
        declared[key] = float(value) if numeric else value
    _check_answer_sources(declared, option)
    if objective is not None and objective.check is not None:
        objective.check(declared, option)
    return declared


def _check_answer_sources(values: Mapping[str, Any], option: str) -> None:
    """The preferred answers' sources, where declared: a non-empty list of refusal texts, a column name."""
    refusals = values.get("refusal_answers", ["declared elsewhere"])
    if not refusals or not all(isinstance(text, str) and text.strip() for text in refusals):
        raise ValueError(f"{option}['refusal_answers'] must be a non-empty list of non-empty texts, got {refusals!r}.")
    column = values.get("alternate_column", "declared elsewhere")
    if not isinstance(column, str) or not column.strip():
        raise ValueError(f"{option}['alternate_column'] must name a column of the forget records, got {column!r}.")


def share_hyperparameters(
    forget: Objective | None, retain: Objective | None, given: Mapping[str, Mapping[str, Any] | None]
) -> dict[str, dict[str, Any]]:
    """``given`` (``{"forget": forget_loss_kwargs, "retain": retain_loss_kwargs}``) with each hyperparameter that
    both objectives declare and either names ``shared`` given to both, as the one value of the run. Given to both
    with different values, it is refused."""
    given = {part: dict(values or {}) for part, values in given.items()}
    if forget is None or retain is None:
        return given
    for key in sorted((set(forget.shared) | set(retain.shared)) & set(forget.declared) & set(retain.declared)):
        values = {part: values[key] for part, values in given.items() if key in values}
        if len(values) == 2 and values["forget"] != values["retain"]:
            raise ValueError(
                f"forget_loss_kwargs[{key!r}]={values['forget']!r} and retain_loss_kwargs[{key!r}]="
                f"{values['retain']!r} differ, but {forget.name!r} and {retain.name!r} share {key!r}: give it once."
            )
        for part in given:
            if values:
                given[part].setdefault(key, next(iter(values.values())))
    return given


def resolve_objectives(config: Any) -> tuple[Objective, Objective | None, dict[str, dict[str, Any]]]:
    """The forget and retain objectives ``config.objectives`` names (retain ``None`` for 'none') and, per part, the
    values of their declared hyperparameters (checked by name, before any weight changes; a ``shared`` one given in
    one part holds for both)."""
    forget_name, retain_name = config.objectives
    forget = get_objective(FORGET_OBJECTIVES, forget_name, "forget")
    retain = None if retain_name == "none" else get_objective(RETAIN_OBJECTIVES, retain_name, "retain")
    given = share_hyperparameters(
        forget, retain, {part: getattr(config, f"{part}_loss_kwargs") for part in ("forget", "retain")}
    )
    kwargs = {
        part: resolve_hyperparameters(objective, given[part], f"{part}_loss_kwargs")
        for part, objective in (("forget", forget), ("retain", retain))
    }
    return forget, retain, kwargs


def objective_hyperparameters(config: Any, part: str) -> dict[str, Any]:
    """The values the ``part`` (``'forget'`` or ``'retain'``) objective of ``config``'s run gets for its declared
    hyperparameters: what :attr:`LossInputs.hyperparameters` holds, for code outside the loss (a ``prepare`` hook,
    ``initial_state`` / ``update_state``, the run record)."""
    return resolve_objectives(config)[2][part]


def check_one_of(config: Any, choices: tuple[tuple[str, tuple[str, ...]], ...]) -> None:
    """Each ``(field, allowed values)`` of ``choices``: the field's value is one of them."""
    for name, allowed in choices:
        if getattr(config, name) not in allowed:
            raise ValueError(f"{name} must be one of {allowed}, got {getattr(config, name)!r}.")


def check_bounds(positive: tuple[str, ...] = (), nonnegative: tuple[str, ...] = ()) -> Callable[[Mapping, str], None]:
    """A ``check`` for :func:`register_forget_objective`: the ``positive`` hyperparameters must be > 0, the
    ``nonnegative`` ones >= 0 (NaN is refused)."""

    def check(values: Mapping[str, Any], option: str) -> None:
        for names, bound, holds in ((positive, "> 0", lambda v: v > 0), (nonnegative, ">= 0", lambda v: v >= 0)):
            for name in names:
                if not holds(values[name]):  # also catches NaN
                    raise ValueError(f"{option}[{name!r}] must be {bound}, got {values[name]!r}.")

    return check


def mean_over_items(total: torch.Tensor, local_count: torch.Tensor | int, inputs: LossInputs) -> torch.Tensor:
    """``total`` over the accumulated batch's count when the trainer gave one, else over this batch's."""
    return total / (inputs.num_items if inputs.num_items is not None else local_count)


def require_answer_tokens(mask: torch.Tensor, inputs: LossInputs) -> None:
    """Refuse a batch without answer tokens. Skipped under the trainer (``num_items`` given), which checked every
    example before training: reading the device here would cost a host sync per step on a GPU."""
    if inputs.num_items is None and not mask.any():
        raise ValueError("The batch has no answer tokens (all labels are -100): there is nothing to score.")


def answer_nll(inputs: LossInputs) -> torch.Tensor:
    """Mean negative log-likelihood over the answer tokens of the batch."""
    log_probs, mask = token_log_probs(inputs.logits, inputs.labels)
    require_answer_tokens(mask, inputs)
    return mean_over_items(-log_probs.sum(), mask.sum(), inputs)


def sequence_log_prob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Sum of answer-token log-probabilities per sequence, log pi(y|x)."""
    log_probs, _ = token_log_probs(logits, labels)
    return log_probs.sum(-1)


def log_ratio(inputs: LossInputs) -> torch.Tensor:
    """``log pi(y|x) - log pi_ref(y|x)`` per sequence (sequence-summed), the quantity NPO and DPO are built on."""
    return sequence_log_prob(inputs.logits, inputs.labels) - sequence_log_prob(inputs.reference_logits, inputs.labels)


def preference_margin(inputs: LossInputs) -> torch.Tensor:
    """DPO's margin with the paired batch (:attr:`LossInputs.refusal`: a refusal or an alternative answer) as the
    chosen answer and the forget answer as the rejected one."""
    require_answer_tokens(inputs.labels != IGNORE_INDEX, inputs)
    return log_ratio(inputs.refusal) - log_ratio(inputs)


def model_vocab_size(model: Any) -> int:
    embeddings = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embeddings is not None and hasattr(embeddings, "weight"):
        # ds_shape: the full shape of a weight DeepSpeed ZeRO-3 partitioned (its own shape is then empty).
        return getattr(embeddings.weight, "ds_shape", embeddings.weight.shape)[0]
    return model.config.get_text_config().vocab_size
