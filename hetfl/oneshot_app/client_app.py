"""One-shot baselines' client: FENS's phase-1 handler on all of the client's data (no 90/10 split)."""

from __future__ import annotations

from flwr.app import Context, Message

from hetfl.common.task import client_data, config_of, message_client
from hetfl.fens_app.client_app import train_and_upload


def local(msg: Message, context: Context) -> Message:
    """Train the received initial model on the whole partition (FedKD, Fed-ET, Co-Boosting clients); upload it once."""
    cfg = config_of(context)
    pid = message_client(msg, context, cfg)
    return train_and_upload(msg, context, cfg, pid, client_data(context, cfg, pid))
