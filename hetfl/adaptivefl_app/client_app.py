"""AdaptiveFL client: prune each received submodel to this request's capacity (Sec. 3.2), train it, send it back."""

from __future__ import annotations

import math
from typing import Any

from flwr.app import Context, Message, MetricRecord, RecordDict

from hetfl.common.models import get_state, set_state
from hetfl.common.nodeconfig import NodeProfile
from hetfl.common.task import local_train, pack_models, unpack_models
from hetfl.common.hosting import message_client
from hetfl.common.rundata import client_data, model_input_shape

from .core import request_capacity, slice_state
from .keys import CAPACITY, TIERS, AdaptiveFLParams
from .scalefl import scalefl_loss
from .task import device_capacity, pool_of


def node_info(context: Context, cfg: dict[str, Any], client: int) -> dict[str, Any]:
    """What an AdaptiveFL node reports for a client when discovered: its device tier, only to the baselines that know
    tiers (HeteroFL, ScaleFL, Decoupled; AdaptiveFL's server learns capacities only from the models that come back)."""
    tier = device_capacity(context, cfg, client)[0]  # a device that must declare its capacity and does not: fails here
    out = {"tier": tier} if AdaptiveFLParams.from_config(cfg).variant.knows_tiers else {}
    out.update(capacity_warning(context, cfg, client))
    return out


def capacity_warning(context: Context, cfg: dict[str, Any], client: int) -> dict[str, str]:
    """A node that declares a number of parameters (node config ``capacity``) too small for the smallest submodel of
    the run's pool reports it at discovery (``capacity-warning``; "" when it fits), so that the server names the
    client and both sizes instead of leaving its slot empty every round without a word. Only nodes that declare a
    number carry the field; AdaptiveFL's server uses it for the warning alone, never to plan."""
    value = NodeProfile(context.node_config).device(CAPACITY)
    if value is None or str(value) in TIERS:
        return {}
    pool, gamma = pool_of(cfg), float(value)
    smallest = min(pool.entries, key=lambda e: e.size)
    if gamma >= smallest.size:
        return {"capacity-warning": ""}
    return {"capacity-warning": f"client {client}: node config capacity = {gamma:,.0f} parameters is below the smallest "
                                f"submodel ({smallest.name}, {smallest.size:,} parameters of model {cfg['model']!r} for "
                                f"inputs {tuple(model_input_shape(cfg))}): it can never train; declare at least "
                                f"{smallest.size:,} or a tier (weak, medium, strong)"}


def train(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """Alg. 1 LocalTrain for every job of the message: fit the received pool member to this request's capacity
    (largest contained member that fits; docs/readings.md#adaptivefl-pruning), train, reply with pool index -1
    where nothing fits."""
    p = AdaptiveFLParams.from_config(cfg)
    conf = msg.content["config"]
    rnd, sent = int(conf["server-round"]), [int(m) for m in conf["pool-index"]]
    pool = pool_of(cfg)
    pid = message_client(msg, context, cfg)
    data = client_data(context, cfg, pid)
    received = unpack_models(msg.content["arrays"], len(sent))
    capacity = device_capacity(context, cfg, pid)[1] if bool(conf["prune"]) else None
    loss_fn = None
    if p.variant.pool == "scalefl":  # early exits; distillation after the first 25% of the rounds
        loss_fn = scalefl_loss(p.scalefl_kd if rnd - 1 > 0.25 * cfg["num-server-rounds"] else 0.0)
    backs, states, losses, seconds, flops = [], [], [], 0.0, 0
    for j, m in enumerate(sent):
        back = m if capacity is None else pool.fit(m, request_capacity(capacity, cfg["seed"], rnd, pid, j))
        if back is None:  # not even the smallest contained model fits this request
            backs.append(-1)
            states.append({})
            continue
        model = pool.build(back)
        set_state(model, slice_state(received[j], pool.shapes(back)))
        res = local_train(model, data, cfg, rnd, seed_offset=pid + 7919 * j, loss_fn=loss_fn)
        backs.append(back)
        states.append(get_state(model))
        losses.append(res.loss)
        seconds += res.seconds
        flops += res.flops
    metrics = MetricRecord({"num-examples": len(data), "pool-index": backs, "train_s": seconds, "train_flops": flops,
                            "train_loss": sum(losses) / len(losses) if losses else math.nan})
    return Message(RecordDict({"arrays": pack_models(states), "metrics": metrics}), reply_to=msg)
