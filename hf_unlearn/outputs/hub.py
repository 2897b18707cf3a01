"""Pushing a run to the Hub: refused before anything is written when the Hub cannot be reached, when a LoRA base
nobody else can load, or when the run's own record does not say the forget set was forgotten."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

from ..training.ledger import LEDGER_FILE
from ..training.record import RECORD_FILE, UnlearnRecord

ADAPTER_CONFIG = "adapter_config.json"


def ensure_hub_reachable(output_dir: str | None = None, timeout: float = 5.0) -> None:
    """Raise ``ConnectionError`` naming the reason when a push cannot reach the Hub.

    Checked before Trainer's ``push_to_hub`` saves anything, so an offline push leaves the output folder as it
    was. Offline mode (``HF_HUB_OFFLINE=1``) is reported without touching the network.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    kept = f" Nothing was written or uploaded; the saved model stays in {output_dir!r}." if output_dir else ""
    setting = os.environ.get("HF_HUB_OFFLINE")
    offline = constants.HF_HUB_OFFLINE if setting is None else setting.lower() in ("1", "true", "yes", "on")
    if offline:
        raise ConnectionError(
            "Cannot push to the Hugging Face Hub: offline mode is on (HF_HUB_OFFLINE=1). Unset it on a machine "
            f"with network access and push again.{kept}"
        )
    endpoint = os.environ.get("HF_ENDPOINT", constants.ENDPOINT)
    try:
        get_session().head(endpoint, timeout=timeout)
    except Exception as error:  # requests/httpx raise different types for DNS, refused and timeout
        raise ConnectionError(
            f"Cannot push to the Hugging Face Hub: {endpoint} is not reachable ({type(error).__name__}: {error})."
            f" Check the network connection and proxy settings.{kept}"
        ) from error


def unverified_reasons(model_dir: str) -> list[str]:
    """What in a saved run's own record says the forget set still tells, or was never judged
    (:func:`record_unverified_reasons`); a folder with no record is one such reason."""
    if not os.path.isfile(os.path.join(model_dir, RECORD_FILE)):
        return [f"{model_dir!r} holds no run record ({RECORD_FILE}), so nothing says what it forgot"]
    return record_unverified_reasons(UnlearnRecord.load(model_dir), model_dir)


def record_unverified_reasons(record: UnlearnRecord, model_dir: str) -> list[str]:
    """What in a run's record says the forget set still tells, or was never judged: a failed run (the utility
    floor); the membership verdict (the audit's, else the demo's evaluation, else a MUSE evaluation's after
    unlearning, as the card reads it) not landed, or none at all; a failed quantization verdict (forgotten answers
    back after a 4-bit reload). Empty when nothing does. ``model_dir``: where the run is saved, named in the hint
    that judges it."""
    from ..evaluation.membership import membership_verdict_line
    from .card_metadata import membership_places

    reasons = []
    if record.stop_kind == "utility_floor":
        reasons.append(f"the run failed ({record.stop_reason})")
    verdicts = (record.audit or {}).get("verdicts") or {}
    # the audit's verdicts come first; else the evaluation's verdict, read where the card reads it
    evaluated = next(
        (
            measured[key]
            for source, measured, key in membership_places(record)
            if source != "audit" and measured and measured.get(key)
        ),
        None,
    )
    if "membership" in verdicts:
        if verdicts["membership"]["passed"] is not True:
            reasons.append(f"the audit's membership verdict: {verdicts['membership']['finding']}")
    elif evaluated is not None:
        if not evaluated.get("landed"):
            reasons.append(membership_verdict_line(evaluated).rstrip("."))
    else:
        reasons.append(
            "no membership verdict: the forget set was never read against never-seen data (`hf-unlearn audit "
            f"--model_name_or_path {model_dir}` judges it)"
        )
    quantization = verdicts.get("quantization")
    if quantization is not None and quantization["passed"] is False:
        reasons.append(f"the audit's quantization verdict: {quantization['finding']}")
    return reasons


def mark_pushed_unverified(record: UnlearnRecord, reasons: list[str]) -> UnlearnRecord:
    """``record`` with what it is pushed despite under ``extra.pushed_unverified`` (the card's warning), or without
    that mark where ``reasons`` is empty: a verified push leaves no earlier push's warning behind."""
    extra = {key: value for key, value in record.extra.items() if key != "pushed_unverified"}
    return record.update(extra={**extra, "pushed_unverified": reasons} if reasons else extra)


def check_verified(model_dir: str, push_unverified: bool) -> list[str]:
    """Refuse (``ValueError``, nothing written or uploaded) a run whose record does not say the forget set was
    forgotten (:func:`unverified_reasons`), unless ``push_unverified``; returns the reasons pushed despite."""
    reasons = unverified_reasons(model_dir)
    if reasons and not push_unverified:
        raise ValueError(
            f"hf-unlearn push: {model_dir!r} is not pushed, because its own record does not say the forget set was "
            f"forgotten: {'; '.join(reasons)}. Pass --push_unverified true to publish it anyway (its card then says "
            "so). Nothing was written or uploaded."
        )
    return reasons


