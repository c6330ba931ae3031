"""The one ClientApp: each method registers its message handlers here.

Message types: ``train`` (FedAvg/FedProx local training); ``train.shefl`` and
``query.shefl`` (SHEFL, Fed-Ensemble).
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from hetfl.baselines import client_app as baselines
from hetfl.shefl_app import client_app as shefl

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """FedAvg / FedProx local training."""
    return baselines.train(msg, context)


@app.train("shefl")
def shefl_train(msg: Message, context: Context) -> Message:
    """SHEFL: train the assigned ensemble members, reply with top-k sparse deltas."""
    return shefl.train(msg, context)


@app.query("shefl")
def shefl_query(msg: Message, context: Context) -> Message:
    """SHEFL: report this node's device class (hpc | lpc)."""
    return shefl.query(msg, context)
