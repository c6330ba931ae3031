"""Client side of FedAvg / FedProx: local training of the received model on the client's partition."""

from __future__ import annotations

from flwr.app import Context, Message, MetricRecord, RecordDict

from hetfl.common.task import (
    client_data,
    config_of,
    local_train,
    message_client,
    model_to_arrays,
    received_model,
)


def train(msg: Message, context: Context) -> Message:
    """Train the global model locally; FedProx's mu arrives in the message config as Flower's `proximal-mu`."""
    cfg = config_of(context)
    conf = msg.content["config"]
    model = received_model(cfg, msg.content["arrays"])
    client = message_client(msg, context, cfg)
    data = client_data(context, cfg, client)
    mu = float(conf.get("proximal-mu", 0.0))
    res = local_train(model, data, cfg, int(conf["server-round"]), proximal_mu=mu,
                      seed_offset=client)
    metrics = MetricRecord({"train_loss": res.loss, "num-examples": res.num_examples, "train_s": res.seconds,
                            "steps": res.steps, "proximal_mu": mu})
    return Message(RecordDict({"arrays": model_to_arrays(model), "metrics": metrics}), reply_to=msg)
