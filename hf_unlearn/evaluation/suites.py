"""Benchmark suites: everything ``hf-unlearn eval`` reports for one model on TOFU, MUSE or the embedded benchmark.

TOFU's metrics (Maini et al., arXiv 2401.06121, §2.5) come from :func:`evaluate_unlearning` (below), MUSE's (Shi et
al., arXiv 2407.06460, §3.1) from :mod:`hf_unlearn.evaluation.muse`. Forget quality and PrivLeak compare with a model
trained without the forget set: pass it in (``reference_model``) or pass its evaluation (``reference``); this module
never trains one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from datasets import Dataset

from ..data.loaders import BENCHMARKS, MUSE_HUB_IDS, muse_evaluation_sets, tofu_evaluation_sets
from ..data.prompts import PLAIN_PROMPT_TEMPLATE, prompt_and_completion
from ..scores import groups_of
from .membership import (
    ATTACKS,
    attack_reads,
    membership_reads,
    membership_scores,
    membership_verdict,
    paired_off_interval,
    privleak,
)
from .metrics import evaluate_qa, forget_quality, forget_truth_ratio, model_utility, retain_truth_ratio
from .options import real_knowledge_options, truth_ratios
from .passes import AnswerScores, qa_records
from .scoring import measure_answers


def require_question_columns(sets: dict[str, Any]) -> None:
    """Refuse, by name, a set given (not None) without question and answer columns: the answer metrics generate from
    the question and compare with the answer, which a set tokenized on its own no longer holds."""
    for name, records in sets.items():
        if records is not None and "question" not in getattr(records, "column_names", records[0]):
            raise ValueError(
                f"evaluate() reads the {name} set's question and answer columns, which it does not have; "
                "build it with hf_unlearn.build_qa_dataset, which keeps them."
            )


def logged_metrics(result: dict[str, Any], prefix: str) -> dict[str, float]:
    """:func:`evaluate_unlearning`'s result as Trainer logs metrics: ``{prefix}_{set}_{metric}`` for each set's
    values that are not None, ``{prefix}_{name}`` for the numbers at the top level (model utility, ...)."""
    metrics: dict[str, float] = {}
    for name, value in result.items():
        if isinstance(value, dict):
            metrics.update({f"{prefix}_{name}_{key}": v for key, v in value.items() if v is not None})
        elif isinstance(value, (int, float)):
            metrics[f"{prefix}_{name}"] = value
    return metrics


def evaluate_unlearning(
    model: Any,
    tokenizer: Any,
    forget: Any,
    retain: Any | None = None,
    retain_only_truth_ratios: Sequence[float] | None = None,
    extra_retain_sets: dict[str, Any] | None = None,
    k: int = 10,
    rho: float = 0.5,
    batch_size: int = 32,
    show_progress: bool = False,
    prompt_template: str | None = None,
    forget_reads: Sequence[str] = (),
) -> dict[str, Any]:
    """Forget and retain metrics, truth ratios, forget quality (when the retain-only model's forget truth ratios
    are given), model utility and the exact-reproduction bound (TOFU §2.5, MASC Proposition 1); every set also gets
    open-unlearning's exact memorisation and extraction strength (:mod:`hf_unlearn.evaluation.memorization`).

    ``forget``/``retain`` are datasets or records with ``question`` and ``answer``; truth ratios also need
    ``paraphrased_answer`` and ``perturbed_answer`` and are skipped (``None``) without them. ``extra_retain_sets``
    (e.g. TOFU's ``real_authors``, ``world_facts``) count towards model utility like the retain set.
    ``prompt_template`` is the format the model learned the facts in (:mod:`hf_unlearn.data.prompts`).
    ``forget_reads``: what else the forget set's pass keeps (:data:`hf_unlearn.evaluation.scoring.READS`, e.g. the
    membership attacks' :func:`~hf_unlearn.evaluation.membership.attack_reads`); with any, the forget set's
    :class:`~hf_unlearn.evaluation.passes.AnswerScores` are returned under ``"forget_scores"``, for the caller to
    read and take out before the result is written.
    """
    shared = {"batch_size": batch_size, "show_progress": show_progress, "prompt_template": prompt_template}
    # One teacher-forced pass per set, read by every answer metric (evaluation/scoring.py's registry).
    scored, forget_values = measure_answers(
        model, tokenizer, forget, ("memorization", "reproduction_bound"), k=k, rho=rho, reads=forget_reads, **shared
    )
    result: dict[str, Any] = {"forget": evaluate_qa(model, tokenizer, forget, scores=scored, **shared)}
    if forget_reads:
        result["forget_scores"] = scored
    result["forget"].update({key: forget_values[key] for key in ("exact_memorization", "extraction_strength")})
    forget_ratios = truth_ratios(model, tokenizer, forget, **shared)
    result["forget"]["truth_ratio"] = forget_truth_ratio(forget_ratios) if forget_ratios else None
    result["forget_truth_ratios"] = forget_ratios
    utility_values: list[float] = []
    for name, records in {"retain": retain, **(extra_retain_sets or {})}.items():
        if records is None:
            continue
        records_scored, values = measure_answers(model, tokenizer, records, ("memorization",), **shared)
        metrics = evaluate_qa(model, tokenizer, records, scores=records_scored, **shared)
        # Not part of model utility (TOFU's harmonic mean is over probability, ROUGE and truth ratio only).
        metrics.update(values)
        if name != "retain":  # real authors / world facts: Prob is normalised over the answer options
            options, ratios = real_knowledge_options(model, tokenizer, records, **shared)
            if options:
                metrics["answer_probability"] = metrics["probability"]
                metrics["probability"] = sum(options) / len(options)
        else:
            ratios = truth_ratios(model, tokenizer, records, **shared)
        metrics["truth_ratio"] = retain_truth_ratio(ratios) if ratios else None
        result[name] = metrics
        utility_values += [metrics["probability"], metrics["rouge_l_recall"]]
        if ratios:
            utility_values.append(metrics["truth_ratio"])
    result["model_utility"] = model_utility(utility_values) if utility_values else None
    result["forget_quality"] = (
        forget_quality(forget_ratios, retain_only_truth_ratios)
        if retain_only_truth_ratios is not None and forget_ratios
        else None
    )
    result["exact_reproduction_bound"] = forget_values["exact_reproduction_bound"]
    result["exact_reproduction_bound_max"] = forget_values["exact_reproduction_bound_max"]
    return result


def membership_off_intervals(
    measured: Mapping[str, Any],
    retrained_auc: Mapping[str, float] | None,
    retrained_scores: Mapping[str, Mapping[str, Sequence[float]]] | None,
) -> dict[str, list[float]]:
    """Per attack, the 95 % interval of its AUC minus the level it is judged against: the paired difference to the
    never-trained model where both read the same answers (``retrained_scores``), else this model's interval minus the
    never-trained AUC (or 0.5), the level taken as exact."""
    intervals = {}
    for attack, (low, high) in measured["auc_interval"].items():
        level = (retrained_auc or {}).get(attack)
        paired = paired_off_interval(measured["scores"], retrained_scores, attack) if level is not None else None
        reference = 0.5 if level is None else level
        intervals[attack] = paired if paired is not None else [low - reference, high - reference]
    return intervals


def evaluate_muse(
    model: Any,
    tokenizer: Any,
    sets: Mapping[str, Any],
    retrained_auc: Mapping[str, float] | None = None,
    k: float = 0.4,
    verbmem_tokens: int = 128,
    knowmem_tokens: int = 32,
    batch_size: int = 8,
    generation_batch_size: int = 32,
    max_length: int = 2048,
    show_progress: bool = False,
    prompt_template: str | None = None,
    attacks: Sequence[str] | None = None,
    attack_reference_model: Any = None,
    scored: Sequence[AnswerScores] | None = None,
    retrained_scores: Mapping[str, Mapping[str, Sequence[float]]] | None = None,
) -> dict[str, Any]:
    """MUSE's VerbMem, KnowMem (forget and retain) and the membership attacks' AUC with its 95 % interval
    (``auc_interval``), with PrivLeak and the verdict against ``retrained_auc`` (the same AUCs measured on a model
    retrained without the forget set; with ``retrained_scores``, that model's ``scores`` of the same answers, the
    verdict reads the paired interval of the difference), on whichever of
    :func:`hf_unlearn.data.loaders.muse_evaluation_sets`'s sets ``sets`` has. ``batch_size`` is for scoring whole
    texts (up to ``max_length`` tokens), ``generation_batch_size`` for KnowMem's short answers. ``attacks``: the
    membership attacks (default every one of :data:`hf_unlearn.evaluation.membership.ATTACKS` that can run:
    ``reference`` only with ``attack_reference_model``); AUC and PrivLeak in MUSE's orientation
    (:mod:`hf_unlearn.evaluation.membership`). ``scored``: a teacher-forced pass over (some of) the membership
    texts, taken with the attacks' reads; the forward attacks read the texts it holds from it instead of scoring
    them again (:func:`hf_unlearn.evaluation.membership.membership_scores`)."""
    from .muse import knowmem, verbmem

    result: dict[str, Any] = {}
    if sets.get("verbmem") is not None:
        data = sets["verbmem"]
        result["verbmem_forget"] = verbmem(
            model, tokenizer, data["prompt"], data["continuation"], verbmem_tokens, batch_size, show_progress
        )
    for side in ("forget", "retain"):
        data = sets.get(f"knowmem_{side}")
        if data is not None:
            icl = sets.get(f"knowmem_{side}_icl")
            result[f"knowmem_{side}"] = knowmem(
                model,
                tokenizer,
                data["question"],
                data["answer"],
                knowmem_tokens,
                generation_batch_size,
                icl_examples=list(icl) if icl is not None else None,
                show_progress=show_progress,
                prompt_template=prompt_template,
            )
    if sets.get("privleak_forget") is not None and sets.get("privleak_holdout") is not None:
        if attacks is None:
            attacks = [a for a in ATTACKS if a != "reference" or attack_reference_model is not None]
        members, others = (
            membership_scores(
                model,
                tokenizer,
                sets[name]["text"],
                k,
                batch_size,
                max_length,
                # Prompted texts (the embedded QA): only the trained part, the answer, is scored.
                prompts=sets[name]["prompt"] if "prompt" in sets[name].column_names else None,
                attacks=attacks,
                reference_model=attack_reference_model,
                scored=scored,
            )
            for name in ("privleak_forget", "privleak_holdout")
        )
        groups = (groups_of(sets[name]) for name in ("privleak_forget", "privleak_holdout"))
        result.update(membership_reads(members, others, *groups))
        # Which attacks still tell the forget set from never-seen data (each against the retrained model's AUC, or
        # 0.5 without one), read with the interval of the difference: the forget set counts as forgotten only when
        # every attack could be judged and none tells (issue 54, 66).
        off_intervals = membership_off_intervals(result, retrained_auc, retrained_scores)
        result["membership"] = membership_verdict(
            result["auc"], retrained_auc, off_intervals=off_intervals, auc_intervals=result["auc_interval"]
        )
        result["privleak"] = (
            {
                attack: privleak(auc, retrained_auc[attack]) if attack in retrained_auc else None
                for attack, auc in result["auc"].items()
            }
            if retrained_auc
            else None
        )
    return result


def qa_evaluation_sets(
    tokenizer: Any,
    forget: Any,
    retain: Any | None = None,
    holdout: Any | None = None,
    prompt_template: str | None = None,
) -> dict[str, Any]:
    """A user's own question/answer data seen as TOFU and MUSE see a benchmark: QA metrics on ``forget`` and
    ``retain`` (truth ratios where the records carry ``paraphrased_answer``/``perturbed_answer``) and, with
    ``holdout`` (examples of the same kind the model never trained on), the membership attack on the answers given
    their questions, in ``prompt_template``'s format. Every set needs ``question`` and ``answer`` columns."""
    sets: dict[str, Any] = {"forget": forget}
    if retain is not None:
        sets["retain"] = retain
    if holdout is not None:
        for name, data in (("privleak_forget", forget), ("privleak_holdout", holdout)):
            pairs = [
                prompt_and_completion(tokenizer, str(r["question"]), str(r["answer"]), prompt_template)
                for r in qa_records(data)
            ]
            sets[name] = Dataset.from_dict({"prompt": [p for p, _ in pairs], "text": [c for _, c in pairs]})
    return sets


def evaluate_benchmark(
    model: Any,
    tokenizer: Any,
    benchmark: str = "embedded",
    split: str = "forget10",
    path: str | None = None,
    reference: Mapping[str, Any] | None = None,
    max_examples: int | None = None,
    show_progress: bool = False,
    reference_model: tuple[Any, Any] | None = None,
    sets: Mapping[str, Any] | None = None,
    prompt_template: str | None = None,
) -> dict[str, Any]:
    """Everything ``hf-unlearn eval`` reports for one model on one benchmark, or on the user's own ``sets``.

    ``embedded`` and ``tofu`` get TOFU's metrics (:func:`evaluate_unlearning`), ``embedded``,
    ``muse_news`` and ``muse_books`` MUSE's (:func:`evaluate_muse`, under ``"muse"``). ``sets`` (e.g. from
    :func:`qa_evaluation_sets`) replaces the benchmark's: then ``benchmark`` is only the label written in the
    result. The model trained without the forget set gives forget quality (its ``forget_truth_ratios``) and
    PrivLeak (its ``muse.auc``): pass its evaluation as ``reference``, or the model itself as
    ``reference_model=(model, tokenizer)`` and it is evaluated here first (its result is returned under
    ``"reference"``). Without either, those two are ``None``. ``path`` replaces the Hub id (a local copy of the
    dataset repository). ``max_examples`` keeps the first N of every set. ``prompt_template``: the format the
    model learned its facts in (:mod:`hf_unlearn.data.prompts`).
    """
    if sets is None and benchmark not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}.")
    if reference is not None and reference_model is not None:
        raise ValueError("Pass reference (an evaluation) or reference_model (a model to evaluate), not both.")
    if sets is None:
        sets = benchmark_sets(benchmark, split, path)
    if max_examples is not None:
        sets = {name: data.select(range(min(max_examples, len(data)))) for name, data in sets.items()}
    result: dict[str, Any] = {"benchmark": benchmark, "split": split}
    # The Reference attack calibrates with the model trained without the forget set, when there is one.
    attack_reference = reference_model[0] if reference_model is not None else None
    if reference_model is not None:
        reference = _evaluate_sets(*reference_model, sets, None, show_progress, prompt_template, attack_reference)
        result["reference"] = {k: v for k, v in reference.items() if k in ("forget_truth_ratios", "muse")}
    result.update(_evaluate_sets(model, tokenizer, sets, reference, show_progress, prompt_template, attack_reference))
    return result


