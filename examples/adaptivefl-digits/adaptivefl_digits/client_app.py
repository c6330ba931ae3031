"""The ClientApp: this device prunes what it receives to its capacity, then local SGD on its share."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

import hetfl

from .task import net, partition
from .task import train as train_fn

app = ClientApp()
hetfl.register_discovery(app)  # client ids from partition ids: the same run at the same seed
POOL = hetfl.SubmodelPool(net, widths=(32, 32))  # the server's pool


@app.train("adaptivefl")
def train(msg: Message, context: Context) -> Message:
    pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    x, y = partition(pid, n)
    capacity = POOL[0].size if pid % 2 == 0 else None  # even partitions: weak devices that fit S1 only

    def fit(model, config, job):
        seed = int(config["seed"]) * 1000 + int(config["server-round"]) * 10 + pid + 100 * job
        return {"train_loss": train_fn(model, x, y, int(context.run_config["local-epochs"]), float(config["lr"]), seed)}

    return hetfl.adaptivefl_train(msg, POOL, fit, len(y), capacity)
