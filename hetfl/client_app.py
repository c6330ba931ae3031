"""The one ClientApp: each method registers its message handlers here.

Message types: ``train`` (FedAvg/FedProx local training). Methods add their own
actions (``train.<method>``/``query.<method>``) next to their client module.
"""

from __future__ import annotations

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from hetfl.baselines import client_app as baselines

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """FedAvg / FedProx local training."""
    return baselines.train(msg, context)
