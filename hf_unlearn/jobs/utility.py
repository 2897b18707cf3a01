"""The lm-evaluation-harness options every command that measures utility shares (``--lm_eval_tasks``,
``--lm_eval_include_path``, ``--lm_eval_tofu_dir``, ``--lm_eval_limit``, ...; :class:`~hf_unlearn.cli.arguments.
LmEvalArguments`): turned into :class:`~hf_unlearn.evaluation.utility.LmEvalSettings` and checked before any work, so
that a missing extra or an unknown task is reported before a model is loaded or trained."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any

from ..evaluation.utility import LmEvalSettings, check_lm_eval_tasks, lm_eval_utility, write_tofu_tasks

#: Where ``--lm_eval_tofu_dir`` writes the shipped TOFU tasks, inside the command's output folder.
TOFU_TASKS_FOLDER = "lm_eval_tasks"


@dataclass
class LmEvalRequest:
    """The checked settings and the lm-eval ``TaskManager`` that found every task (indexing tasks takes seconds, so
    the check's manager is the one the measurements use)."""

    settings: LmEvalSettings
    task_manager: Any

    def measure(self, model: Any, tokenizer: Any) -> dict[str, Any]:
        return lm_eval_utility(model, tokenizer, self.settings, self.task_manager)


def lm_eval_request(cli: Any, output_dir: str) -> LmEvalRequest | None:
    """The lm-eval measurement the command line asks for, checked now (lm-eval installed, task folders present, every
    task known); ``None`` without ``--lm_eval_tasks``. With ``--lm_eval_tofu_dir`` the shipped TOFU tasks are first
    written for that folder into ``output_dir/lm_eval_tasks`` (removed again when the check fails)."""
    if not cli.lm_eval_tasks:
        given = [
            f"--{name}"
            for name in ("lm_eval_include_path", "lm_eval_tofu_dir", "lm_eval_limit", "lm_eval_num_fewshot")
            if getattr(cli, name)
        ]
        if given:
            raise ValueError(f"{', '.join(given)} go with --lm_eval_tasks: name the lm-eval tasks to run.")
        return None
    include = [os.path.abspath(os.path.expanduser(path)) for path in cli.lm_eval_include_path]
    written = None
    if cli.lm_eval_tofu_dir:
        created = not os.path.exists(output_dir)
        written = os.path.abspath(os.path.join(output_dir, TOFU_TASKS_FOLDER))
        include.append(write_tofu_tasks(cli.lm_eval_tofu_dir, written))
    settings = LmEvalSettings(
        tasks=list(cli.lm_eval_tasks),
        include_path=include,
        limit=cli.lm_eval_limit,
        num_fewshot=cli.lm_eval_num_fewshot,
        batch_size=cli.lm_eval_batch_size,
    )
    try:
        return LmEvalRequest(settings, check_lm_eval_tasks(settings))
    except Exception:
        if written is not None:  # a command that fails its checks leaves nothing behind
            shutil.rmtree(written, ignore_errors=True)
            if created and not os.listdir(output_dir):
                os.rmdir(output_dir)
        raise
