"""The ClientApp: local SGD on this node's share, for each ensemble member SHEFL sends it."""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

import hetfl

from .task import net, partition
from .task import train as train_fn

app = ClientApp()
hetfl.register_discovery(app)  # client ids from partition ids: the same run at the same seed


@app.train("shefl")
def train(msg: Message, context: Context) -> Message:
    pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    x, y = partition(pid, n)

    def fit(member, arrays, config):
        model = net()
        model.load_state_dict(arrays.to_torch_state_dict())
        seed = int(config["seed"]) * 1000 + int(config["server-round"]) * 10 + pid + 100 * member
        loss = train_fn(model, x, y, int(context.run_config["local-epochs"]), float(config["lr"]), seed)
        return model.state_dict(), {"train_loss": loss, "num-examples": len(y)}

    return hetfl.shefl_train(msg, fit)
