"""The output folder of a run: refused when it already holds another run, checked for writing before any work, and
the checkpoint a resume starts from.

transformers 5 dropped ``overwrite_output_dir``; a run that silently wrote over an earlier one left the old
checkpoints beside the new ones, and a later resume picked the wrong run. Here an earlier run is kept unless the
user says to overwrite it or to resume it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile

from transformers.trainer_utils import get_last_checkpoint
from transformers.utils import logging

from .record import RECORD_FILE

logger = logging.get_logger(__name__)

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-\d+$")
MODEL_FILES = ("model.safetensors", "model.safetensors.index.json", "adapter_model.safetensors", "pytorch_model.bin")


def previous_run(output_dir: str) -> list[str]:
    """What in ``output_dir`` belongs to an earlier run: checkpoint folders, a run record, saved weights."""
    if not os.path.isdir(output_dir):
        return []
    names = sorted(os.listdir(output_dir))
    return [n for n in names if CHECKPOINT_PATTERN.match(n) and os.path.isdir(os.path.join(output_dir, n))] + [
        n for n in names if n == RECORD_FILE or n in MODEL_FILES
    ]


def prepare_output_dir(output_dir: str, overwrite: bool = False, resuming: bool = False) -> None:
    """Refuse a folder holding an earlier run (unless ``overwrite`` or ``resuming``), clear an overwritten run's
    checkpoints and record, and make sure the folder can be written, all before any weights change."""
    found = previous_run(output_dir)
    if found and not resuming:
        if not overwrite:
            shown = ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
            raise FileExistsError(
                f"output_dir {output_dir!r} already holds a run ({shown}). Pass overwrite_output_dir=True "
                "(--overwrite_output_dir) to replace it, resume_from_checkpoint=True (--resume_from_checkpoint true) "
                "to continue it, or choose another output_dir."
            )
        stale = [n for n in found if CHECKPOINT_PATTERN.match(n) or n == RECORD_FILE]
        for name in stale:
            path = os.path.join(output_dir, name)
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
        if stale:
            logger.warning(
                f"overwrite_output_dir: removed the earlier run's {', '.join(stale)} from {output_dir!r}, so that a "
                "later resume cannot pick them up."
            )
    check_writable(output_dir)


def check_writable(output_dir: str) -> None:
    """Fail now, not at the first save after the whole training, when ``output_dir`` cannot be written: an existing
    folder gets a test file; a folder still to be made needs its nearest existing parent to be a writable folder
    (it is not created here, so a run that fails later leaves nothing behind)."""
    problem = None
    if os.path.isdir(output_dir):
        try:
            with tempfile.NamedTemporaryFile(dir=output_dir, prefix=".hf_unlearn_write_test"):
                pass
        except OSError as error:
            problem = f"{type(error).__name__}: {error.strerror or error}"
    elif os.path.exists(output_dir):
        problem = "it is a file"
    else:
        parent = os.path.dirname(os.path.abspath(output_dir))
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            problem = f"{parent!r} is a file, so no folder can be made below it"
        elif not os.access(parent, os.W_OK | os.X_OK):
            problem = f"no permission to create a folder in {parent!r}"
    if problem:
        raise PermissionError(
            f"output_dir {output_dir!r} cannot be written ({problem}); the model, checkpoints and report go there. "
            "Choose a folder you can write to."
        )


def resolve_resume(value: str | bool | None, output_dir: str) -> str | None:
    """The checkpoint folder ``resume_from_checkpoint`` names: ``True``/``"true"`` means the last ``checkpoint-N``
    in ``output_dir``; a path must exist. ``None``/``False``/``"false"``: no resume."""
    if value is None or value is False or (isinstance(value, str) and value.lower() in ("", "false", "none")):
        return None
    if value is True or (isinstance(value, str) and value.lower() == "true"):
        last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
        if last is None:
            raise FileNotFoundError(
                f"resume_from_checkpoint=true, but output_dir {output_dir!r} holds no checkpoint-N folder to resume "
                "from. Checkpoints are written every save_steps (save_strategy='steps')."
            )
        return last
    if not os.path.isdir(value):
        raise FileNotFoundError(f"resume_from_checkpoint {value!r} is not a folder: there is no checkpoint there.")
    if not any(os.path.exists(os.path.join(value, name)) for name in ("trainer_state.json", *MODEL_FILES)):
        raise FileNotFoundError(
            f"resume_from_checkpoint {value!r} holds no checkpoint (no trainer_state.json or weights); point it at a "
            "checkpoint-N folder written by a run."
        )
    return value


__all__ = ["check_writable", "prepare_output_dir", "previous_run", "resolve_resume"]
