"""The measurement a job takes of a model between or during runs (the method comparison after every epoch, sequential
requests after every request): per question/answer set TOFU's ROUGE-L recall, probability and exact match
(:func:`~hf_unlearn.evaluation.metrics.evaluate_qa`); on the forget set, when asked, the forget truth ratio and forget
quality against a retain-only model (TOFU, Maini et al. 2024, §2.5) and the Min-K% membership AUC against never-seen
examples of the same kind (MUSE's orientation: 0.5 = indistinguishable)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..data.prompts import prompt_and_completion
from ..scores import groups_of
from .membership import ATTACKS, attack_reads, membership_reads, membership_scores
from .metrics import (
    evaluate_qa,
    forget_quality,
    forget_truth_ratio,
    model_utility,
    retain_truth_ratio,
    rouge_l_recall,
)
from .options import real_knowledge_options, truth_ratios
from .passes import GENERATION_BATCH_SIZE, AnswerScores, generate_answers, qa_records
from .scoring import measure_answers

#: Answer length allowed on the real-knowledge sets. Their reference answers are a name or a few words, but a
#: pretrained chat model answers in a sentence ("The play 'Romeo and Juliet' was written by William Shakespeare."):
#: cut at the reference's length plus a few tokens, the name is never reached and ROUGE-L recall reads ~0 on a model
#: that knows the fact. TOFU generates up to 200 tokens; 48 holds such a sentence.
REAL_KNOWLEDGE_MAX_NEW_TOKENS = 48
#: The attack of the forget set's membership AUC (compare's region): Min-K% (Shi et al. 2024), as MUSE reports it.
MEMBERSHIP_ATTACK = "min_k"


def qa_membership_auc(
    model: Any,
    tokenizer: Any,
    members: Sequence[Mapping[str, Any]],
    non_members: Sequence[Mapping[str, Any]],
    prompt_template: str | None = None,
    attack: str = "min_k",
    member_scores: Sequence[AnswerScores] | None = None,
) -> float:
    """AUC of ``attack`` telling ``members`` from ``non_members`` (question/answer records), each answer scored as the
    continuation of its prompt in the format the model learned: :func:`qa_membership_aucs` of one attack."""
    return qa_membership_aucs(model, tokenizer, members, non_members, prompt_template, (attack,), member_scores)[
        attack
    ]


def qa_membership_aucs(
    model: Any,
    tokenizer: Any,
    members: Sequence[Mapping[str, Any]],
    non_members: Sequence[Mapping[str, Any]],
    prompt_template: str | None = None,
    attacks: Sequence[str] = ATTACKS,
    member_scores: Sequence[AnswerScores] | None = None,
    reference_model: Any = None,
) -> dict[str, float]:
    """Each of ``attacks``' AUC telling ``members`` from ``non_members`` (question/answer records), each answer scored
    as the continuation of its prompt in the format the model learned (``reference`` needs ``reference_model``).
    ``member_scores``: the members' teacher-forced pass taken with the attacks' reads
    (:func:`~hf_unlearn.evaluation.membership.attack_reads`), read instead of scoring the answers again where it ran
    over the same tokens. The non-members of the forward attacks are scored by the same kind of teacher-forced pass
    (its LM head only where an answer token is predicted, a shared prompt prefix run once)."""
    read = qa_membership_reads(
        model, tokenizer, members, non_members, prompt_template, attacks, member_scores, reference_model
    )
    return read["auc"]


def qa_membership_reads(
    model: Any,
    tokenizer: Any,
    members: Sequence[Mapping[str, Any]],
    non_members: Sequence[Mapping[str, Any]],
    prompt_template: str | None = None,
    attacks: Sequence[str] = ATTACKS,
    member_scores: Sequence[AnswerScores] | None = None,
    reference_model: Any = None,
) -> dict[str, Any]:
    """:func:`qa_membership_aucs` with what they were read from: ``auc``, its 95 % interval per attack
    (``auc_interval``) and every answer's score (``scores``): the
    :func:`~hf_unlearn.evaluation.membership.membership_reads` of both sets' scores, grouped by author where the
    records name one (``group`` or ``author``)."""
    read = _records_scores(model, tokenizer, members, prompt_template, attacks, member_scores, reference_model)
    others = _qa_scores(model, tokenizer, non_members, prompt_template, attacks, reference_model)
    # Records that name their author are drawn by author: the intervals resample authors (scores.groups_of).
    return membership_reads(read, others, groups_of(members), groups_of(non_members))


def attack_scores(
    model: Any,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    prompt_template: str | None,
    attack: str,
    scored: Sequence[AnswerScores] | None = None,
) -> list[float]:
    """Each record's ``attack`` score, its answer read as the continuation of its prompt: from ``scored`` (its
    teacher-forced pass) where given, else from the attack's own forward."""
    return _records_scores(model, tokenizer, records, prompt_template, (attack,), scored)[attack]


