"""Model utility the way the field reports it: standard benchmarks through EleutherAI's lm-evaluation-harness
(Gao et al., "A framework for few-shot language model evaluation", https://github.com/EleutherAI/lm-evaluation-harness),
e.g. MMLU, which SAGO (arXiv 2604.14808) and open-unlearning report utility with.

:func:`lm_eval_utility` scores an in-memory model (full or PEFT, on whatever device it is) through lm-eval's Python
API: an ``HFLM`` wrapping the model and its tokenizer, ``lm_eval.simple_evaluate`` on a list of tasks, and a
``TaskManager`` that also reads the user's own task folders (``include_path``). :func:`check_lm_eval_tasks` checks
that lm-eval is installed and every task exists before any work.

The package ships lm-eval tasks of its own in :data:`TASKS_DIR` (lm-eval's YAML task format), an example of a
user's task: TOFU's real-authors and world-facts questions as 4-way multiple choice (the answer against its three
perturbed answers; Maini et al. 2024, arXiv 2401.06121, §2.4). ``tofu_*_hub`` read them from the Hub
(``locuslab/TOFU``); ``tofu_real_authors`` / ``tofu_world_facts`` from local JSON lines, written with absolute paths
into a folder by :func:`write_tofu_tasks`.

lm-eval is an optional extra (``pip install "hf_unlearn[lm-eval]"``), imported only inside these functions.
"""

from __future__ import annotations

import difflib
import logging as python_logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from transformers.utils import logging

logger = logging.get_logger(__name__)

__all__ = [
    "TASKS_DIR",
    "TOFU_TASKS",
    "LmEvalSettings",
    "MissingExtraError",
    "check_lm_eval_tasks",
    "lm_eval_markdown",
    "lm_eval_rows",
    "lm_eval_utility",
    "write_tofu_tasks",
]

#: The lm-eval task folder shipped with the package (pass it as an include path).
TASKS_DIR = Path(__file__).parent / "lm_eval_tasks"
#: The shipped TOFU tasks that read local files (``<name>.jsonl`` of a TOFU folder) and their Hub variants.
TOFU_TASKS = {"tofu_real_authors": "real_authors.jsonl", "tofu_world_facts": "world_facts.jsonl"}
TOFU_TEMPLATE = "_tofu_mc_template_yaml"
INSTALL_HINT = 'pip install "hf_unlearn[lm-eval]" (or pip install "lm-eval[hf]>=0.4.13")'


class MissingExtraError(ImportError, RuntimeError):
    """An optional dependency is not installed; the message says what to install. (A ``RuntimeError`` too, so the
    command line reports it in one line like the other errors a user can fix.)"""


@dataclass
class LmEvalSettings:
    """What to run through lm-evaluation-harness: task names, the user's task folders, and what is passed through
    to ``lm_eval.simple_evaluate`` (``limit``: the first N documents of each task; ``num_fewshot``: None = each
    task's own default)."""

    tasks: list[str]
    include_path: list[str] = field(default_factory=list)
    limit: int | None = None
    num_fewshot: int | None = None
    batch_size: int = 8


def import_lm_eval() -> Any:
    """The ``lm_eval`` module, or a one-line :class:`MissingExtraError` that says how to install it."""
    try:
        import lm_eval
    except ImportError as error:
        raise MissingExtraError(f"lm-evaluation-harness is not installed ({error}): {INSTALL_HINT}.") from None
    return lm_eval


