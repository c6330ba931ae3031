"""The ClientApp: local SGD on this node's share, Flower's quickstart shape."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from .task import net, partition
from .task import train as train_fn

app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    pid, n = int(context.node_config["partition-id"]), int(context.node_config["num-partitions"])
    x, y = partition(pid, n)
    model = net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    config = msg.content["config"]
    seed = int(config["seed"]) * 1000 + int(config["server-round"]) * 10 + pid
    loss = train_fn(model, x, y, int(context.run_config["local-epochs"]), float(config["lr"]), seed)
    metrics = MetricRecord({"train_loss": loss, "num-examples": len(y)})
    return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}), reply_to=msg)
