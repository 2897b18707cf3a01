"""A sequence of deletion requests applied one after another to the same model, each run stopping itself.

MUSE (Shi et al., arXiv 2407.06460, §3.2, "sustainability") unlearns successive forget sets from one model and
tracks utility along the way; a request must also not bring an earlier one back. After every request this
re-measures *every* request's forget set (earlier ones: did they stay forgotten; later ones: were they touched
already) and the retain set, warns when an earlier request's forget ROUGE-L rises by more than
:data:`CAME_BACK_THRESHOLD` over its value right after its own run, and keeps the request ledger
(:mod:`hf_unlearn.training.ledger`) that the saved model carries.
"""

from __future__ import annotations

import copy
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transformers.utils import logging

from ..data.examples import as_records_dataset, build_qa_dataset
from ..data.loaders import load_records
from ..data.prompts import describe_prompt_format
from ..evaluation.bundle import measure_qa_sets
from ..objectives.masc.options import check_calibration_use, reads_calibration
from ..training.adapters import lora_config
from ..training.config import UnlearnConfig
from ..training.ledger import full_ledger, ledger_markdown, save_ledger
from ..training.output_dir import prepare_output_dir
from .models import build_trainer, earlier_requests_of, load_model_and_tokenizer

logger = logging.get_logger(__name__)

#: An earlier request "came back" when its forget ROUGE-L recall rises by more than this over its value right after
#: its own run (the threshold of :mod:`hf_unlearn.robustness.quantize`'s check).
CAME_BACK_THRESHOLD = 0.05
SEQUENCE_FILE = "sequence.json"


@dataclass
class ForgetRequest:
    """One deletion request: a name (for the ledger and the tables) and its question/answer records."""

    name: str
    records: Any


@dataclass
class SequenceResult:
    """What :func:`unlearn_sequentially` measured: ``history[0]`` is before any request, ``history[k]`` after the
    k-th; ``came_back`` lists every earlier request whose forgetting was undone; ``ledger`` the saved ledger."""

    requests: list[str]
    history: list[dict[str, Any]]
    came_back: list[dict[str, Any]] = field(default_factory=list)
    ledger: list[dict[str, Any]] = field(default_factory=list)
    paths: dict[str, str] = field(default_factory=dict)
    model: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "history": self.history,
            "came_back": self.came_back,
            "ledger": self.ledger,
            "came_back_threshold": CAME_BACK_THRESHOLD,
        }


def _requests(requests: Sequence[ForgetRequest | Mapping[str, Any] | tuple]) -> list[ForgetRequest]:
    result = []
    for i, request in enumerate(requests):
        if isinstance(request, ForgetRequest):
            result.append(request)
        elif isinstance(request, Mapping) and {"name", "records"} <= set(request):
            result.append(ForgetRequest(str(request["name"]), request["records"]))
        elif isinstance(request, tuple) and len(request) == 2:
            result.append(ForgetRequest(str(request[0]), request[1]))
        else:
            raise TypeError(
                f"Request {i} is a {type(request).__name__}; pass ForgetRequest(name, records), a dict with 'name' "
                "and 'records', or a (name, records) pair."
            )
    if not result:
        raise ValueError("No forget request was given: pass at least one.")
    names = [r.name for r in result]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"Request names must be unique (they name the ledger entries); repeated: {repeated}.")
    return result


def earlier_requests_back(
    history: Sequence[Mapping[str, Any]], threshold: float = CAME_BACK_THRESHOLD
) -> list[dict[str, Any]]:
    """The earlier requests that the last point of ``history`` brought back: those whose forget ROUGE-L recall is
    more than ``threshold`` above its value right after the request's own run (``history[j]`` for request j)."""
    last = history[-1]
    k = last["after_request"]
    findings = []
    for point in history[1:k]:
        name = point["name"]
        own = point["forget"][name]["rouge_l_recall"]
        now = last["forget"][name]["rouge_l_recall"]
        if now - own > threshold:
            findings.append({"request": name, "after_request": k, "own_run": own, "now": now, "rise": now - own})
    return findings


