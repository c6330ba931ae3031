"""The one ClientApp: each method registers its message handlers here.

Message types: ``train`` (FedAvg/FedProx local training; FENS aggregator rounds from
Flower's FedAdam), ``train.shefl``/``query.shefl`` (SHEFL, Fed-Ensemble),
``train.fens_local``/``train.fens_logits`` (FENS phases 1-2), ``train.adaptivefl``/
``query.adaptivefl`` (AdaptiveFL and its HeteroFL/All-Large/Decoupled variants).
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from hetfl.adaptivefl_app import client_app as adaptivefl
from hetfl.baselines import client_app as baselines
from hetfl.common.task import config_of
from hetfl.fens_app import client_app as fens
from hetfl.shefl_app import client_app as shefl

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Plain `train` messages from Flower's strategies: FedAvg/FedProx local training, or FENS aggregator steps (FedAdam)."""
    if config_of(context)["method"] == "fens":
        return fens.train_aggregator(msg, context)
    return baselines.train(msg, context)


@app.train("fens_local")
def fens_local(msg: Message, context: Context) -> Message:
    """FENS phase 1: one-shot local training and upload."""
    return fens.local(msg, context)


@app.train("fens_logits")
def fens_logits(msg: Message, context: Context) -> Message:
    """FENS: receive the INT8 ensemble, cache its logits on the aggregator split."""
    return fens.logits(msg, context)


@app.train("shefl")
def shefl_train(msg: Message, context: Context) -> Message:
    """SHEFL: train the assigned ensemble members, reply with top-k sparse deltas."""
    return shefl.train(msg, context)


@app.query("shefl")
def shefl_query(msg: Message, context: Context) -> Message:
    """SHEFL: report this node's device class (hpc | lpc)."""
    return shefl.query(msg, context)


@app.train("adaptivefl")
def adaptivefl_train(msg: Message, context: Context) -> Message:
    """AdaptiveFL: prune the received submodel to this device's capacity, train it, return it."""
    return adaptivefl.train(msg, context)


@app.query("adaptivefl")
def adaptivefl_query(msg: Message, context: Context) -> Message:
    """AdaptiveFL baselines (HeteroFL, Decoupled): report this device's tier."""
    return adaptivefl.query(msg, context)