def _evaluate_sets(
    model: Any,
    tokenizer: Any,
    sets: Mapping[str, Any],
    reference: Mapping[str, Any] | None,
    show_progress: bool,
    prompt_template: str | None = None,
    attack_reference_model: Any = None,
) -> dict[str, Any]:
    result: dict[str, Any] = {}
    if "forget" in sets:
        extra = {name: sets[name] for name in ("real_authors", "world_facts") if name in sets}
        result.update(
            evaluate_unlearning(
                model,
                tokenizer,
                sets["forget"],
                sets.get("retain"),
                retain_only_truth_ratios=(reference or {}).get("forget_truth_ratios"),
                extra_retain_sets=extra or None,
                show_progress=show_progress,
                prompt_template=prompt_template,
                # Prompted membership texts (answers given their questions) are the forget pass's own tokens when
                # their format is the forget set's: the attacks read that pass (membership.statistics_from_scores).
                forget_reads=attack_reads(ATTACKS) if _prompted_membership(sets) else (),
            )
        )
    scored = result.pop("forget_scores", None)
    if any(name.startswith(("verbmem", "knowmem", "privleak")) for name in sets):
        retrained = (reference or {}).get("muse") or {}
        result["muse"] = evaluate_muse(
            model,
            tokenizer,
            sets,
            retrained.get("auc"),
            retrained_scores=retrained.get("scores"),
            show_progress=show_progress,
            prompt_template=prompt_template,
            attack_reference_model=attack_reference_model,
            scored=scored,
        )
    return result