def push_folder(
    model_dir: str,
    repo_id: str,
    merge_adapter: bool = False,
    private: bool = True,
    base_model_id: str | None = None,
    push_unverified: bool = False,
) -> str:
    """Push a saved unlearned model (with its README.md model card) to ``repo_id``; returns the repo URL. The
    repository is created private unless ``private=False`` asks for a public one. A run whose own record does not
    say the forget set was forgotten is refused unless ``push_unverified`` (:func:`check_verified`); its card then
    says what the record said.

    A LoRA output is pushed as the adapter, or with ``merge_adapter`` merged into its base model first (the card
    is kept either way). An adapter whose base is a local path, which nobody else can load, is refused unless it is
    merged or ``base_model_id`` names the Hub model that base is a copy of: the pushed ``adapter_config.json``, run
    record and card then name that id (the folder itself keeps the local path). Fails before anything is written
    when the adapter's base or the Hub is not usable.
    """
    from huggingface_hub import HfApi

    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"{model_dir!r} is not a folder; pass the output_dir of an unlearning run.")
    check_adapter_base(model_dir, merge_adapter, base_model_id)
    unverified = check_verified(model_dir, push_unverified)
    ensure_hub_reachable(model_dir)
    card_for_repo(model_dir, repo_id, unverified)
    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    is_adapter = os.path.exists(os.path.join(model_dir, ADAPTER_CONFIG))
    with tempfile.TemporaryDirectory() as staging:
        if merge_adapter and is_adapter:
            stage_merged(model_dir, staging)
            api.upload_folder(folder_path=staging, repo_id=repo_id, commit_message="Unlearned model (merged LoRA)")
        elif base_model_id is not None:
            stage_adapter_on(model_dir, staging, base_model_id, repo_id)
            api.upload_folder(
                folder_path=staging, repo_id=repo_id, commit_message=f"Unlearned model (LoRA on {base_model_id})"
            )
        else:
            api.upload_folder(
                folder_path=model_dir,
                repo_id=repo_id,
                commit_message="Unlearned model",
                ignore_patterns=["checkpoint-*", "runs/*"],
            )
    return str(url)


def check_adapter_base(model_dir: str, merge_adapter: bool = False, base_model_id: str | None = None) -> None:
    """Refuse, before anything is written or uploaded, to push a LoRA adapter whose base model is a local path (its
    ``adapter_config.json``'s ``base_model_name_or_path``), unless it is merged or ``base_model_id`` is given; and a
    ``base_model_id`` that is not an ``ORG/NAME`` Hub id, or that has no adapter to go with."""
    from ..training.base_model import names_local_path
    from .card_metadata import is_hub_id

    config_path = os.path.join(model_dir, ADAPTER_CONFIG)
    if base_model_id is not None:
        if not os.path.isfile(config_path):
            raise ValueError(
                f"--base_model_id names the Hub base of a LoRA adapter, but {model_dir!r} holds a whole model (no "
                f"{ADAPTER_CONFIG}): leave it out."
            )
        if merge_adapter:
            raise ValueError(
                "--merge_adapter true pushes merged weights, which need no base; --base_model_id is for pushing the "
                "adapter itself. Pass one of them."
            )
        if names_local_path(base_model_id) or not is_hub_id(base_model_id):
            raise ValueError(f"--base_model_id {base_model_id!r} is not a Hub model id of the form ORG/NAME.")
        return
    if merge_adapter or not os.path.isfile(config_path):
        return
    with open(config_path) as f:
        base = json.load(f).get("base_model_name_or_path")
    if names_local_path(base):
        raise ValueError(
            f"{model_dir!r} is a LoRA adapter whose base model is the local path {base!r} (base_model_name_or_path "
            f"in its {ADAPTER_CONFIG}), which nobody else can load. Push it merged into that base with "
            "--merge_adapter true, or name the Hub model the base is a copy of with --base_model_id ORG/NAME (the "
            f"pushed {ADAPTER_CONFIG} then names it). Nothing was written or uploaded."
        )


def stage_merged(model_dir: str, staging: str) -> None:
    """The adapter merged into its base, with the tokenizer, card, run record and request ledger, in ``staging``."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    AutoPeftModelForCausalLM.from_pretrained(model_dir).merge_and_unload().save_pretrained(staging)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(staging)
    for name in ("README.md", RECORD_FILE, LEDGER_FILE):
        if os.path.exists(os.path.join(model_dir, name)):
            shutil.copyfile(os.path.join(model_dir, name), os.path.join(staging, name))


def stage_adapter_on(model_dir: str, staging: str, base_model_id: str, repo_id: str) -> None:
    """A copy of the adapter folder in ``staging`` whose adapter config, run record and card name ``base_model_id``
    as the base (the record keeps the SHA-256 of the local copy's weights files, so that others can compare theirs;
    not the local path)."""
    shutil.copytree(model_dir, staging, dirs_exist_ok=True, ignore=shutil.ignore_patterns("checkpoint-*", "runs"))
    config_path = os.path.join(staging, ADAPTER_CONFIG)
    with open(config_path) as f:
        config = json.load(f)
    with open(config_path, "w") as f:
        json.dump({**config, "base_model_name_or_path": base_model_id}, f, indent=2)
    if os.path.isfile(os.path.join(staging, RECORD_FILE)):
        from .model_card import write_model_card

        record = UnlearnRecord.load(staging).update(base_model=base_model_id)
        record.save(staging)
        write_model_card(record, staging, repo_id=repo_id)


def card_for_repo(model_dir: str, repo_id: str, unverified: list[str] | None = None) -> None:
    """Rewrite the folder's model card from its run record so that it loads from ``repo_id`` (not a local path) and,
    pushed despite its record (``unverified``), says so; the record keeps what it was pushed despite, and a verified
    push (say, after `hf-unlearn audit` gave the run its verdict) clears an earlier push's mark, as the trainer's
    push does."""
    if os.path.isfile(os.path.join(model_dir, RECORD_FILE)):
        from .model_card import write_model_card

        record = UnlearnRecord.load(model_dir)
        if unverified or "pushed_unverified" in record.extra:
            mark_pushed_unverified(record, unverified or []).save(model_dir)
        write_model_card(record, model_dir, repo_id=repo_id)
