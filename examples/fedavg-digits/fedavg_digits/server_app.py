"""The ServerApp: Flower's FedAvg with the test split evaluated on the server after every round."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from .task import accuracy, net, probabilities

app = ServerApp()


def run(grid: Grid, cfg: dict) -> dict:
    strategy = FedAvg(fraction_train=cfg["fraction-train"], fraction_evaluate=0.0, min_available_nodes=2)
    torch.manual_seed(cfg["seed"])
    model = net()

    def evaluate(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": accuracy(probabilities(model))})

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=cfg["num-server-rounds"], evaluate_fn=evaluate,
                            train_config=ConfigRecord({"lr": cfg["lr"], "seed": cfg["seed"]}))
    return {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = dict(context.run_config)
    metrics = run(grid, cfg)
    if cfg["out"]:
        Path(cfg["out"]).write_text(json.dumps(metrics))
