"""AdaptiveFL client: prune each received submodel to this request's capacity (Sec. 3.2), train it, send it back."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.models import get_state, set_state
from hetfl.common.nodeconfig import NodeProfile
from hetfl.common.task import local_train, pack_models, unpack_models
from hetfl.common.hosting import message_client
from hetfl.common.rundata import client_data, model_input_shape

from .core import SubmodelPool, request_capacity, slice_state
from .keys import CAPACITY, TIERS, AdaptiveFLParams
from .scalefl import scalefl_loss
from .task import device_capacity, pool_of, remember_speed


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


Fit = Callable[[torch.nn.Module, ConfigRecord, int], Mapping[str, float]]
"""``fit(model, config, job) -> metrics``: train the submodel `model` (already holding its slice of the global model)
in place with the message's `config`; `job` numbers the message's jobs; the metrics with ``train_loss``."""


def adaptivefl_train(msg: Message, pool: SubmodelPool, fit: Fit, num_examples: int,
                     capacity: float | Callable[[int], float] | None = None) -> Message:
    """An AdaptiveFL client's reply (Alg. 1 LocalTrain): each received submodel pruned to this device's resources
    (the largest pool member inside it whose size fits; Sec. 3.2, docs/readings.md#adaptivefl-pruning), trained by
    `fit`, sent back with its pool index (-1 where nothing fits). The message contract is docs/api.md#adaptivefl.

    Parameters
    ----------
    msg : Message
        A ``train.adaptivefl`` message: ``arrays`` (the jobs' submodels packed, ``m<j>.<name>``), ``config`` with
        ``pool-index`` (per job), ``slot``, ``prune`` and ``server-round``.
    pool : SubmodelPool
        The server's pool (the same model and widths).
    fit : callable
        :data:`Fit`: trains one submodel.
    num_examples : int
        This client's training examples (its aggregation weight).
    capacity : float or callable, optional
        The parameters this device can train (a number, or a function of the job: a capacity drawn per request);
        None, or a message whose ``prune`` is false (the baselines): no pruning.

    Returns
    -------
    Message
        ``arrays`` (the trained submodels packed) and ``metrics``: ``num-examples``, ``pool-index`` (per job, -1 =
        nothing fit), every other metric of `fit` summed, ``train_loss`` (the trained jobs' mean).
    """
    conf = msg.content["config"]
    sent = [int(m) for m in conf["pool-index"]]
    received = unpack_models(msg.content["arrays"], len(sent))
    prune = bool(conf["prune"]) and capacity is not None
    backs, states, losses, sums = [], [], [], {}
    for j, m in enumerate(sent):
        back = pool.fit(m, capacity(j) if callable(capacity) else capacity) if prune else m
        if back is None:  # not even the smallest contained model fits this request
            backs.append(-1)
            states.append({})
            continue
        model = pool.build(back)
        set_state(model, slice_state(received[j], pool.shapes(back)))
        metrics = fit(model, conf, j)
        backs.append(back)
        states.append(get_state(model))
        losses.append(float(metrics["train_loss"]))
        for k, v in metrics.items():
            if k != "train_loss":
                sums[k] = sums.get(k, 0) + v
    metrics = MetricRecord({"num-examples": num_examples, "pool-index": backs, **sums,
                            "train_loss": sum(losses) / len(losses) if losses else math.nan})
    return Message(RecordDict({"arrays": pack_models(states), "metrics": metrics}), reply_to=msg)


def train(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """hetfl's AdaptiveFL handler: :func:`adaptivefl_train` with the run's pool, data, local SGD and the device's
    capacity per request (node config, else its simulated tier's)."""
    p = AdaptiveFLParams.from_config(cfg)
    rnd = int(msg.content["config"]["server-round"])
    pid = message_client(msg, context, cfg)
    data = client_data(context, cfg, pid)
    capacity = device_capacity(context, cfg, pid)[1] if bool(msg.content["config"]["prune"]) else None
    loss_fn = None
    if p.variant.pool == "scalefl":  # early exits; distillation after the first 25% of the rounds
        loss_fn = scalefl_loss(p.scalefl_kd if rnd - 1 > 0.25 * cfg["num-server-rounds"] else 0.0)

    work = [0.0, 0.0]  # this round's FLOPs and seconds (a measured device's next capacity)

    def fit(model: torch.nn.Module, conf: ConfigRecord, j: int) -> dict[str, float]:
        res = local_train(model, data, cfg, rnd, seed_offset=pid + 7919 * j, loss_fn=loss_fn)
        work[0], work[1] = work[0] + res.flops, work[1] + res.seconds
        return {"train_s": res.seconds, "train_flops": res.flops, "train_loss": res.loss}

    per_request = None if capacity is None else (lambda j: request_capacity(capacity, cfg["seed"], rnd, pid, j))
    reply = adaptivefl_train(msg, pool_of(cfg), fit, len(data), per_request)
    if cfg["measure-devices"] and p.round_budget_s > 0 and capacity is not None:
        reply.content["metrics"]["capacity"] = float(capacity.loc)  # this round's (a measured device's is fixed)
        remember_speed(context, *work)  # the next round's capacity follows this round's speed
    return reply
