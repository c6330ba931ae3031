"""The ClientApp: one-shot training on 90% of this node's share, the ensemble's logits on the rest, aggregator steps."""

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

import hetfl

from .task import member_logits, net, partition
from .task import train as train_fn

app = ClientApp()
hetfl.register_discovery(app)  # client ids from partition ids: the same run at the same seed


def splits(context: Context):
    x, y = partition(int(context.node_config["partition-id"]), int(context.node_config["num-partitions"]))
    k = int(0.9 * len(y))
    return (x[:k], y[:k]), (x[k:], y[k:])


@app.train("fens_local")
def local(msg: Message, context: Context) -> Message:
    (x, y), _ = splits(context)

    def fit(arrays, config):
        model = net()
        model.load_state_dict(arrays.to_torch_state_dict())
        train_fn(model, x, y, int(context.run_config["local-epochs"]), float(config["lr"]), int(config["seed"]))
        return model.state_dict(), {"num-examples": len(y), "label_counts": torch.bincount(y, minlength=10).tolist()}

    return hetfl.fens_local_train(msg, fit)


@app.train("fens_logits")
def logits(msg: Message, context: Context) -> Message:
    _, (x, y) = splits(context)
    return hetfl.fens_logits(msg, lambda states: member_logits(states, x).numpy(), y.numpy(), context.state)


@app.train()
def aggregator(msg: Message, context: Context) -> Message:
    return hetfl.fens_aggregator_train(msg, "per-class", context.state, seed=int(msg.content["config"]["server-round"]))