def checked_request_sets(
    model: Any,
    requests: Sequence[ForgetRequest],
    retain_records: Any,
    calibration_records: Any,
    config: UnlearnConfig,
    tokenize: dict[str, Any],
) -> tuple[list[Any], Any, Any]:
    """Every request's forget set, the retain and the calibration set, tokenized (``tokenize``: the tokenizer, the
    columns and the prompt template) and checked as each request's trainer would check them, all before the first
    request changes the model."""
    from ..data.checks import check_unlearning_data
    from ..objectives import objective_hyperparameters

    forget_sets = [build_qa_dataset(r.records, name=f"forget (request {r.name!r})", **tokenize) for r in requests]
    retain = build_qa_dataset(retain_records, name="retain", **tokenize) if retain_records is not None else None
    calibration = (
        build_qa_dataset(calibration_records, name="calibration", **tokenize)
        if calibration_records is not None
        else None
    )
    check_calibration_use(config, calibration is not None)
    alternate_column = objective_hyperparameters(config, "forget").get("alternate_column")  # AltPO's
    for request, forget in zip(requests, forget_sets, strict=True):
        check_unlearning_data(
            model,
            forget,
            retain,
            calibration,
            method=config.method,
            retain_objective=config.objectives[1],
            alternate_column=alternate_column,
            forget_objective=config.objectives[0],
            forget_name=f"forget (request {request.name!r})",
            retain_hint="retain_records (hf-unlearn sequence: --retain_data)",
        )
    return forget_sets, retain, calibration


def unlearn_sequentially(
    model: Any,
    tokenizer: Any,
    requests: Sequence[ForgetRequest | Mapping[str, Any] | tuple],
    retain_records: Any,
    config: UnlearnConfig,
    *,
    peft_config: Any = None,
    calibration_records: Any = None,
    prompt_template: str | None = None,
    question_column: str = "question",
    answer_column: str = "answer",
    max_eval_examples: int | None = 100,
    save: bool = True,
    earlier_requests: list[dict[str, Any]] | None = None,
) -> SequenceResult:
    """Unlearn ``requests`` one after another from ``model`` (each a run of ``config``'s method that stops itself).

    Every request is tokenized and checked before the first one trains. The k-th run writes its checkpoints to
    ``<output_dir>/request_<k>``; with ``peft_config`` each run trains a fresh adapter that is merged before the
    next. After each run every request's forget set and the retain set (at most ``max_eval_examples`` each) are
    measured. ``earlier_requests`` is the ledger the model came with (default: its folder's). With ``save``,
    ``output_dir`` gets the final model and tokenizer, its run record and model card, the
    request ledger, ``sequence.json`` / ``sequence.md`` and the sustainability plot ``sustainability.png``.
    """
    requests = _requests(requests)
    tokenize = dict(
        tokenizer=tokenizer,
        question_column=question_column,
        answer_column=answer_column,
        prompt_template=prompt_template,
    )
    forget_sets, retain, calibration = checked_request_sets(
        model, requests, retain_records, calibration_records, config, tokenize
    )

    def evaluation_sample(dataset: Any) -> Any:
        dataset = as_records_dataset(dataset)
        if max_eval_examples is not None and len(dataset) > max_eval_examples:
            return dataset.select(range(max_eval_examples))
        return dataset

    measured_sets = {r.name: evaluation_sample(d) for r, d in zip(requests, forget_sets, strict=True)}
    retain_sample = evaluation_sample(retain) if retain is not None else None

    def measure(current: Any) -> dict[str, Any]:
        sets = {**measured_sets, **({"retain": retain_sample} if retain_sample is not None else {})}
        measured = measure_qa_sets(current, tokenizer, sets, prompt_template=prompt_template)
        point: dict[str, Any] = {"forget": {name: measured[name] for name in measured_sets}}
        if retain_sample is not None:
            point["retain"] = measured["retain"]
        return point

    history = [{"after_request": 0, "name": None, **measure(model)}]
    came_back: list[dict[str, Any]] = []
    # The requests the model went through before (default: the ledger of the folder it was loaded from).
    ledger: list[dict[str, Any]] | None = list(earlier_requests) if earlier_requests is not None else None
    trainer = None
    for k, (request, forget) in enumerate(zip(requests, forget_sets, strict=True), start=1):
        run_config = copy.deepcopy(config)
        run_config.output_dir = os.path.join(config.output_dir, f"request_{k}")
        run_config.logging_dir = os.path.join(run_config.output_dir, "logs")
        # With a ledger the model in memory carries the requests done so far.
        trainer = build_trainer(
            model, tokenizer, run_config, forget, retain, calibration, peft_config, earlier_requests=ledger
        )
        trainer.train()
        model = trainer.model
        if peft_config is not None:
            model = model.merge_and_unload()  # the next request trains its own adapter on this model
        point = {"after_request": k, "name": request.name, **measure(model)}
        record = trainer.record
        point.update(stop_step=record.global_step, stop_kind=record.stop_kind, stop_reason=record.stop_reason)
        history.append(point)
        after = {"forget": point["forget"][request.name]}
        if "retain" in point:
            after["retain"] = point["retain"]
        record.update(after=after, extra=dict(record.extra, request_name=request.name))
        if peft_config is not None:
            record.update(adapter=None)  # merged: the saved model is a plain one
        ledger = full_ledger(record)
        for finding in earlier_requests_back(history):
            came_back.append(finding)
            logger.warning(
                f"Request {k} ({request.name!r}) brought request {finding['request']!r} back: its forget ROUGE-L "
                f"recall rose from {finding['own_run']:.3f} after its own run to {finding['now']:.3f}."
            )
    result = SequenceResult([r.name for r in requests], history, came_back, ledger or [], model=model)
    if save:
        result.paths = _save(result, trainer.record, model, tokenizer, config.output_dir, prompt_template)
    return result


