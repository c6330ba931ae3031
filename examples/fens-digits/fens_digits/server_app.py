"""The ServerApp: FENS's one-shot ensemble and its aggregator, evaluated on the server after every round."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

import hetfl

from .task import TEST, X, accuracy, member_logits, net

app = ServerApp()


def run(grid: Grid, cfg: dict) -> dict:
    strategy = hetfl.FENS(num_classes=10, aggregator="per-class", aggregator_init="average", seed=cfg["seed"])
    torch.manual_seed(cfg["seed"])

    def evaluate(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        z = member_logits(strategy.members, X[TEST])  # the members as the clients hold them (INT8, dequantized)
        strategy.aggregator.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": accuracy(strategy.aggregator(z))})

    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(net().state_dict()),
                            num_rounds=cfg["num-server-rounds"], evaluate_fn=evaluate,
                            train_config=ConfigRecord({"lr": cfg["lr"], "seed": cfg["seed"]}))
    return {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = dict(context.run_config)
    metrics = run(grid, cfg)
    if cfg["out"]:
        Path(cfg["out"]).write_text(json.dumps(metrics))
