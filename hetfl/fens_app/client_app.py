"""FENS client: phase 1 local training (once), caching the ensemble's logits, phase 2 aggregator steps."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.compression import dequantize_state, quantize_state
from hetfl.data.arrays import ArrayData
from hetfl.common.oneshot.client import OWN, phase1_reply, train_and_upload
from hetfl.common.oneshot.ensemble import build_members, cached_logits, split_indices, states_digest, subset
from hetfl.common.task import (arrays_to_model, client_device, compute_options, inference_flops,
                               model_to_arrays, unpack_models)
from hetfl.common.hosting import message_client, state_key
from hetfl.common.rundata import client_data, dataset_info
from hetfl.common.train import Normalizer, train

from .aggregators import confusion_counts, make_aggregator
from .keys import FENSParams

CACHE = "fens-logits"


def _splits(context: Context, cfg: dict, pid: int) -> tuple[ArrayData, ArrayData]:
    data = client_data(context, cfg, pid)
    local_idx, agg_idx = split_indices(len(data), FENSParams.from_config(cfg).local_fraction, cfg["seed"] * 100_003 + pid)
    return subset(data, local_idx), subset(data, agg_idx)


def local(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """Phase 1: train the local model to completion on the 90% split; upload it once with label counts."""
    pid = message_client(msg, context, cfg)
    p = FENSParams.from_config(cfg)
    return train_and_upload(msg, context, cfg, pid, _splits(context, cfg, pid)[0], p.member_val_fraction,
                            p.member_patience)


def fens_local_train(msg: Message, fit: Callable[[ArrayRecord | None, ConfigRecord], tuple[Mapping[str, Any],
                                                                                         Mapping[str, Any]]]) -> Message:
    """A FENS client's phase-1 reply (Sec. 3.1): its model trained once by `fit` on its local split, uploaded with
    its label counts (:func:`~hetfl.common.oneshot.client.phase1_reply`). The message contract is docs/api.md#fens.

    Parameters
    ----------
    msg : Message
        A ``train.fens_local`` message: ``arrays`` (the initial model; absent with ``diff_init``: start from an own
        random one) and ``config`` (``start``'s ``train_config`` and ``server-round`` 0).
    fit : callable
        ``fit(arrays or None, config) -> (trained state, metrics)``; the metrics with ``num-examples`` and
        ``label_counts`` (one count per class of the rows it trained on).
    """
    return phase1_reply(msg, fit)


def fens_logits(msg: Message, logits_of: Callable[[list[dict[str, np.ndarray]]], np.ndarray], labels: np.ndarray,
                state: RecordDict, *, own_state: Mapping[str, np.ndarray] | None = None, dequantize: bool = True,
                metrics: Mapping[str, Any] | None = None, key: str = CACHE) -> Message:
    """A FENS client's answer to the ensemble download (Sec. 3.2): the ensemble's logits on its aggregator split,
    cached in `state` for the aggregator's rounds, and the confusion counts of its own member there (for voting).

    Parameters
    ----------
    msg : Message
        A ``train.fens_logits`` message: ``ensemble`` (the M members packed, ``m<j>.<name>``, INT8 with
        ``quantized``) and ``config`` (``num-models``, ``own-index``: this client's member or -1, ``quantized``).
    logits_of : callable
        The members' states (dequantized unless `dequantize` is false) -> their logits on the aggregator split, an
        (N, M, C) array.
    labels : ndarray
        The split's N labels.
    state : RecordDict
        Where the logits are cached (the ClientApp's ``context.state``), under `key`.
    own_state : mapping, optional
        This client's own member, where the server left it out (``fens-exclude-own``).
    metrics : mapping, optional
        Added to the reply's metrics (read after `logits_of` ran).
    """
    conf = msg.content["config"]
    M, own, quantized = int(conf["num-models"]), int(conf["own-index"]), bool(conf["quantized"])
    states = unpack_models(msg.content["ensemble"], M)
    if own >= 0 and not states[own]:  # not sent (fens-exclude-own): the local copy, quantized like the others
        if own_state is None:
            raise ValueError("fens_logits: the ensemble left out this client's own member; pass own_state=")
        st = {k: np.asarray(v) for k, v in own_state.items()}
        states[own] = quantize_state(st) if quantized else st
    z = np.asarray(logits_of([dequantize_state(s) for s in states] if quantized and dequantize else states), np.float32)
    y = np.asarray(labels)
    if z.ndim != 3 or z.shape[:2] != (len(y), M):
        raise ValueError(f"fens_logits: logits of shape {z.shape}; expected ({len(y)}, {M}, classes)")
    state[key] = ArrayRecord({"z": Array(z), "y": Array(y)})
    C = z.shape[2]
    counts = confusion_counts(z[:, own], y, C) if own >= 0 else np.zeros((C, C), np.int64)
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(y), "own-index": own, **dict(metrics or {})}),
                               "confusion": ArrayRecord({"counts": Array(counts)})}), reply_to=msg)


def fens_aggregator_train(msg: Message, aggregator: torch.nn.Module | str, state: RecordDict, *, seed: int,
                          steps: int | None = None, batch_size: int | None = None, lr: float | None = None,
                          weight_seen: bool = True, device: str = "cpu", key: str = CACHE) -> Message:
    """A FENS client's aggregator round (Sec. 3.2, one FedAdam round): `steps` SGD steps of `aggregator` from the
    message's ``arrays`` on the logits :func:`fens_logits` cached in `state`. Weighted by the samples it saw,
    min(n, batch x steps) (the authors'; ``weight_seen``), else by n (docs/readings.md#fens-phase2).

    Parameters
    ----------
    aggregator : nn.Module or str
        The aggregator, or the name of one (:func:`~hetfl.fens_app.aggregators.make_aggregator`, for the M members
        and C classes of the cached logits; the server's ``aggregator``).
    steps, batch_size, lr : int, int, float, optional
        Local SGD; defaults: :class:`~hetfl.fens_app.keys.FENSParams`' (``agg_local_steps``, ``agg_batch_size``,
        ``agg_client_lr``).
    """
    defaults = FENSParams()
    steps = defaults.agg_local_steps if steps is None else steps
    batch_size = defaults.agg_batch_size if batch_size is None else batch_size
    lr = defaults.agg_client_lr if lr is None else lr
    if isinstance(aggregator, str):
        _, M, C = state[key]["z"].numpy().shape
        aggregator = make_aggregator(aggregator, M, C)
    cache = state[key]
    data = ArrayData(cache["z"].numpy(), cache["y"].numpy())
    agg = arrays_to_model(aggregator, msg.content["arrays"])
    res = train(agg, data, torch.as_tensor, steps=steps, batch_size=batch_size, lr=lr, seed=seed,
                device=device)  # the aggregator stays fp32 (docs/training.md)
    seen = min(len(data), batch_size * steps) if weight_seen else len(data)
    metrics = MetricRecord({"num-examples": seen, "train_loss": res.loss, "train_flops": res.flops})
    return Message(RecordDict({"arrays": model_to_arrays(agg), "metrics": metrics}), reply_to=msg)


def logits(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """hetfl's handler of the ensemble download: :func:`fens_logits` with the run's models on the 10% split, the
    logits cached by content (once per ensemble and split: a study's trials reuse them)."""
    pid = message_client(msg, context, cfg)
    _, agg_data = _splits(context, cfg, pid)
    extra: dict[str, Any] = {}

    def logits_of(states: list[dict[str, np.ndarray]]) -> np.ndarray:
        quantized = bool(msg.content["config"]["quantized"])
        models = build_members(cfg, states, quantized)
        extra["infer_flops"] = sum(inference_flops(m, cfg, len(agg_data)) for m in models)
        return cached_logits(models, states_digest(states), agg_data, Normalizer(dataset_info(cfg)), cfg["cache-dir"],
                             **compute_options(cfg)).x

    own = context.state.get(state_key(pid, OWN))
    return fens_logits(msg, logits_of, agg_data.y, context.state, dequantize=False, metrics=extra,
                       own_state={k: v.numpy() for k, v in own.items()} if own is not None else None,
                       key=state_key(pid, CACHE))


def train_aggregator(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """hetfl's phase-2 handler: :func:`fens_aggregator_train` with the run's aggregator and its settings."""
    p = FENSParams.from_config(cfg)
    pid = message_client(msg, context, cfg)
    _, M, C = context.state[state_key(pid, CACHE)]["z"].numpy().shape
    rnd = int(msg.content["config"]["server-round"])
    return fens_aggregator_train(msg, make_aggregator(p.aggregator, M, C, p.aggregator_hidden), context.state,
                                 steps=p.agg_local_steps, batch_size=p.agg_batch_size, lr=p.agg_client_lr,
                                 seed=cfg["seed"] * 7919 + rnd * 31 + pid, weight_seen=p.adam.update != "flower",
                                 device=client_device(cfg), key=state_key(pid, CACHE))