def _save(
    result: SequenceResult, record: Any, model: Any, tokenizer: Any, output_dir: str, prompt_template: str | None
) -> dict[str, str]:
    from ..outputs.model_card import write_model_card
    from ..outputs.plots import plot_sustainability

    os.makedirs(output_dir, exist_ok=True)
    model.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    record.update(
        extra=dict(
            record.extra,
            prompt_template=prompt_template,
            prompt_format=describe_prompt_format(tokenizer, prompt_template),
        )
    )
    paths = {"record": record.save(output_dir), "card": write_model_card(record, output_dir)}
    paths["ledger"] = save_ledger(result.ledger, output_dir)
    paths["sequence"] = os.path.join(output_dir, SEQUENCE_FILE)
    with open(paths["sequence"], "w") as f:
        json.dump(result.to_dict(), f, indent=2)
    paths["markdown"] = os.path.join(output_dir, "sequence.md")
    with open(paths["markdown"], "w") as f:
        f.write(sequence_markdown(result) + "\n")
    paths["plot"] = plot_sustainability(result.history, os.path.join(output_dir, "sustainability.png"))
    return paths


def sequence_markdown(result: SequenceResult) -> str:
    """After each request: the stop, the retain ROUGE-L and every request's forget ROUGE-L (earlier requests that
    came back in bold); then the findings and the ledger."""
    header = "| after request | stopped at step | retain ROUGE-L | " + " | ".join(
        f"forget ROUGE-L: {name}" for name in result.requests
    )
    lines = [header + " |", "|---" * (3 + len(result.requests)) + "|"]
    back = {(c["request"], c["after_request"]) for c in result.came_back}
    for point in result.history:
        k = point["after_request"]
        label = "none (start)" if k == 0 else f"{k}: {point['name']}"
        retain = point.get("retain", {}).get("rouge_l_recall")
        cells = []
        for name in result.requests:
            value = f"{point['forget'][name]['rouge_l_recall']:.3f}"
            cells.append(f"**{value}**" if (name, k) in back else value)
        lines.append(
            f"| {label} | {point.get('stop_step', '-')} | {'-' if retain is None else f'{retain:.3f}'} | "
            + " | ".join(cells)
            + " |"
        )
    if result.came_back:
        lines += [
            "",
            "Earlier requests brought back (forget ROUGE-L rose by more than "
            f"{CAME_BACK_THRESHOLD} over its value after its own run):",
        ]
        lines += [
            f"* {c['request']!r} after request {c['after_request']}: {c['own_run']:.3f} -> {c['now']:.3f}"
            for c in result.came_back
        ]
    else:
        lines += ["", f"No request brought an earlier one back (threshold +{CAME_BACK_THRESHOLD} forget ROUGE-L)."]
    lines += ["", "Request ledger:", "", ledger_markdown(result.ledger)]
    return "\n".join(lines)