def _prompted_membership(sets: Mapping[str, Any]) -> bool:
    """Whether the membership attack runs on answers given their prompts (whose tokens a QA pass may hold)."""
    data = sets.get("privleak_forget")
    return data is not None and "privleak_holdout" in sets and "prompt" in getattr(data, "column_names", ())


def embedded_evaluation_sets(split: str = "forget10", **size: Any) -> dict[str, Any]:
    """The embedded benchmark seen both ways: TOFU's sets (forget, retain) and MUSE's (VerbMem on each forget
    answer's second half given the question and first half, KnowMem on forget and retain QA, and the membership
    attack on the answers of forget vs holdout-author QA, given their questions). ``size``: the benchmark's size
    settings (:func:`~hf_unlearn.benchmarks.fictitious_authors.benchmark_size`), default the quick one."""
    from ..benchmarks.fictitious_authors import load_split, retain_split_for

    forget, retain = load_split(split, **size), load_split(retain_split_for(split), **size)
    holdout = load_split("holdout", **size)

    def prompt(record: dict[str, Any]) -> str:
        return PLAIN_PROMPT_TEMPLATE.format(question=record["question"])

    def answer(record: dict[str, Any]) -> str:
        return " " + record["answer"]

    prompts, continuations = [], []
    for record in forget:
        words = record["answer"].split(" ")
        half = max(1, len(words) // 2)
        prompts.append(PLAIN_PROMPT_TEMPLATE.format(question=record["question"]) + " " + " ".join(words[:half]))
        continuations.append(" ".join(words[half:]))
    return {
        "forget": forget,
        "retain": retain,
        "verbmem": Dataset.from_dict({"prompt": prompts, "continuation": continuations}),
        "knowmem_forget": forget.select_columns(["question", "answer"]),
        "knowmem_retain": retain.select_columns(["question", "answer"]),
        # The question is a prompt the model never trained on (masked from the loss), so the membership attack
        # scores the answer given the question, not the whole text.
        # "group": the author each answer is about, so the membership intervals resample authors (answers of one
        # author share its name: on the judge size 2.4 times wider than over answers, docs/studies/judge_size.md)
        "privleak_forget": Dataset.from_dict(
            {"prompt": [prompt(r) for r in forget], "text": [answer(r) for r in forget], "group": forget["author"]}
        ),
        "privleak_holdout": Dataset.from_dict(
            {"prompt": [prompt(r) for r in holdout], "text": [answer(r) for r in holdout], "group": holdout["author"]}
        ),
    }


def chronicles_evaluation_sets(**generate_kwargs: Any) -> dict[str, Any]:
    """The embedded long-text corpus (:mod:`hf_unlearn.benchmarks.fictitious_chronicles`) in MUSE's shape: VerbMem
    on the forget passages (first half given), KnowMem on forget and retain towns' QA, and the membership attack on
    whole forget passages vs never-learned holdout passages."""
    from ..benchmarks.fictitious_chronicles import load_chronicles_split

    def split(name: str) -> Dataset:
        return load_chronicles_split(name, **generate_kwargs)

    return {
        "verbmem": split("verbmem_forget").select_columns(["prompt", "continuation"]),
        "knowmem_forget": split("knowmem_forget").select_columns(["question", "answer"]),
        "knowmem_retain": split("knowmem_retain").select_columns(["question", "answer"]),
        "privleak_forget": split("forget").select_columns(["text"]),
        "privleak_holdout": split("holdout").select_columns(["text"]),
    }


def benchmark_sets(benchmark: str, split: str = "forget10", path: str | None = None) -> dict[str, Any]:
    """The evaluation sets of ``benchmark`` (one of :data:`BENCHMARKS`); ``path`` replaces the Hub id."""
    if benchmark == "embedded":
        return embedded_evaluation_sets(split)
    if benchmark == "tofu":
        return tofu_evaluation_sets(split, **({"path": path} if path else {}))
    if benchmark in MUSE_HUB_IDS:
        return muse_evaluation_sets(benchmark, path)
    raise ValueError(f"Unknown benchmark {benchmark!r}; choose one of {', '.join(BENCHMARKS)}.")
