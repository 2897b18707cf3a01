"""Membership-inference attacks and PrivLeak: can the forget set still be told apart from text the model never saw?

Six attacks score each text; every score is oriented "higher = more like training data":

* ``loss``: the mean token log-probability (Yeom et al. 2018; the LOSS attack);
* ``zlib``: the summed log-probability divided by the text's zlib-compressed length in bytes (Carlini et al. 2021,
  "Extracting Training Data from Large Language Models", §5.2), which discounts text that is merely repetitive;
* ``min_k``: Min-K% Prob (Shi et al. 2024, arXiv 2310.16789, §3): the mean of the lowest ``int(k * n)`` token
  log-probabilities (at least one), k = 0.4 as MUSE uses;
* ``min_k_plus_plus``: Min-K%++ (Zhang et al. 2024, arXiv 2404.02936, §3): the same on log-probabilities
  standardised by the mean and standard deviation of ``log p(z | prefix)`` under the model's own distribution;
* ``reference``: the mean log-probability minus a reference model's on the same tokens (Carlini et al. 2021;
  calibrates away how easy a text is for any model);
* ``gradnorm``: minus the L2 norm of the gradient of the text's mean NLL with respect to the trainable parameters
  (members sit where the loss is flat).

AUC and PrivLeak follow MUSE exactly (Shi et al. 2024, arXiv 2407.06460, §3.1; swj0419/muse_bench): forget texts are
labelled 0 and holdout texts 1, ``AUC = P(holdout score > forget score)`` (ties count one half), and
``PrivLeak = (AUC - AUC_retrained) / AUC_retrained * 100``. Reading the sign: a model that still remembers the
forget set scores it above the holdout texts, its AUC goes towards 0 and PrivLeak towards -100 (under-unlearning);
a model retrained without the forget set has AUC near 0.5 and PrivLeak 0; an over-unlearned model, whose forget
texts look *less* familiar than never-seen ones, has AUC above 0.5 and a positive PrivLeak.

Scoring is batched (right padding) under ``torch.inference_mode``; GradNorm needs one backward per text. The
forward attacks read nothing but the per-token log-probabilities and, for Min-K%++, the moments of the model's
distribution at each position (:data:`ATTACK_READS`): where the teacher-forced pass of the answer metrics
(:mod:`hf_unlearn.evaluation.scoring`) already ran over the very tokens a text is scored on, it keeps them when asked
(``reads=attack_reads(attacks)``) and :func:`membership_scores` reads them there (``scored``) instead of running a
forward of its own; the texts it does not find there (never-seen answers, other tokens) get their own pass.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from ..scores import (
    membership_auc,
    membership_auc_interval,
    min_k_count,
    min_k_per_example,
    paired_auc_difference,
)
from .passes import batches, model_device, pad_token_id_of, progress_bar

if TYPE_CHECKING:
    from .passes import AnswerScores

ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus", "reference", "gradnorm")
#: What one forward gives; ``reference`` also needs a reference model, ``gradnorm`` a backward per text.
FORWARD_ATTACKS = ("loss", "zlib", "min_k", "min_k_plus_plus")
#: What each forward attack reads of a teacher-forced pass (:data:`hf_unlearn.evaluation.scoring.READS`).
ATTACK_READS = {
    "loss": ("token_log_probs",),
    "zlib": ("token_log_probs",),
    "min_k": ("token_log_probs",),
    "min_k_plus_plus": ("token_log_probs", "token_moments"),
}


def attack_reads(attacks: Sequence[str]) -> tuple[str, ...]:
    """What a teacher-forced pass keeps so that ``attacks`` read it (:data:`ATTACK_READS`; the others read none)."""
    return tuple(sorted({read for attack in attacks for read in ATTACK_READS.get(attack, ())}))


def min_k_percent(token_log_probs: torch.Tensor, k: float = 0.4) -> float:
    """Min-K% Prob (Shi et al. 2024, §3): the mean of the lowest :func:`min_k_count` token log-probabilities of a
    sequence; higher means "more likely seen in training"."""
    if not 0 < k <= 1:
        raise ValueError(f"k must be in (0, 1], got {k}.")
    values = token_log_probs.flatten()
    return min_k_per_example(values[None], torch.ones_like(values, dtype=torch.bool)[None], k)[0].item()


def min_k_plus_plus(
    token_log_probs: torch.Tensor, mean_log_probs: torch.Tensor, std_log_probs: torch.Tensor, k: float = 0.4
) -> float:
    """Min-K%++ (Zhang et al. 2024, §3): each token's log-probability standardised by the mean and standard
    deviation of ``log p(z | prefix)`` over the vocabulary under the model's own distribution, then Min-K%."""
    standardised = (token_log_probs.double() - mean_log_probs.double()) / std_log_probs.double().clamp(min=1e-12)
    return min_k_percent(standardised, k)


