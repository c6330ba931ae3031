"""SHEFL client: train each assigned model from its global weights, send top-k sparse deltas."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.comm import encode_sparse, put_sparse
from hetfl.common.compression import StateLayout, topk_sparsify
from hetfl.common.models import get_state
from hetfl.common.nodeconfig import NodeProfile
from hetfl.common.task import local_train, received_model
from hetfl.common.hosting import device_value, message_client, num_clients, state_key
from hetfl.common.rundata import client_data

from .core import hpc_partitions
from .keys import DEVICE_CLASS, SHEFLParams


def device_class(context: Context, cfg: dict[str, Any], client: int) -> str | None:
    """'hpc' | 'lpc': the node config's device-class (a real device declares it), else its fleet tier's, else with
    measure-devices None (the server ranks the measured speeds), else drawn from the client id and
    shefl-hpc-fraction (simulation). docs/deployment.md#device-profile"""
    value = device_value(context, cfg, client, DEVICE_CLASS)
    if value is not None:
        return str(value)
    if cfg["measure-devices"]:
        return None
    if NodeProfile(context.node_config).own_data:
        raise ValueError("node config lacks 'device-class': a SuperNode with data of its own declares its device, "
                         "device-class=\"hpc\" or \"lpc\" (docs/deployment.md)")
    return "hpc" if client in hpc_partitions(num_clients(context, cfg), cfg["shefl-hpc-fraction"], cfg["seed"]) else "lpc"


def node_info(context: Context, cfg: dict[str, Any], client: int) -> dict[str, Any]:
    """What a SHEFL node reports for a client when discovered: its device class (none where it measured itself and
    declares none)."""
    dc = device_class(context, cfg, client)
    return {} if dc is None else {"device-class": dc}


Fit = Callable[[int, ArrayRecord, ConfigRecord], tuple[Mapping[str, Any], Mapping[str, float]]]
"""``fit(member, arrays, config) -> (trained state, metrics)``: train member `member` from its global `arrays` with the
message's `config` (``role``, ``server-round``, the strategy's train_config); the state as NumPy arrays or tensors
under the arrays' keys, the metrics with ``train_loss`` and ``num-examples``."""


def shefl_train(msg: Message, fit: Fit, *, topk_scope: str = "global", residuals: RecordDict | None = None,
                residual_key: Callable[[int], str] = lambda m: f"shefl-residual-{m}") -> Message:
    """A SHEFL client's reply (Alg. 1 lines 11-24): each member the message carries trained by `fit`, its delta
    w_local - w_global top-k sparsified at the message's density; the message contract is docs/api.md#shefl.

    Parameters
    ----------
    msg : Message
        A ``train.shefl`` message: ``model.<j>`` (ArrayRecord) per member to train, ``config`` with ``models``,
        ``role``, ``density`` and ``server-round``.
    fit : callable
        :data:`Fit`: trains one member.
    topk_scope : str
        ``"global"``: top-k over the whole flattened model, ``"tensor"``: per tensor (:func:`~hetfl.common.compression.topk_sparsify`).
    residuals : RecordDict, optional
        Where error feedback keeps each member's top-k residual between rounds (the ClientApp's ``context.state``);
        None: no error feedback.
    residual_key : callable
        Member -> the record name of its residual in `residuals` (a node hosting several clients keys them apart).

    Returns
    -------
    Message
        The reply: ``deltas`` (ArrayRecord, ``m<j>.val``/``.pos``/``.hdr`` per member: the sparse delta) and
        ``metrics`` (``train_loss``: the members' mean, ``num-examples``, ``models``, and every other metric of
        `fit` summed over the members).
    """
    conf = msg.content["config"]
    density = float(conf["density"])
    feedback = residuals is not None and density < 1.0
    out, losses, sums, examples = ArrayRecord(), [], {}, 0
    models = [int(m) for m in conf["models"]]
    for m in models:
        arrays = msg.content[f"model.{m}"]
        start = {k: v.numpy() for k, v in arrays.items()}
        layout = StateLayout.of(start)
        state, metrics = fit(m, arrays, conf)
        trained = {k: v.detach().cpu().numpy() if hasattr(v, "detach") else np.asarray(v) for k, v in state.items()}
        delta = layout.flatten(trained) - layout.flatten(start)
        if feedback:
            rec = residuals.get(residual_key(m))
            delta = delta + (rec["r"].numpy() if rec is not None else np.zeros(layout.size, np.float32))
        idx, val = topk_sparsify(delta, density, layout.segments if topk_scope == "tensor" else None)
        if feedback:
            rest = delta.copy()
            rest[idx] = 0.0
            residuals[residual_key(m)] = ArrayRecord({"r": Array(rest)})
        put_sparse(out, f"m{m}", encode_sparse(idx, val, layout.size))
        losses.append(float(metrics["train_loss"]))
        examples = metrics["num-examples"]
        for k, v in metrics.items():
            if k not in ("train_loss", "num-examples"):
                sums[k] = sums.get(k, 0) + v
    metrics = MetricRecord({"train_loss": float(np.mean(losses)), "num-examples": examples, **sums, "models": len(models)})
    return Message(RecordDict({"deltas": out, "metrics": metrics}), reply_to=msg)


def train(msg: Message, context: Context, cfg: dict[str, Any]) -> Message:
    """hetfl's SHEFL handler: :func:`shefl_train` with the run's model, data and local SGD (the role's local work)."""
    rnd, role = int(msg.content["config"]["server-round"]), str(msg.content["config"]["role"])
    params = SHEFLParams.from_config(cfg)
    pid = message_client(msg, context, cfg)
    data = client_data(context, cfg, pid)
    steps, epochs = params.role_work("hpc" if role == "hpc" else "lpc")

    def fit(m: int, arrays: ArrayRecord, conf: ConfigRecord) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        model = received_model(cfg, arrays)
        res = local_train(model, data, cfg, rnd, steps=steps, epochs=epochs, seed_offset=pid * 64 + m)
        return get_state(model), {"train_loss": res.loss, "num-examples": len(data), "train_s": res.seconds,
                                  "train_flops": res.flops}

    return shefl_train(msg, fit, topk_scope=params.topk_scope,
                       residuals=context.state if params.error_feedback else None,
                       residual_key=lambda m: state_key(pid, f"shefl-residual-{m}"))
