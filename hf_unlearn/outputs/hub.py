"""Hub access checks: fail before anything is written when the Hub cannot be reached."""

from __future__ import annotations

import os
import shutil

from ..training.ledger import LEDGER_FILE
from ..training.record import RECORD_FILE


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


def push_folder(model_dir: str, repo_id: str, merge_adapter: bool = False, private: bool | None = None) -> str:
    """Push a saved unlearned model (with its README.md model card) to ``repo_id``; returns the repo URL.

    A LoRA output is pushed as the adapter, or with ``merge_adapter`` merged into its base model first (the card
    is kept either way). Fails before anything is written when the Hub is unreachable.
    """
    from huggingface_hub import HfApi

    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"{model_dir!r} is not a folder; pass the output_dir of an unlearning run.")
    ensure_hub_reachable(model_dir)
    _card_for_repo(model_dir, repo_id)
    api = HfApi()
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    is_adapter = os.path.exists(os.path.join(model_dir, "adapter_config.json"))
    if merge_adapter and is_adapter:
        import tempfile

        from peft import AutoPeftModelForCausalLM
        from transformers import AutoTokenizer

        merged = AutoPeftModelForCausalLM.from_pretrained(model_dir).merge_and_unload()
        with tempfile.TemporaryDirectory() as staging:
            merged.save_pretrained(staging)
            AutoTokenizer.from_pretrained(model_dir).save_pretrained(staging)
            # The card, the run record and the request ledger travel with the merged weights.
            for name in ("README.md", RECORD_FILE, LEDGER_FILE):
                if os.path.exists(os.path.join(model_dir, name)):
                    shutil.copyfile(os.path.join(model_dir, name), os.path.join(staging, name))
            api.upload_folder(folder_path=staging, repo_id=repo_id, commit_message="Unlearned model (merged LoRA)")
    else:
        api.upload_folder(
            folder_path=model_dir,
            repo_id=repo_id,
            commit_message="Unlearned model",
            ignore_patterns=["checkpoint-*", "runs/*"],
        )
    return str(url)


def _card_for_repo(model_dir: str, repo_id: str) -> None:
    """Rewrite the folder's model card from its run record so that it loads from ``repo_id`` (not a local path)."""
    from ..training.record import RECORD_FILE, UnlearnRecord

    if os.path.isfile(os.path.join(model_dir, RECORD_FILE)):
        from .model_card import write_model_card

        write_model_card(UnlearnRecord.load(model_dir), model_dir, repo_id=repo_id)
