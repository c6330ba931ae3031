"""SHEFL client: train each assigned model from its global weights, send top-k sparse deltas."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.comm import encode_sparse, put_sparse
from hetfl.common.compression import StateLayout, topk_sparsify
from hetfl.common.models import get_state
from hetfl.common.nodeconfig import NodeProfile
from hetfl.common.task import local_train, received_model
from hetfl.common.hosting import device_value, message_client, num_clients, state_key
from hetfl.common.rundata import client_data

from .core import hpc_partitions
from .keys import DEVICE_CLASS, SHEFLParams


def device_class(context: Context, cfg: dict[str, Any], client: int) -> str:
    """'hpc' | 'lpc': the node config's device-class (a real device declares it), else its fleet tier's, else drawn
    from the client id and shefl-hpc-fraction (simulation). docs/deployment.md#device-profile"""
    value = device_value(context, cfg, client, DEVICE_CLASS)
    if value is not None:
        return str(value)
    if NodeProfile(context.node_config).own_data:
        raise ValueError("node config lacks 'device-class': a SuperNode with data of its own declares its device, "
                         "device-class=\"hpc\" or \"lpc\" (docs/deployment.md)")
    return "hpc" if client in hpc_partitions(num_clients(context, cfg), cfg["shefl-hpc-fraction"], cfg["seed"]) else "lpc"


def node_info(context: Context, cfg: dict[str, Any], client: int) -> dict[str, Any]:
    """What a SHEFL node reports for a client when discovered: its device class."""
    return {"device-class": device_class(context, cfg, client)}


def _residual(context: Context, client: int, m: int, size: int) -> np.ndarray:
    rec = context.state.get(state_key(client, f"shefl-residual-{m}"))
    return rec["r"].numpy() if rec is not None else np.zeros(size, np.float32)


def train(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """Alg. 1 lines 11-24: LocalTrain each assigned model, delta = w_local - w_global, TopK(delta, k)."""
    conf = msg.content["config"]
    rnd, role, density = int(conf["server-round"]), str(conf["role"]), float(conf["density"])
    models = [int(m) for m in conf["models"]]
    params = SHEFLParams.from_config(cfg)
    pid = message_client(msg, context, cfg)
    data = client_data(context, cfg, pid)
    steps, epochs = params.role_work("hpc" if role == "hpc" else "lpc")
    out, losses, secs, flops = ArrayRecord(), [], 0.0, 0
    for m in models:
        arrays = msg.content[f"model.{m}"]
        model = received_model(cfg, arrays)
        start = {k: v.numpy() for k, v in arrays.items()}
        layout = StateLayout.of(start)
        res = local_train(model, data, cfg, rnd, steps=steps, epochs=epochs, seed_offset=pid * 64 + m)
        delta = layout.flatten(get_state(model)) - layout.flatten(start)
        segments = layout.segments if params.topk_scope == "tensor" else None
        if params.error_feedback and density < 1.0:
            delta = delta + _residual(context, pid, m, layout.size)
        idx, val = topk_sparsify(delta, density, segments)
        if params.error_feedback and density < 1.0:
            rest = delta.copy()
            rest[idx] = 0.0
            context.state[state_key(pid, f"shefl-residual-{m}")] = ArrayRecord({"r": Array(rest)})
        put_sparse(out, f"m{m}", encode_sparse(idx, val, layout.size))
        losses.append(res.loss)
        secs += res.seconds
        flops += res.flops
    metrics = MetricRecord({"train_loss": float(np.mean(losses)), "num-examples": len(data), "train_s": secs, "train_flops": flops,
                            "models": len(models)})
    return Message(RecordDict({"deltas": out, "metrics": metrics}), reply_to=msg)
