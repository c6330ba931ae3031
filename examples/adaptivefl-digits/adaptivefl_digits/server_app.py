"""The ServerApp: AdaptiveFL's submodel pool over the MLP, the full model evaluated on the server every round."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

import hetfl

from .task import accuracy, net, probabilities

app = ServerApp()


def run(grid: Grid, cfg: dict) -> dict:
    pool = hetfl.SubmodelPool(net, widths=(32, 32))  # S1, M1 and the full model L1
    strategy = hetfl.AdaptiveFL(pool=pool, fraction_train=cfg["fraction-train"], seed=cfg["seed"])
    torch.manual_seed(cfg["seed"])
    model = net()

    def evaluate(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in hetfl.unpack_models(arrays, 1)[0].items()})
        return MetricRecord({"accuracy": accuracy(probabilities(model))})

    initial = hetfl.pack_models([{k: v.numpy() for k, v in model.state_dict().items()}])
    result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=cfg["num-server-rounds"],
                            evaluate_fn=evaluate, train_config=ConfigRecord({"lr": cfg["lr"], "seed": cfg["seed"]}))
    return {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = dict(context.run_config)
    metrics = run(grid, cfg)
    if cfg["out"]:
        Path(cfg["out"]).write_text(json.dumps(metrics))
