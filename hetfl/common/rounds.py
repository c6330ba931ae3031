"""The one federated round loop: train, aggregate, evaluate, checkpoint - and resume from a checkpoint.

Flower's ``Strategy.start`` always begins at round 1 and keeps nothing on disk. Every method
here runs its Strategy (Flower's FedAvg/FedProx/FedAdam or SHEFL/AdaptiveFL/FENS's own)
through :func:`run_rounds`, which after each round writes ``<run-dir>/checkpoint.pkl``:
the global arrays, the strategy's state (``state_dict()`` where the strategy has one: SHEFL's
sampling RNG, AdaptiveFL's RL tables and RNG, FedAdam's moments), Python/NumPy RNG states,
the round number and the results recorder's history. With ``resume = true`` a run whose
``run-name`` has a checkpoint continues from the round after it, so an interrupted run ends
in the same state as an uninterrupted one (same seed).
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
from flwr.serverapp.strategy import Strategy

from .results import RunRecorder

log = logging.getLogger("hetfl")
CHECKPOINT = "checkpoint.pkl"


def _arrays_to_numpy(arrays: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in arrays.items()}


def _numpy_to_arrays(state: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(v)) for k, v in state.items()})


def save_checkpoint(path: Path, server_round: int, arrays: ArrayRecord, strategy: Strategy, recorder: RunRecorder) -> None:
    """Atomically write everything needed to continue after `server_round`."""
    state = {
        "round": server_round,
        "arrays": _arrays_to_numpy(arrays),
        "strategy": strategy.state_dict() if hasattr(strategy, "state_dict") else None,
        "python_random": random.getstate(),
        "numpy_random": np.random.get_state(),
        "recorder": recorder.state_dict(),
    }
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (a file this project wrote: pickle)."""
    with open(path, "rb") as f:
        return pickle.load(f)


def _reply_key(reply) -> tuple:
    """A run-independent order of replies (node ids are random per run; arrival order is timing)."""
    import hashlib

    if reply.has_error():
        return (1, b"")
    h = hashlib.sha1()
    for name, rec in sorted(reply.content.items()):
        h.update(name.encode())
        if isinstance(rec, ArrayRecord):
            for k, arr in sorted(rec.items()):
                h.update(k.encode())
                h.update(arr.numpy().tobytes()[:4096])
        else:
            h.update(repr(sorted(rec.items())).encode())
    return (0, h.digest())


def canonical_order(replies: list) -> list:
    """Replies sorted by content, so float sums in aggregation do not depend on arrival order."""
    return sorted(replies, key=_reply_key)


def check_dense_reply(reply, reference: ArrayRecord) -> None:
    """A FedAvg-style reply must carry every global array with its shape, finite; ValueError otherwise."""
    recs = [v for v in reply.content.values() if isinstance(v, ArrayRecord)]
    if len(recs) != 1:
        raise ValueError(f"expected one ArrayRecord, got {len(recs)}")
    got = recs[0]
    if set(got.keys()) != set(reference.keys()):
        raise ValueError(f"array keys differ from the global model's (e.g. {sorted(set(got.keys()) ^ set(reference.keys()))[:3]})")
    for k, ref in reference.items():
        a = got[k].numpy()
        if tuple(a.shape) != tuple(ref.shape):
            raise ValueError(f"'{k}' has shape {tuple(a.shape)}, expected {tuple(ref.shape)}")
        if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a)):
            raise ValueError(f"'{k}' has NaN/inf")


def drop_malformed(replies: list, reference: ArrayRecord, server_round: int) -> tuple[list, int]:
    """Replies that pass :func:`check_dense_reply` (error replies are kept: the strategy counts them)."""
    kept, rejected = [], 0
    for r in replies:
        if not r.has_error():
            try:
                check_dense_reply(r, reference)
            except (ValueError, KeyError, TypeError) as err:
                rejected += 1
                log.warning("round %d: rejected update from node %d: %s", server_round, r.metadata.src_node_id, err)
                continue
        kept.append(r)
    return kept, rejected


def run_rounds(grid, strategy: Strategy, initial_arrays: ArrayRecord, cfg: dict[str, Any], recorder: RunRecorder,
               evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None]) -> ArrayRecord:
    """Rounds 1..num-server-rounds (or from a checkpoint) with centralized evaluation and checkpoints.

    ``stop-after-round`` ends the loop early (the checkpoint of that round stays): how a scheduler
    with a time budget, or the resume test, interrupts a run cleanly.
    """
    path = recorder.run_dir / CHECKPOINT
    arrays, start = initial_arrays, 1
    if cfg["resume"] and path.exists():
        ck = load_checkpoint(path)
        arrays, start = _numpy_to_arrays(ck["arrays"]), ck["round"] + 1
        if ck["strategy"] is not None:
            strategy.load_state_dict(ck["strategy"])
        random.setstate(ck["python_random"])
        np.random.set_state(ck["numpy_random"])
        recorder.load_state_dict(ck["recorder"])
        log.info("resumed from %s after round %d", path, ck["round"])
    elif cfg["resume"]:
        log.warning("resume = true but %s does not exist: starting at round 1", path)
    if hasattr(strategy, "summary"):
        strategy.summary()
    if start == 1:
        evaluate_fn(0, arrays)
    last = cfg["num-server-rounds"]
    if cfg["stop-after-round"]:
        last = min(last, cfg["stop-after-round"])
    for rnd in range(start, last + 1):
        t0 = time.perf_counter()
        messages = list(strategy.configure_train(rnd, arrays, ConfigRecord(), grid))
        replies = canonical_order(list(grid.send_and_receive(messages, timeout=cfg["round-timeout"])))
        errors = sum(r.has_error() for r in replies)
        if len(replies) < len(messages) or errors:
            log.warning("round %d: %d of %d nodes replied, %d with errors; aggregating what arrived",
                        rnd, len(replies), len(messages), errors)
        if not getattr(strategy, "checks_replies", False):  # Flower's FedAvg/FedProx/FedAdam apply anything
            replies, rejected = drop_malformed(replies, arrays, rnd)
            strategy.rejected = rejected
        new, _ = strategy.aggregate_train(rnd, replies)
        if new is not None:
            arrays = new
        log.info("round %d trained in %.2fs", rnd, time.perf_counter() - t0)
        evaluate_fn(rnd, arrays)
        if cfg["checkpoint"]:
            save_checkpoint(path, rnd, arrays, strategy, recorder)
    return arrays
