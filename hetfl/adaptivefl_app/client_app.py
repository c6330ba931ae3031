"""AdaptiveFL client: prune the received submodel to this device's capacity (Sec. 3.2), train it, send it back."""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from hetfl.common.models import set_state
from hetfl.common.task import client_data, config_of, local_train, model_to_arrays, node_partition

from .core import fluctuate, slice_state
from .task import device_capacity, pool_of


def node_info(context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """What an AdaptiveFL node reports when discovered: its device tier, only to the HeteroFL/Decoupled baselines
    (AdaptiveFL's server learns capacities only from the models that come back)."""
    return {"tier": device_capacity(context, cfg)[0]} if cfg["adaptivefl-variant"] in ("heterofl", "decoupled") else {}


def train(msg: Message, context: Context) -> Message:
    """Alg. 1 LocalTrain: fit the received pool member to Gamma (largest contained member that fits), train, reply."""
    cfg = config_of(context)
    conf = msg.content["config"]
    rnd, sent = int(conf["server-round"]), int(conf["pool-index"])
    pool = pool_of(cfg)
    pid = node_partition(context)[0]
    data = client_data(context, cfg)
    back: int | None = sent
    if bool(conf["prune"]):
        _, gamma = device_capacity(context, cfg)
        back = pool.fit(sent, fluctuate(gamma, cfg["capacity-fluctuation"], cfg["seed"], rnd, pid))
    if back is None:  # not even the smallest contained model fits this round
        metrics = MetricRecord({"trained": 0, "num-examples": len(data), "pool-index": -1, "train_loss": 0.0})
        return Message(RecordDict({"arrays": ArrayRecord(), "metrics": metrics}), reply_to=msg)
    received = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    model = pool.build(back)
    set_state(model, slice_state(received, pool.shapes(back)))
    res = local_train(model, data, cfg, rnd, seed_offset=pid)
    metrics = MetricRecord({"trained": 1, "num-examples": len(data), "pool-index": back, "train_loss": res.loss,
                            "train_s": res.seconds})
    return Message(RecordDict({"arrays": model_to_arrays(model), "metrics": metrics}), reply_to=msg)