def check_lm_eval_tasks(settings: LmEvalSettings) -> Any:
    """Check, before any work, that lm-eval is installed, the include paths exist and every task is known; returns
    the ``TaskManager`` to evaluate with.

    With include paths, only they are indexed first (lm-eval's own ~15,000 task files take seconds to index); lm-eval's
    tasks are indexed as well when a task is not among the user's."""
    import_lm_eval()
    from lm_eval.tasks import TaskManager

    if not settings.tasks:
        raise ValueError("No lm-eval task given: name at least one, e.g. --lm_eval_tasks mmlu.")
    for path in settings.include_path:
        if not os.path.isdir(path):
            raise FileNotFoundError(f"lm-eval task folder {path!r} does not exist.")
    include = list(settings.include_path) or None
    manager = None
    if include:
        manager = TaskManager(include_path=include, include_defaults=False)
        if not set(settings.tasks) <= set(manager.all_tasks):
            manager = None
    if manager is None:
        manager = TaskManager(include_path=include)
    known = set(manager.all_tasks)
    unknown = [task for task in settings.tasks if task not in known]
    if unknown:
        hints = []
        for task in unknown:
            close = difflib.get_close_matches(task, known, n=3)
            hints.append(f"{task!r}" + (f" (did you mean {', '.join(close)}?)" if close else ""))
        where = f" in lm-eval's tasks or {', '.join(settings.include_path)}" if settings.include_path else ""
        raise ValueError(
            f"Unknown lm-eval task {'; '.join(hints)}{where}. Your own tasks' folder goes in --lm_eval_include_path; "
            "`lm-eval ls tasks` lists lm-eval's."
        )
    return manager


def write_tofu_tasks(tofu_dir: str, folder: str) -> str:
    """The shipped TOFU tasks (``tofu_real_authors``, ``tofu_world_facts``) written into ``folder`` with the absolute
    paths of ``tofu_dir``'s ``real_authors.jsonl`` / ``world_facts.jsonl`` (rows with ``question``, ``answer`` and a
    ``perturbed_answer`` list), so that they run from any working directory; returns ``folder``, an include path.

    The rows stay where they are: only the task files are written."""
    import yaml

    tofu_dir = os.path.abspath(os.path.expanduser(tofu_dir))
    missing = [name for name in TOFU_TASKS.values() if not os.path.isfile(os.path.join(tofu_dir, name))]
    if missing:
        raise FileNotFoundError(f"TOFU folder {tofu_dir!r} has no {' or '.join(missing)}.")
    os.makedirs(folder, exist_ok=True)
    source = TASKS_DIR / "tofu"
    (Path(folder) / TOFU_TEMPLATE).write_text((source / TOFU_TEMPLATE).read_text())
    for task, data_file in TOFU_TASKS.items():
        text = (source / f"{task}.yaml").read_text()
        config = yaml.safe_load(text)
        config["dataset_kwargs"]["data_files"]["test"] = os.path.join(tofu_dir, data_file)
        header = "".join(line + "\n" for line in text.splitlines() if line.startswith("#"))
        note = f"# Written by hf_unlearn.evaluation.write_tofu_tasks from the shipped task, for {tofu_dir}.\n"
        (Path(folder) / f"{task}.yaml").write_text(header + note + yaml.safe_dump(config, sort_keys=False))
    return folder


@contextmanager
def _quiet_lm_eval_model_warnings() -> Iterator[None]:
    """lm-eval warns that an already built model is passed (not launched by accelerate): that is the point here."""
    lm_eval_logger = python_logging.getLogger("lm_eval")
    level = lm_eval_logger.level
    lm_eval_logger.setLevel(python_logging.ERROR)
    try:
        yield
    finally:
        lm_eval_logger.setLevel(level)


def _metric_name(key: str) -> str:
    """lm-eval's ``"acc,none"`` -> ``"acc"``; another filter is kept: ``"exact_match,strict-match"`` ->
    ``"exact_match/strict-match"``."""
    metric, _, filter_name = key.partition(",")
    return metric if filter_name in ("", "none") else f"{metric}/{filter_name}"