def zlib_score(token_log_probs: torch.Tensor, text: str) -> float:
    """The zlib attack (Carlini et al. 2021, §5.2): summed log-probability over the zlib-compressed length in bytes."""
    return token_log_probs.double().sum().item() / len(zlib.compress(text.encode("utf-8")))


def token_statistics(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    batch_size: int = 8,
    max_length: int = 2048,
    show_progress: bool = False,
    prompts: Sequence[str] | None = None,
) -> list[dict[str, torch.Tensor]]:
    """For each text, per token after the first: ``log_prob`` = log p(x_t | x_<t), and the mean and standard
    deviation of log p(z | x_<t) over z ~ p(. | x_<t) (what Min-K%++ standardises with).

    Texts are tokenized with the tokenizer's special tokens (BOS where it adds one) and cut to ``max_length``. With
    ``prompts``, each text is the continuation of its prompt: the prompt is encoded first (special tokens
    included, unless it begins with the BOS already), the text after it without special tokens, and only the text's
    tokens are returned (what a model trained with the prompt masked actually learned, e.g. the answer of a QA pair).
    """
    encoded, starts = _encode(tokenizer, texts, max_length, prompts)
    return _forward_statistics(model, pad_token_id_of(tokenizer), encoded, starts, batch_size, show_progress)


def _forward_statistics(
    model: Any, pad_id: int, encoded: Sequence[list[int]], starts: Sequence[int], batch_size: int, show_progress: bool
) -> list[dict[str, torch.Tensor]]:
    """:func:`token_statistics` of already encoded texts whose scored tokens start at ``starts``."""
    device = model_device(model)
    results: list[dict[str, torch.Tensor]] = []
    was_training = model.training
    model.eval()
    try:
        total = math.ceil(len(encoded) / batch_size)
        index = 0
        with torch.inference_mode():
            for batch in progress_bar(batches(encoded, batch_size), total, "Scoring texts", show_progress):
                length = max(len(ids) for ids in batch)
                input_ids = torch.tensor([ids + [pad_id] * (length - len(ids)) for ids in batch], device=device)
                mask = torch.tensor([[1] * len(ids) + [0] * (length - len(ids)) for ids in batch], device=device)
                logits = model(input_ids=input_ids, attention_mask=mask).logits[:, :-1].float()
                log_probs = torch.log_softmax(logits, dim=-1)
                targets = input_ids[:, 1:]
                chosen = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
                probs = log_probs.exp()
                mean = (probs * log_probs).sum(-1)
                variance = (probs * log_probs.square()).sum(-1) - mean.square()
                std = variance.clamp(min=0).sqrt()
                for row, ids in enumerate(batch):
                    # Position t - 1 predicts token t; the first scored token is the first after the prompt.
                    first, n = starts[index] - 1, len(ids) - 1
                    results.append(
                        {
                            "log_prob": chosen[row, first:n].cpu(),
                            "mean": mean[row, first:n].cpu(),
                            "std": std[row, first:n].cpu(),
                        }
                    )
                    index += 1
    finally:
        model.train(was_training)
    return results


def statistics_from_scores(
    encoded: Sequence[Sequence[int]], starts: Sequence[int], scored: Sequence[AnswerScores], moments: bool
) -> list[dict[str, torch.Tensor] | None]:
    """Per encoded text, its :func:`token_statistics` read from a teacher-forced pass's scores
    (:func:`hf_unlearn.evaluation.passes.score_answers` with ``reads=attack_reads(...)``), or ``None`` where no
    score ran over its tokens (or lacks the moments, with ``moments``).

    A score holds a text when the text's tokens are the example's, or the example's but for the EOS that
    :func:`hf_unlearn.data.tokenize_qa` appends, and the text's scored tokens start where the example's answer
    does: the logits at every scored position then saw the same prefix, so the values are those of the text's own
    forward (to float tolerance: the batch and its padding differ). Any other difference (a text cut at
    ``max_length``; a BOS the tokenizer adds before a chat template that writes none) is not found and gets the
    text's own pass."""
    found: dict[tuple[int, tuple[int, ...]], AnswerScores] = {}
    for score in scored:
        if score.input_ids is None or score.token_log_probs is None or (moments and score.token_mean is None):
            continue
        for ids in (score.input_ids, score.input_ids[:-1]):
            found.setdefault((score.answer_start, ids), score)
    statistics: list[dict[str, torch.Tensor] | None] = []
    for ids, start in zip(encoded, starts, strict=True):
        score = found.get((start, tuple(ids)))
        if score is None:
            statistics.append(None)
            continue
        n = len(ids) - start
        row = {"log_prob": score.token_log_probs[:n]}
        if score.token_mean is not None and score.token_std is not None:
            row.update(mean=score.token_mean[:n], std=score.token_std[:n])
        statistics.append(row)
    return statistics