def qa_attack_scores(
    model: Any,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    prompt_template: str | None = None,
    attack: str = "min_k",
) -> list[float]:
    """:func:`attack_scores` of question/answer records, a forward attack's read from one teacher-forced pass (its LM
    head only where an answer token is predicted, a shared prompt prefix run once): what
    :func:`qa_membership_auc` scores its non-members with, so that sets compared pairwise are each scored once."""
    return _qa_scores(model, tokenizer, records, prompt_template, (attack,))[attack]


def _records_scores(
    model: Any,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    prompt_template: str | None,
    attacks: Sequence[str],
    scored: Sequence[AnswerScores] | None = None,
    reference_model: Any = None,
) -> dict[str, list[float]]:
    """Each of ``attacks``' score of every record, its answer as the continuation of its prompt (``scored``: its
    teacher-forced pass, where given)."""
    pairs = [prompt_and_completion(tokenizer, r["question"], r["answer"], prompt_template) for r in records]
    return membership_scores(
        model, tokenizer, [completion for _, completion in pairs], prompts=[prompt for prompt, _ in pairs],
        attacks=attacks, reference_model=reference_model, scored=scored,
    )  # fmt: skip


def _qa_scores(
    model: Any,
    tokenizer: Any,
    records: Sequence[Mapping[str, Any]],
    prompt_template: str | None,
    attacks: Sequence[str],
    reference_model: Any = None,
) -> dict[str, list[float]]:
    """:func:`_records_scores` with the forward attacks read from one teacher-forced pass over the records."""
    reads = attack_reads(attacks)
    scored = None
    if reads:
        scored, _ = measure_answers(model, tokenizer, records, (), prompt_template=prompt_template, reads=reads)
    return _records_scores(model, tokenizer, records, prompt_template, attacks, scored, reference_model)


