"""FENS client: phase 1 local training (once), caching the ensemble's logits, phase 2 aggregator steps."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.compression import quantize_state
from hetfl.data.arrays import ArrayData
from hetfl.common.oneshot.client import OWN, train_and_upload
from hetfl.common.oneshot.ensemble import build_members, cached_logits, split_indices, states_digest, subset
from hetfl.common.task import (arrays_to_model, client_device, compute_options, inference_flops,
                               model_to_arrays, unpack_models)
from hetfl.common.hosting import message_client, state_key
from hetfl.common.rundata import client_data, dataset_info, num_classes
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


def logits(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """Receive the (INT8) ensemble, compute its logits on the 10% split once and cache them in the node state.

    Replies with the confusion counts of this client's own member on the 10% split (for voting).
    """
    pid = message_client(msg, context, cfg)
    conf = msg.content["config"]
    M, own = int(conf["num-models"]), int(conf["own-index"])
    states = unpack_models(msg.content["ensemble"], M)
    if own >= 0 and not states[own]:  # not sent (fens-exclude-own): use the local copy, quantized like the others
        st = {k: v.numpy() for k, v in context.state[state_key(pid, OWN)].items()}
        states[own] = quantize_state(st) if bool(conf["quantized"]) else st
    models = build_members(cfg, states, bool(conf["quantized"]))
    _, agg_data = _splits(context, cfg, pid)
    z = cached_logits(models, states_digest(states), agg_data, Normalizer(dataset_info(cfg)), cfg["cache-dir"],
                      **compute_options(cfg)).x  # once per ensemble and split (a study's trials reuse them)
    context.state[state_key(pid, CACHE)] = ArrayRecord({"z": Array(z), "y": Array(agg_data.y)})
    C = num_classes(cfg)
    counts = confusion_counts(z[:, own], agg_data.y, C) if own >= 0 else np.zeros((C, C), np.int64)
    return Message(RecordDict({"metrics": MetricRecord({"num-examples": len(agg_data), "own-index": own,
                                                         "infer_flops": sum(inference_flops(m, cfg, len(agg_data)) for m in models)}),
                               "confusion": ArrayRecord({"counts": Array(counts)})}), reply_to=msg)


def train_aggregator(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """Phase 2 (one FedAdam round): a few SGD steps of the aggregator on the cached logits."""
    p = FENSParams.from_config(cfg)
    pid = message_client(msg, context, cfg)
    cache = context.state[state_key(pid, CACHE)]
    data = ArrayData(cache["z"].numpy(), cache["y"].numpy())
    _, M, C = data.x.shape
    agg = arrays_to_model(make_aggregator(p.aggregator, M, C, p.aggregator_hidden), msg.content["arrays"])
    rnd = int(msg.content["config"]["server-round"])
    res = train(agg, data, torch.as_tensor, steps=p.agg_local_steps, batch_size=p.agg_batch_size,
                lr=p.agg_client_lr, seed=cfg["seed"] * 7919 + rnd * 31 + pid,
                device=client_device(cfg))  # the aggregator stays fp32 (docs/training.md)
    # the authors weight a client by the samples it saw this round: min(n_i, batch x steps) (docs/readings.md#fens-phase2)
    seen = len(data) if p.adam.update == "flower" else min(len(data), p.agg_batch_size * p.agg_local_steps)
    metrics = MetricRecord({"num-examples": seen, "train_loss": res.loss, "train_flops": res.flops})
    return Message(RecordDict({"arrays": model_to_arrays(agg), "metrics": metrics}), reply_to=msg)