def run_sequence_job(sequence_args: Any, config: UnlearnConfig) -> Any:
    """`hf-unlearn sequence`: forget requests one after another
    (:func:`hf_unlearn.jobs.sequence.unlearn_sequentially`).

    Without ``--model_name_or_path`` it runs on the embedded benchmark: its target model, one request per author of
    the forget split, the matching retain split and the calibration authors. Everything given is read and checked
    before the first request trains."""
    prepare_output_dir(config.output_dir, config.overwrite_output_dir)
    start = time.perf_counter()
    peft_config = lora_config(sequence_args.lora_r, sequence_args.lora_target_modules)
    if sequence_args.model_name_or_path is None:
        from ..benchmarks import learn_target_model, load_split, retain_split_for

        if sequence_args.requests:
            raise ValueError("--requests are forget sets of your own model: give --model_name_or_path too.")
        forget = load_split(sequence_args.split)
        authors = list(dict.fromkeys(forget["author"]))
        if not 1 <= sequence_args.num_requests <= len(authors):
            raise ValueError(
                f"--num_requests must be between 1 and {len(authors)}: {sequence_args.split} has {len(authors)} "
                "authors, one request each."
            )
        requests = [
            (f"author {name}", forget.filter(lambda r, name=name: r["author"] == name))
            for name in authors[: sequence_args.num_requests]
        ]
        retain = load_split(retain_split_for(sequence_args.split))
        calibration = load_split("calibration") if reads_calibration(config) else None
        model, tokenizer, _ = learn_target_model(
            cache_dir=sequence_args.cache_dir, architecture=sequence_args.architecture
        )
    else:
        if not sequence_args.requests:
            raise ValueError("Give the forget requests in order: --requests first.json second.json ...")
        requests = [
            (os.path.splitext(os.path.basename(os.path.normpath(path)))[0], load_records(path))
            for path in sequence_args.requests
        ]
        retain = load_records(sequence_args.retain_data) if sequence_args.retain_data else None
        calibration = load_records(sequence_args.calibration_data) if sequence_args.calibration_data else None
        model, tokenizer = load_model_and_tokenizer(sequence_args.model_name_or_path)
    name = sequence_args.model_name_or_path
    earlier = earlier_requests_of(name) if name is not None else None
    result = unlearn_sequentially(
        model,
        tokenizer,
        requests,
        retain,
        config,
        peft_config=peft_config,
        calibration_records=calibration,
        prompt_template=sequence_args.prompt_template,
        question_column=sequence_args.question_column,
        answer_column=sequence_args.answer_column,
        max_eval_examples=sequence_args.max_eval_examples,
        earlier_requests=earlier,
    )
    print("\n" + sequence_markdown(result))
    print(
        f"\nSequence of {len(requests)} requests in {time.perf_counter() - start:.0f} s. Written: "
        f"{', '.join(result.paths.values())}"
    )
    return result


__all__ = [
    "CAME_BACK_THRESHOLD",
    "checked_request_sets",
    "ForgetRequest",
    "earlier_requests_back",
    "run_sequence_job",
    "SequenceResult",
    "sequence_markdown",
    "unlearn_sequentially",
]
