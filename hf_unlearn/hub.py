"""Hub access checks: fail before anything is written when the Hub cannot be reached."""

from __future__ import annotations

import os


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