def lm_eval_utility(
    model: Any,
    tokenizer: Any,
    settings: LmEvalSettings,
    task_manager: Any = None,
) -> dict[str, Any]:
    """Score ``model`` (in memory: full or PEFT, on its own device) on ``settings.tasks`` with lm-evaluation-harness.

    Returns (JSON-serialisable) ``{"tasks": {task: {metric: value, metric + "_stderr": value, "num_examples": n}},
    "settings": ..., "lm_eval_version": ..., "seconds": ...}``; metrics as lm-eval names them (``acc``,
    ``acc_norm``, ...). ``task_manager``: the one :func:`check_lm_eval_tasks` returned (checked again if not given).
    HFLM puts the model in eval mode; its training mode is restored afterwards."""
    lm_eval = import_lm_eval()
    from lm_eval.models.huggingface import HFLM

    if task_manager is None:
        task_manager = check_lm_eval_tasks(settings)
    was_training = model.training
    start = time.perf_counter()
    try:
        with _quiet_lm_eval_model_warnings():
            wrapped = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=settings.batch_size)
        output = lm_eval.simple_evaluate(
            model=wrapped,
            tasks=list(settings.tasks),
            num_fewshot=settings.num_fewshot,
            limit=settings.limit,
            task_manager=task_manager,
            log_samples=False,
        )
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - start
    samples = output.get("n-samples") or {}
    tasks: dict[str, dict[str, Any]] = {}
    for task, values in output["results"].items():
        metrics: dict[str, Any] = {}
        for key, value in values.items():
            if "," not in key:  # alias, name, sample_len
                continue
            metrics[_metric_name(key)] = float(value) if isinstance(value, int | float) else None  # "N/A" stderr
        if task in samples:
            metrics["num_examples"] = samples[task].get("effective")
        tasks[task] = metrics
    logger.info(f"lm-eval on {', '.join(settings.tasks)}: {seconds:.0f} s.")
    return {
        "tasks": tasks,
        "settings": asdict(settings),
        "lm_eval_version": getattr(lm_eval, "__version__", None),
        "seconds": seconds,
    }


def comparable(before: dict[str, Any] | None, after: dict[str, Any] | None) -> bool:
    """Whether two measurements ran the same tasks on the same documents (same limit and few-shot setting)."""
    if not before or not after:
        return False
    keys = ("tasks", "limit", "num_fewshot")
    return all(before["settings"].get(key) == after["settings"].get(key) for key in keys)


def lm_eval_rows(before: dict[str, Any] | None, after: dict[str, Any] | None) -> list[tuple[str, str, Any, Any]]:
    """``(task, metric, before, after)`` for every task and metric measured (stderr and counts left out). Without an
    ``after`` the rows show ``before`` alone; a ``before`` not measured on the same documents as ``after``
    (:func:`comparable`) shows as ``None``."""
    shown = after if after is not None else before
    if not shown:
        return []
    earlier = before if after is not None and comparable(before, after) else None
    rows = []
    for task, metrics in shown["tasks"].items():
        for metric, value in metrics.items():
            if "_stderr" in metric or metric == "num_examples":
                continue
            if after is None:
                rows.append((task, metric, value, None))
            else:
                previous = ((earlier or {}).get("tasks", {}).get(task) or {}).get(metric)
                rows.append((task, metric, previous, value))
    return rows


def lm_eval_markdown(before: dict[str, Any] | None, after: dict[str, Any] | None, fmt: Any = None) -> str:
    """A "before -> after" Markdown table of lm-eval's scores per task and metric, with how they were measured;
    ``""`` when nothing was measured. ``fmt`` formats a value (default 4 significant digits, ``-`` for None)."""
    rows = lm_eval_rows(before, after)
    if not rows:
        return ""
    if fmt is None:

        def fmt(value: Any) -> str:
            return "-" if value is None else format(value, ".4g") if isinstance(value, float) else str(value)

    latest = after or before
    settings = latest["settings"]
    counts = sorted({str(m.get("num_examples")) for m in latest["tasks"].values() if m.get("num_examples")})
    lines = ["| task | metric | before | after |", "|---|---|---|---|"]
    lines += [f"| {task} | {metric} | {fmt(b)} | {fmt(a)} |" for task, metric, b, a in rows]
    how = [f"lm-evaluation-harness {latest.get('lm_eval_version') or ''}".rstrip()]
    how.append(f"{'/'.join(counts)} examples per task" if counts else "")
    if settings.get("limit") is not None:
        how.append(f"limit {settings['limit']}")
    how.append(f"{settings['num_fewshot']}-shot" if settings.get("num_fewshot") is not None else "tasks' own few-shot")
    if before and after and not comparable(before, after):
        how.append("the before measurement used other settings and is not shown")
    return "\n".join(lines) + "\n\n" + "; ".join(part for part in how if part) + ".\n"