def measure_qa_sets(
    model: Any,
    tokenizer: Any,
    sets: Mapping[str, Any],
    prompt_template: str | None = None,
    forget_set: str | None = None,
    retain_only_truth_ratios: Sequence[float] | None = None,
    membership_holdout: Sequence[Mapping[str, Any]] | None = None,
    return_predictions: bool = False,
    membership_attacks: Sequence[str] = (MEMBERSHIP_ATTACK,),
    attack_reference_model: Any = None,
) -> dict[str, dict[str, Any]]:
    """``{set name: metrics}`` for every question/answer set in ``sets``. The set named ``forget_set`` also gets its
    truth ratio (with ``retain_only_truth_ratios``, its forget quality too) when its records carry paraphrased and
    perturbed answers, and with ``membership_holdout`` its membership AUC against those never-seen records:
    ``membership_auc`` (Min-K%) and ``membership_aucs`` (each of ``membership_attacks``; ``reference`` with
    ``attack_reference_model`` as its reference, left out without one), ``membership_auc_intervals`` (their 95 %
    intervals) and ``membership_scores`` (every answer's score, :func:`qa_membership_reads`).
    ``return_predictions``: every set's greedy answers under ``"predictions"``."""
    attacks = tuple(
        a for a in dict.fromkeys((MEMBERSHIP_ATTACK, *membership_attacks))
        if a != "reference" or attack_reference_model is not None
    )  # fmt: skip
    scored: dict[str, Any] = {}
    if forget_set is not None and membership_holdout is not None:
        # One pass over the forget answers for their probability and the membership attacks' token statistics.
        scored[forget_set], _ = measure_answers(
            model, tokenizer, sets[forget_set], ("probability",), prompt_template=prompt_template,
            reads=attack_reads(attacks),
        )  # fmt: skip
    shared = {"prompt_template": prompt_template, "return_predictions": return_predictions}
    measured = {}
    for name, data in sets.items():
        measured[name] = evaluate_qa(model, tokenizer, data, scores=scored.get(name), **shared)
    if forget_set is None:
        return measured
    records = sets[forget_set]
    columns = getattr(records, "column_names", None) or list(records[0])
    forget = measured[forget_set]
    if {"paraphrased_answer", "perturbed_answer"} <= set(columns):
        ratios = truth_ratios(model, tokenizer, records, prompt_template=prompt_template)
        forget["truth_ratio"] = forget_truth_ratio(ratios)
        if retain_only_truth_ratios is not None:
            forget["forget_quality"] = forget_quality(ratios, retain_only_truth_ratios)
    if membership_holdout is not None:
        read = qa_membership_reads(
            model, tokenizer, records, membership_holdout, prompt_template, attacks, scored[forget_set],
            attack_reference_model,
        )  # fmt: skip
        forget["membership_auc"] = read["auc"][MEMBERSHIP_ATTACK]
        forget["membership_aucs"] = read["auc"]
        forget["membership_auc_intervals"] = read["auc_interval"]
        forget["membership_scores"] = read["scores"]
    return measured


def real_knowledge_utility(
    model: Any,
    tokenizer: Any,
    sets: Mapping[str, Any],
    prompt_template: str | None = None,
    max_new_tokens: int = REAL_KNOWLEDGE_MAX_NEW_TOKENS,
) -> dict[str, Any]:
    """Model utility on real knowledge the way TOFU measures it (Maini et al. 2024, §2.5) on its real-authors and
    world-facts sets (records with ``question``, ``answer``, ``perturbed_answer``): per set ROUGE-L recall of the
    greedy answer, Prob normalised over the answer and its perturbed answers, and the truth ratio aggregated as
    ``mean(max(0, 1 - TR))``; ``utility`` is the harmonic mean of all of them (TOFU's model utility, without the
    retain set's three values, which are reported beside it), ``mean`` their arithmetic mean."""
    measured: dict[str, Any] = {}
    values: list[float] = []
    # Every set's greedy answers in one generation (same budget): one decoding loop instead of one per set.
    rows = {name: qa_records(records) for name, records in sets.items()}
    questions = [str(r["question"]) for name in rows for r in rows[name]]
    predictions = iter(
        generate_answers(
            model, tokenizer, questions, max_new_tokens, GENERATION_BATCH_SIZE, prompt_template=prompt_template
        )
    )
    for name, records in sets.items():
        answers = [str(r["answer"]) for r in rows[name]]
        recalls = rouge_l_recall([next(predictions) for _ in answers], answers)
        options, ratios = real_knowledge_options(model, tokenizer, records, prompt_template=prompt_template)
        row = {
            "rouge_l_recall": sum(recalls) / len(recalls) if recalls else float("nan"),
            "probability": sum(options) / len(options) if options else float("nan"),
            "truth_ratio": retain_truth_ratio(ratios),
            "num_examples": len(answers),
        }
        measured[name] = row
        values += [row["rouge_l_recall"], row["probability"], row["truth_ratio"]]
    measured["utility"] = model_utility(values) if values else float("nan")
    # The six values read as such: one near zero (a small model's real-author ROUGE-L) sinks the harmonic mean.
    measured["mean"] = sum(values) / len(values) if values else float("nan")
    return measured


__all__ = [
    "MEMBERSHIP_ATTACK",
    "REAL_KNOWLEDGE_MAX_NEW_TOKENS",
    "attack_scores",
    "measure_qa_sets",
    "qa_attack_scores",
    "qa_membership_auc",
    "qa_membership_aucs",
    "qa_membership_reads",
    "real_knowledge_utility",
]