def _encode(tokenizer: Any, texts: Sequence[str], max_length: int, prompts: Sequence[str] | None):
    """Token ids of each text (after its prompt, when given) and where its scored tokens start. A prompt that
    already begins with the tokenizer's BOS (a chat template that writes its own, as Llama-3's does) gets no second
    one: it is encoded as :func:`hf_unlearn.data.tokenize_qa` encodes a chat prompt, so the attack scores the tokens
    the model was trained and is evaluated on."""
    if prompts is not None:
        if len(prompts) != len(texts):
            raise ValueError(f"Got {len(prompts)} prompts for {len(texts)} texts.")
        bos = getattr(tokenizer, "bos_token", None)
        heads = [
            list(tokenizer(prompt, add_special_tokens=not (bos and prompt.startswith(bos)))["input_ids"])
            for prompt in prompts
        ]
        tails = [list(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts]
        return [(head + tail)[:max_length] for head, tail in zip(heads, tails, strict=True)], [len(h) for h in heads]
    encoded = [list(tokenizer(text)["input_ids"])[:max_length] for text in texts]
    return encoded, [1] * len(encoded)


def gradient_norms(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    max_length: int = 2048,
    prompts: Sequence[str] | None = None,
    show_progress: bool = False,
) -> list[float]:
    """Per text, the L2 norm over all floating-point parameters (frozen ones included: a merged or frozen model is
    still attacked on its weights) of the gradient of its mean token NLL (the scored tokens only, as
    :func:`token_statistics` selects them). Gradients, ``requires_grad`` flags and training mode are restored."""
    encoded, starts = _encode(tokenizer, texts, max_length, prompts)
    device = model_device(model)
    parameters = [p for p in model.parameters() if p.is_floating_point()]
    if not parameters:
        raise ValueError("The GradNorm attack needs floating-point parameters; the model has none.")
    saved = [p.grad for p in parameters]
    flags = [p.requires_grad for p in parameters]
    for p in parameters:
        p.requires_grad_(True)
    was_training = model.training
    model.eval()
    norms = []
    try:
        for ids, start in progress_bar(zip(encoded, starts, strict=True), len(encoded), "GradNorm", show_progress):
            input_ids = torch.tensor([ids], device=device)
            labels = input_ids.clone()
            labels[:, :start] = -100
            for p in parameters:
                p.grad = None
            loss = model(input_ids=input_ids, labels=labels).loss
            grads = torch.autograd.grad(loss, parameters, allow_unused=True)
            # Each tensor's norm accumulated in float64 without a float64 copy of the gradient (that copy cost as
            # much as the backward itself on a 135M model).
            squares = [torch.linalg.vector_norm(g, dtype=torch.float64).square() for g in grads if g is not None]
            norms.append(math.sqrt(float(torch.stack(squares).sum())) if squares else 0.0)
    finally:
        for p, grad, flag in zip(parameters, saved, flags, strict=True):
            p.grad = grad
            p.requires_grad_(flag)
        model.train(was_training)
    return norms


def membership_scores(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    k: float = 0.4,
    batch_size: int = 8,
    max_length: int = 2048,
    prompts: Sequence[str] | None = None,
    attacks: Sequence[str] = FORWARD_ATTACKS,
    reference_model: Any = None,
    scored: Sequence[AnswerScores] | None = None,
) -> dict[str, list[float]]:
    """Each attack's score of every text (higher = more member-like; see the module docstring); with ``prompts``,
    of the text's tokens as a continuation of its prompt (see :func:`token_statistics`). ``reference`` needs
    ``reference_model`` (same tokenizer). ``scored``: a teacher-forced pass's scores taken with
    ``reads=attack_reads(attacks)``; the forward attacks read the texts it ran over from it
    (:func:`statistics_from_scores`) and run a forward over the others only."""
    unknown = [a for a in attacks if a not in ATTACKS]
    if unknown:
        raise ValueError(f"Unknown membership attack(s) {unknown}; choose from {', '.join(ATTACKS)}.")
    if "reference" in attacks and reference_model is None:
        raise ValueError("The 'reference' attack compares with a reference model: pass reference_model.")
    encoded, starts = _encode(tokenizer, texts, max_length, prompts)
    statistics: list[dict[str, torch.Tensor]] = []
    if any(attack in FORWARD_ATTACKS or attack == "reference" for attack in attacks):  # GradNorm alone reads none
        pad_id = pad_token_id_of(tokenizer)
        statistics = _statistics(model, pad_id, encoded, starts, batch_size, attacks, scored)
    scores = attack_scores(statistics, texts, [a for a in attacks if a in FORWARD_ATTACKS], k)
    if "reference" in attacks:
        reference = _forward_statistics(reference_model, pad_id, encoded, starts, batch_size, False)
        scores["reference"] = [
            s["log_prob"].double().mean().item() - r["log_prob"].double().mean().item()
            for s, r in zip(statistics, reference, strict=True)
        ]
    if "gradnorm" in attacks:
        scores["gradnorm"] = [-norm for norm in gradient_norms(model, tokenizer, texts, max_length, prompts)]
    return {attack: scores[attack] for attack in ATTACKS if attack in scores}


def _statistics(
    model: Any,
    pad_id: int,
    encoded: Sequence[list[int]],
    starts: Sequence[int],
    batch_size: int,
    attacks: Sequence[str],
    scored: Sequence[AnswerScores] | None,
) -> list[dict[str, torch.Tensor]]:
    """Every text's token statistics: read from ``scored`` where it holds them, one batched forward for the rest."""
    moments = "min_k_plus_plus" in attacks
    statistics = statistics_from_scores(encoded, starts, scored, moments) if scored else [None] * len(encoded)
    missing = [i for i, row in enumerate(statistics) if row is None]
    if missing:
        computed = _forward_statistics(
            model, pad_id, [encoded[i] for i in missing], [starts[i] for i in missing], batch_size, False
        )
        for i, row in zip(missing, computed, strict=True):
            statistics[i] = row
    return statistics  # type: ignore[return-value]


def attack_scores(
    statistics: Sequence[dict[str, torch.Tensor]], texts: Sequence[str], attacks: Sequence[str], k: float = 0.4
) -> dict[str, list[float]]:
    """The forward ``attacks``' scores of texts from their :func:`token_statistics` (``mean`` and ``std`` are read
    by ``min_k_plus_plus`` only)."""
    scores: dict[str, list[float]] = {}
    if "loss" in attacks:
        scores["loss"] = [s["log_prob"].double().mean().item() for s in statistics]
    if "zlib" in attacks:
        scores["zlib"] = [zlib_score(s["log_prob"], text) for s, text in zip(statistics, texts, strict=True)]
    if "min_k" in attacks:
        scores["min_k"] = [min_k_percent(s["log_prob"], k) for s in statistics]
    if "min_k_plus_plus" in attacks:
        scores["min_k_plus_plus"] = [min_k_plus_plus(s["log_prob"], s["mean"], s["std"], k) for s in statistics]
    return scores


#: How far an attack's AUC may sit from the never-trained model's (or from 0.5 without one) and still read the forget
#: set as never-seen data: the tolerance of ``hf-unlearn compare``'s region (issue 54).
MEMBERSHIP_TOLERANCE = 0.1


def membership_reads(
    member_scores: Mapping[str, Sequence[float]],
    other_scores: Mapping[str, Sequence[float]],
    member_groups: Sequence[Any] | None = None,
    other_groups: Sequence[Any] | None = None,
) -> dict[str, Any]:
    """Each attack's AUC telling the members' scores from the others' (:func:`membership_auc`), its 95 % interval
    (``auc_interval``; with groups, one per answer, it resamples groups: authors, not answers) and the scores it was
    read from (``scores``: ``{"forget": {attack: [...]}, "holdout": {...}}``, and ``"groups"`` when given), so that
    another model read on the same answers can be compared pairwise (:func:`paired_off_interval`)."""
    groups = {"forget_groups": member_groups, "holdout_groups": other_groups}
    read = {
        "auc": {attack: membership_auc(member_scores[attack], other_scores[attack]) for attack in member_scores},
        "auc_interval": {
            attack: list(membership_auc_interval(member_scores[attack], other_scores[attack], **groups))
            for attack in member_scores
        },
        "scores": {
            "forget": {attack: list(values) for attack, values in member_scores.items()},
            "holdout": {attack: list(other_scores[attack]) for attack in member_scores},
        },
    }
    if member_groups is not None and other_groups is not None:  # both or neither, as the intervals read them
        read["scores"]["groups"] = {"forget": list(member_groups), "holdout": list(other_groups)}
    return read


def paired_off_interval(
    scores: Mapping[str, Mapping[str, Sequence[float]]] | None,
    reference_scores: Mapping[str, Mapping[str, Sequence[float]]] | None,
    attack: str,
) -> list[float] | None:
    """The 95 % interval of one model's AUC minus a reference model's for ``attack``, both read on the same answers
    (each a :func:`membership_reads` ``scores``; :func:`~hf_unlearn.scores.paired_auc_difference`), resampling the
    answers' groups where ``scores`` names them; None where either lacks the attack's scores or they are not of the
    same answers."""
    if not scores or not reference_scores:
        return None
    sides = [
        ((scores.get(s) or {}).get(attack), (reference_scores.get(s) or {}).get(attack)) for s in ("forget", "holdout")
    ]
    if any(ours is None or theirs is None or len(ours) != len(theirs) for ours, theirs in sides):
        return None
    groups = scores.get("groups") or {}
    _, low, high = paired_auc_difference(
        sides[0][0], sides[1][0], sides[0][1], sides[1][1],
        forget_groups=groups.get("forget"), holdout_groups=groups.get("holdout"),
    )  # fmt: skip
    return [low, high]


#: The verdict of an attack whose interval cannot tell landing from luck.
TOO_FEW = "too few answers to judge"


def judge_difference(off: float, interval: Sequence[float] | None, tolerance: float) -> str:
    """``"lands"``, ``"tells"`` or :data:`TOO_FEW` for an AUC ``off`` the level it is judged against, with the 95 %
    ``interval`` of that difference where known: wholly past ±``tolerance`` on one side it tells, however wide;
    otherwise wider than ±``tolerance`` (or NaN) it is too few to judge; else the point decides (a NaN tells)."""
    if interval is not None:
        low, high = interval
        beyond = low > tolerance or high < -tolerance
        if not beyond and not (high - low) / 2 <= tolerance:
            return TOO_FEW
    return "tells" if math.isnan(off) or abs(off) > tolerance else "lands"


def membership_verdict(
    auc: Mapping[str, float],
    reference_auc: Mapping[str, float | None] | None = None,
    tolerance: float = MEMBERSHIP_TOLERANCE,
    off_intervals: Mapping[str, Sequence[float]] | None = None,
    auc_intervals: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """Which attacks still tell the forget set from never-seen data: each attack's AUC (``auc``, MUSE's orientation)
    against the same attack's AUC on a model that never trained on the forget set (``reference_auc``; where it has
    none, against 0.5, chance). An attack *tells* when its AUC is further than ``tolerance`` from that level: below
    it, the forget set still reads as a member (under-unlearning); above it, as less familiar than never-seen data
    (over-unlearning). A NaN AUC tells (nothing says it does not).

    ``off_intervals``: per attack, the 95 % interval of AUC - level (:func:`~hf_unlearn.scores.paired_auc_difference`
    where both models read the same answers). An interval wholly past the tolerance on one side tells, however wide;
    otherwise one wider than ±``tolerance`` cannot tell landing from luck, and the attack's verdict is "too few
    answers to judge" instead of "lands" or "tells". Where the whole interval is on one side of the tolerance the
    verdict is ``certain``. ``landed`` is True when every attack
    was judged and none tells. Returns ``attacks`` (how many were read), ``distinguishing`` (how many tell),
    ``which`` (their names), ``too_few`` (the attacks not judged), ``per_attack`` (``auc``, ``auc_interval``,
    ``level``, ``level_from`` ``"never_trained"`` or ``"chance"``, ``off`` = AUC - level, ``off_interval``,
    ``verdict``, ``certain``, ``side`` ``"member"``/``"less familiar"``/``None``, ``distinguishes``), ``tolerance``
    and ``landed``."""
    per_attack: dict[str, dict[str, Any]] = {}
    for attack, value in auc.items():
        reference = (reference_auc or {}).get(attack)
        from_never = reference is not None and not math.isnan(reference)
        level = float(reference) if from_never else 0.5
        off = float(value) - level
        interval = (off_intervals or {}).get(attack)
        interval = None if interval is None else [float(interval[0]), float(interval[1])]
        verdict = judge_difference(off, interval, tolerance)
        distinguishes = verdict == "tells"
        side = None
        if distinguishes and not math.isnan(off):
            side = "member" if off < 0 else "less familiar"
        certain = interval is not None and (
            interval[0] > tolerance
            or interval[1] < -tolerance
            or -tolerance <= interval[0] <= interval[1] <= tolerance
        )
        given = (auc_intervals or {}).get(attack)
        per_attack[attack] = {
            "auc": float(value),
            "auc_interval": None if given is None else [float(given[0]), float(given[1])],
            "level": level,
            "level_from": "never_trained" if from_never else "chance",
            "off": off,
            "off_interval": interval,
            "verdict": verdict,
            "certain": certain,
            "side": side,
            "distinguishes": distinguishes,
        }
    which = [attack for attack, row in per_attack.items() if row["distinguishes"]]
    too_few = [attack for attack, row in per_attack.items() if row["verdict"] == TOO_FEW]
    return {
        "attacks": len(per_attack),
        "distinguishing": len(which),
        "which": which,
        "too_few": too_few,
        "tolerance": tolerance,
        "per_attack": per_attack,
        "landed": bool(per_attack) and not which and not too_few,
    }


def membership_verdict_line(verdict: Mapping[str, Any]) -> str:
    """One sentence a report prints for :func:`membership_verdict`."""
    if not verdict.get("attacks"):
        return "No membership attack was run."
    count, total = verdict["distinguishing"], verdict["attacks"]
    too_few = verdict.get("too_few") or []
    unjudged = ""
    if too_few:
        widths = [
            (row["off_interval"][1] - row["off_interval"][0]) / 2
            for row in (verdict["per_attack"][attack] for attack in too_few)
        ]
        widest = max((w for w in widths if not math.isnan(w)), default=float("nan"))
        reach = (
            f"their intervals reach ±{widest:.2f}, wider than the ±{verdict['tolerance']:g} they would judge."
            if not math.isnan(widest)
            else "no interval could be read (under two answers a side, or scores that separate the sets perfectly)."
        )
        unjudged = f" Too few answers to judge {len(too_few)} of {total} ({', '.join(too_few)}): {reach}"
    if not count:
        if too_few:
            return f"Membership: no attack that could be judged tells the forget set from never-seen data.{unjudged}"
        return (
            f"Membership: none of the {total} attacks tells the forget set from never-seen data "
            f"(every AUC within {verdict['tolerance']:g} of the never-trained model's, or of 0.5)."
        )
    parts = []
    for attack in verdict["which"]:
        row = verdict["per_attack"][attack]
        interval = row.get("off_interval")
        within = f", {row['off']:+.3f} [{interval[0]:+.3f}, {interval[1]:+.3f}]" if interval else ""
        parts.append(f"{attack} (AUC {row['auc']:.3f} vs {row['level']:.3f}{within}, {row['side'] or 'NaN'})")
    verb = "tells" if count == 1 else "tell"
    told = f"Membership: {count} of {total} attacks {verb} the forget set from never-seen data: "
    return told + "; ".join(parts) + "." + unjudged


def privleak(auc_unlearned: float, auc_retrained: float) -> float:
    """MUSE's PrivLeak (§3.1), in percent: ``(AUC - AUC_retrained) / AUC_retrained * 100``, AUC oriented as in
    :func:`membership_auc`. Strongly negative: the forget set is still recognisable (under-unlearning); positive:
    it looks less familiar than never-seen text (over-unlearning); about 0 is what retraining gives."""
    if auc_retrained == 0:
        return float("nan")  # the retrained model separates the sets perfectly: no scale to compare against
    return (auc_unlearned - auc_retrained) / auc_retrained * 100


__all__ = [
    "ATTACKS",
    "ATTACK_READS",
    "FORWARD_ATTACKS",
    "MEMBERSHIP_TOLERANCE",
    "TOO_FEW",
    "attack_reads",
    "attack_scores",
    "gradient_norms",
    "judge_difference",
    "membership_auc",
    "membership_reads",
    "membership_scores",
    "membership_verdict",
    "membership_verdict_line",
    "min_k_count",
    "min_k_percent",
    "min_k_plus_plus",
    "paired_off_interval",
    "privleak",
    "statistics_from_scores",
    "token_statistics",
    "zlib_score",
]
