"""Client side of FedAvg / FedProx / FedAdam / FedBE / FedNova (local training of the received model on the client's
partition), and of Scaffold and FedAvg-STC, whose messages carry more than the model."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.comm import put_sparse
from hetfl.data.arrays import ArrayData
from hetfl.common.compression import StateLayout
from hetfl.common.models import get_state
from hetfl.common.task import local_train, model_to_arrays, received_model, round_lr
from hetfl.common.hosting import message_client, state_key
from hetfl.common.rundata import client_data

from .params import STCParams
from .core import (
    CI_ROUND_STATE,
    CI_STATE,
    CONTROL,
    CONTROL_OWN,
    SCAFFOLD,
    STC_PREFIX,
    STC_RESIDUAL,
    STC_UPDATE,
    apply_delta,
    scaffold_control_delta,
    scaffold_correction,
    stc_decode,
    stc_encode,
)


def _received(msg: Message, context: Context, cfg: dict[str, Any]) -> tuple[int, torch.nn.Module, int, ArrayData]:
    """(round, the received global model, client id, its data) of a train message."""
    client = message_client(msg, context, cfg)
    return (int(msg.content["config"]["server-round"]), received_model(cfg, msg.content["arrays"]), client,
            client_data(context, cfg, client))


def train(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """Train the global model locally; FedProx's mu arrives in the message config as Flower's `proximal-mu`."""
    rnd, model, client, data = _received(msg, context, cfg)
    mu = float(msg.content["config"].get("proximal-mu", 0.0))
    res = local_train(model, data, cfg, rnd, proximal_mu=mu, seed_offset=client)
    metrics = MetricRecord({"train_loss": res.loss, "num-examples": res.num_examples, "train_s": res.seconds,
                            "steps": res.steps, "train_flops": res.flops, "proximal_mu": mu})
    return Message(RecordDict({"arrays": model_to_arrays(model), "metrics": metrics}), reply_to=msg)


# --- FENS's iterative baselines (docs/readings.md#fens-iterative) --------------------------------------------


@contextlib.contextmanager
def gradient_correction(model: torch.nn.Module, correction: dict[str, np.ndarray]) -> Iterator[None]:
    """While open, every backward pass adds ``correction[name]`` to the gradient of parameter ``name``
    (Scaffold: g - c_i + c). The hooks are removed on exit (the process reuses the model for later messages)."""
    params = dict(model.named_parameters())
    handles = []
    for name, value in correction.items():
        t = torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32))
        on: dict = {}  # the correction on the gradient's device, copied there once (training moves the model)

        def hook(g: torch.Tensor, t: torch.Tensor = t, on: dict = on) -> torch.Tensor:
            key = (g.device, g.dtype)
            if key not in on:
                on[key] = t.to(g.device, g.dtype)
            return g + on[key]

        handles.append(params[name].register_hook(hook))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _control_variate(msg: Message, context: Context, client: int, c: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The client's c_i: sent by the server, else zeros (the server has none: round 0), else the node state's,
    which must be of the round the server expects."""
    expected = int(msg.content[SCAFFOLD]["ci-round"])
    if CONTROL_OWN in msg.content:
        own = {k: v.numpy() for k, v in msg.content[CONTROL_OWN].items()}
        if set(own) != set(c):
            raise ValueError(f"'{CONTROL_OWN}' names {sorted(own)[:3]}..., expected the parameters {sorted(c)[:3]}...")
        return own
    if expected == 0:
        return {k: np.zeros_like(v, dtype=np.float32) for k, v in c.items()}
    rec, ver = context.state.get(state_key(client, CI_STATE)), context.state.get(state_key(client, CI_ROUND_STATE))
    have = int(ver["round"]) if ver is not None else None
    if rec is None or have != expected:
        raise ValueError(f"client {client}: the node state holds the control variate of round {have}, the server's is "
                         f"of round {expected} (node restarted?); the server sends it with the next message")
    return {k: v.numpy() for k, v in rec.items()}


def train_scaffold(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """Scaffold's client (option II): local SGD on g - c_i + c, then Delta c_i = (x - y) / (K lr) - c; the new
    c_i = c_i + Delta c_i stays in the node state (per client), the reply carries y and Delta c_i."""
    rnd, model, client, data = _received(msg, context, cfg)
    arrays = msg.content["arrays"]
    c = {k: v.numpy() for k, v in msg.content[CONTROL].items()}
    c_i = _control_variate(msg, context, client, c)
    x = {k: arrays[k].numpy() for k in c}
    with gradient_correction(model, scaffold_correction(c, c_i)):
        res = local_train(model, data, cfg, rnd, seed_offset=client)
    y = get_state(model)
    delta = scaffold_control_delta(x, y, c, res.steps, round_lr(cfg, rnd))
    context.state[state_key(client, CI_STATE)] = ArrayRecord({k: Array(v) for k, v in apply_delta(c_i, delta).items()})
    context.state[state_key(client, CI_ROUND_STATE)] = ConfigRecord({"round": rnd})
    metrics = MetricRecord({"train_loss": res.loss, "num-examples": res.num_examples, "train_s": res.seconds,
                            "steps": res.steps, "train_flops": res.flops})
    return Message(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in y.items()}),
                               CONTROL: ArrayRecord({k: Array(v) for k, v in delta.items()}), "metrics": metrics}),
                   reply_to=msg)


def train_stc(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """FedAvg-STC's client: local training, then the update y - x as its top ``stc-density`` entries in 16 bits
    (with ``stc-error-feedback``, what was not sent is added to the next update)."""
    rnd, model, client, data = _received(msg, context, cfg)
    arrays = msg.content["arrays"]
    start = {k: v.numpy() for k, v in arrays.items()}
    layout = StateLayout.of(start)
    res = local_train(model, data, cfg, rnd, seed_offset=client)
    delta = layout.flatten(get_state(model)) - layout.flatten(start)
    p = STCParams.from_config(cfg)
    feedback = p.error_feedback and p.density < 1.0
    if feedback:
        rest = context.state.get(state_key(client, STC_RESIDUAL))
        if rest is not None and rest["r"].numpy().shape == delta.shape:
            delta = delta + rest["r"].numpy()
    enc = stc_encode(delta, p.density, layout.segments if p.topk_scope == "tensor" else None)
    if feedback:
        context.state[state_key(client, STC_RESIDUAL)] = ArrayRecord({"r": Array(delta - stc_decode(enc))})
    out = ArrayRecord()
    put_sparse(out, STC_PREFIX, enc)
    metrics = MetricRecord({"train_loss": res.loss, "num-examples": res.num_examples, "train_s": res.seconds,
                            "steps": res.steps, "train_flops": res.flops})
    return Message(RecordDict({STC_UPDATE: out, "metrics": metrics}), reply_to=msg)
