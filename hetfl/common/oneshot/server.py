"""One-shot phase 1, server side (FENS Sec. 3.1): every client trains once and uploads its model; the checked uploads
become the run's :class:`~.ensemble.Ensemble`, with the bytes and times they cost."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from hetfl.common.comm import UNATTRIBUTED, MeteredGrid, Traffic, take_traffic
from hetfl.common.nodes import ClientMap
from hetfl.common.progress import heartbeat
from hetfl.common.strategy import check_arrays, check_weight, validate_replies
from hetfl.common.task import log, make_model, model_to_arrays
from hetfl.common.rundata import num_classes

from . import Phase1
from .artifacts import phase1_settings
from .ensemble import Ensemble


def collect_local_models(grid: MeteredGrid, cmap: ClientMap, clients: list[int], cfg: dict[str, Any], phase1: Phase1, *,
                         diff_init: bool = False, template: torch.nn.Module | None = None, label: str = "") -> Ensemble:
    """One-shot local training (FENS Sec. 3.1) of a hetfl run: :func:`gather_local_models` with the run's model,
    timeouts and classes, the ensemble's settings recorded for a later reuse.

    FENS's `phase1` message has clients train on their 90% split; the one-shot baselines' on all their data
    (docs/readings.md#oneshot).

    Parameters
    ----------
    diff_init : send no model: every client starts from its own random one.
    label : how the log names the phase (default "<method> phase 1").
    template : the module whose state (keys, shapes, dtypes) the replies must carry; default the run's model
        (FedCVAE-Ens: its CVAE's decoder, with ``diff_init``).
    """
    init = make_model(cfg) if template is None else template
    ens = gather_local_models(grid, cmap, clients, model_to_arrays(init), phase1.message, send_init=not diff_init,
                              num_classes=num_classes(cfg), timeout=cfg["round-timeout"],
                              progress=cfg["progress-interval"], label=label or f"{cfg['method']} phase 1")
    ens.settings = phase1_settings(cfg, phase1, len(clients))
    return ens


def gather_local_models(grid, cmap: ClientMap, clients: list[int], initial: ArrayRecord, message_type: str, *,
                        send_init: bool = True, num_classes: int, timeout: float, progress: float = 10.0,
                        label: str = "phase 1", train_config: ConfigRecord | None = None) -> Ensemble:
    """Send every client the `initial` model (unless not `send_init`: each starts from its own), collect its trained
    model once; the checked uploads (keys, shapes and dtypes of `initial`, finite values, `num_classes` label counts),
    in client-id order, are the :class:`~.ensemble.Ensemble` (FENS Sec. 3.1), with the bytes and times they cost:
    :func:`phase1_messages`, then :func:`phase1_ensemble` of the replies."""
    t0 = time.perf_counter()
    messages = phase1_messages(cmap, clients, initial, message_type, send_init=send_init, train_config=train_config)
    log.info("%s: %d clients train the model once on their data (one-shot)", label, len(clients))
    with heartbeat(f"{label}: {len(clients)} clients training locally", progress):
        raw = cmap.send_and_receive(grid, messages, timeout)
    return phase1_ensemble(grid, raw, cmap, clients, initial, num_classes=num_classes, label=label, started=t0)


def phase1_messages(cmap: ClientMap, clients: list[int], initial: ArrayRecord, message_type: str, *,
                    send_init: bool = True, train_config: ConfigRecord | None = None) -> list[Message]:
    """Phase 1's messages (FENS Sec. 3.1): `train_config` and ``server-round`` 0, and the `initial` model unless not
    `send_init` (each client then starts from its own random one)."""
    content = RecordDict({"config": ConfigRecord({**dict(train_config or {}), "server-round": 0})})
    if send_init:  # the common initial model travels (and is counted); diff-init: built on the client
        content["arrays"] = initial
    return [cmap.message(c, content, message_type) for c in clients]


def phase1_ensemble(grid, raw: list[Message], cmap: ClientMap, clients: list[int], initial: ArrayRecord, *,
                    num_classes: int, label: str = "phase 1", started: float | None = None) -> Ensemble:
    """Phase 1's replies checked against `initial` (its keys, shapes and dtypes) and made the ensemble, with the
    traffic taken from `grid` and the wall time since `started` (``time.perf_counter()``)."""
    t0 = time.perf_counter() if started is None else started
    reference = {k: v.numpy() for k, v in initial.items()}
    kept, rejected, epochs = _usable_models(raw, cmap, clients, num_classes, reference, label)
    traffic = take_traffic(grid)
    wall = time.perf_counter() - t0
    log.info("%s: %d local models in %.1fs (%.1f MB up)", label, len(kept), wall, traffic.bytes_up / 1e6)
    return Ensemble(
        states=[st for _, st, _, _, _ in kept],
        client_ids=[cmap.client_of(r) for r, *_ in kept],
        label_counts=np.array([counts for *_, counts, _ in kept], dtype=np.int64),
        num_examples=[int(n) for _, _, n, _, _ in kept],
        phase1={"upload_bytes": traffic.bytes_up, "phase1_request_bytes": traffic.bytes_down, "phase1_wall_s": wall,
                "phase1_client_train_s": [secs for *_, secs in kept],
                "rejected_models": rejected, "phase1_comm_s": traffic.comm_s,
                "phase1_by_client": {"down": _by_client(traffic.down), "up": _by_client(traffic.up),
                                     "flops": _by_client(traffic.flops)},
                **({"phase1_member_epochs": [epochs[cmap.client_of(r)] for r, *_ in kept]}
                   if any(epochs.get(cmap.client_of(r)) is not None for r, *_ in kept) else {})},
    )


def _by_client(counts: dict[int, int]) -> dict[str, int]:
    return {str(c): int(v) for c, v in sorted(counts.items())}


def phase1_traffic(phase1: dict[str, Any]) -> Traffic:
    """Phase 1's bytes and FLOPs per client as a :class:`~hetfl.common.comm.Traffic` period (round 0 carries it); an
    ensemble saved before per-client counts were kept gives its totals under :data:`UNATTRIBUTED` (no client: the
    round's per-client columns and simulated clock leave them out)."""
    by = phase1.get("phase1_by_client")
    if by is None:
        return Traffic(down={UNATTRIBUTED: phase1["phase1_request_bytes"]}, up={UNATTRIBUTED: phase1["upload_bytes"]})
    return Traffic(**{k: {int(c): int(v) for c, v in by[k].items()} for k in ("down", "up", "flops")})


def _usable_models(raw: list[Message], cmap: ClientMap, clients: list[int], C: int, reference: dict[str, np.ndarray],
                   phase: str) -> tuple[list[tuple], int, dict[int, int | None]]:
    """Phase 1's replies checked (keys, shapes, dtypes, finite values, label counts), in client-id order, without the
    models of clients that hold no data; returns ([(reply, state, n, label counts, train s)], rejected, epochs kept)."""
    expected = {k: tuple(v.shape) for k, v in reference.items()}
    dtypes = {k: v.dtype for k, v in reference.items()}
    epochs: dict[int, int | None] = {}  # client -> local epochs kept (members trained to completion)

    def check(r: Message) -> tuple[dict[str, np.ndarray], float, list[int], float]:
        metrics = r.content["metrics"]
        counts = [int(c) for c in metrics["label_counts"]]
        if len(counts) != C or min(counts) < 0:
            raise ValueError(f"label_counts: expected {C} non-negative counts, got {len(counts)}")
        # check_arrays: keys, shapes, dtypes, finite values (a diverged model would make every prediction NaN)
        epochs[cmap.client_of(r)] = int(metrics["epochs"]) if "epochs" in metrics else None
        return (check_arrays(r.content["arrays"], expected, dtypes), check_weight(metrics["num-examples"]), counts,
                float(metrics["train_s"]) if "train_s" in metrics else 0.0)

    valid, _, rejected = validate_replies(raw, check, 0, cmap, set(clients))
    valid.sort(key=lambda pair: cmap.client_of(pair[0]))
    for r, (_, n, _, _) in valid:
        if n == 0:  # only with dirichlet-min-size = 0: a client without data
            log.warning("%s: client %d has no local training data; its (untrained) model is left out", phase, cmap.client_of(r))
    rejected += sum(n == 0 for _, (_, n, _, _) in valid)
    kept = [(r, st, n, counts, secs) for r, (st, n, counts, secs) in valid if n > 0]
    if not kept:
        raise RuntimeError(f"{phase}: no client returned a usable local model")
    return kept, rejected, epochs
