"""Whether the Hugging Face hub can serve a named dataset on this machine, asked before anything starts
(:func:`hetfl.launch.preflight`): in the local Hugging Face caches, or one bounded request to the hub.

The endpoint, the hub cache and its folder names, the offline switch and the request are huggingface_hub's
(:mod:`huggingface_hub.constants`, :class:`huggingface_hub.HfApi`), as `datasets` uses them.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from huggingface_hub import constants

HUB_PROBE_TIMEOUT_S = 5.0  # pre-flight: one look at the hub, never retried (hetfl.launch.preflight)


def hub_endpoint() -> str:
    """The Hugging Face hub the datasets library talks to (``HF_ENDPOINT``, else huggingface.co)."""
    return constants.ENDPOINT


def hub_cached(hub_id: str) -> bool:
    """Whether the hub dataset is in this machine's Hugging Face caches (hub snapshots or the datasets cache), from
    which ``datasets`` loads it offline."""
    from huggingface_hub.file_download import repo_folder_name

    # `datasets`' own cache, by its rule (datasets.config, whose import alone takes seconds, holds the same)
    cache = Path(os.environ.get("HF_DATASETS_CACHE") or Path(constants.HF_HOME) / "datasets")
    org, _, name = hub_id.partition("/")
    return (Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=hub_id, repo_type="dataset")).is_dir() \
        or (cache / f"{org}___{name}").is_dir()


def _offline() -> bool:
    """huggingface_hub's offline switch (``HF_HUB_OFFLINE``), or `datasets`' own (``HF_DATASETS_OFFLINE``)."""
    return constants.is_offline_mode() or os.environ.get("HF_DATASETS_OFFLINE", "").upper() in constants.ENV_VARS_TRUE_VALUES


def _probe_hub(hub_id: str, timeout: float) -> str | None:
    """One request for the dataset's hub entry (:meth:`huggingface_hub.HfApi.dataset_info`, with the user's token),
    bounded by `timeout` in all: the request's own timeout does not bound name resolution. None if the hub has it."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    url = f"{hub_endpoint()}/api/datasets/{hub_id}"
    out: list[str | None] = []

    def get() -> None:
        try:
            HfApi(endpoint=hub_endpoint()).dataset_info(hub_id, timeout=timeout)
            out.append(None)
        except HfHubHTTPError as err:
            out.append(f"the hub answered HTTP {err.response.status_code} for {url}")
        except Exception as err:  # noqa: BLE001 - name resolution, connection, TLS and timeouts come in many types
            out.append(f"the hub did not answer ({url}: {err})")

    t = threading.Thread(target=get, name="hub-probe", daemon=True)
    t.start()
    t.join(timeout)
    return out[0] if out else f"the hub did not answer within {timeout:g} s ({url})"


def hub_unavailable(hub_id: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> str | None:
    """Why the hub cannot serve dataset `hub_id` here (one phrase), or None when it can: in the local Hugging Face
    cache, or the hub answered one request within `timeout` s. With ``HF_HUB_OFFLINE`` set nothing is sent."""
    if not hub_id:
        return "it has no Hugging Face hub version"
    if hub_cached(hub_id):
        return None
    if _offline():
        return "it is not in the Hugging Face cache and HF_HUB_OFFLINE is set"
    return _probe_hub(hub_id, timeout)
