"""The ServerApp: SHEFL's ensemble of 3 MLPs, the ensemble (mean softmax) evaluated on the server every round."""

import json
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp

import hetfl

from .task import accuracy, net, probabilities

app = ServerApp()


def run(grid: Grid, cfg: dict) -> dict:
    M = cfg["num-models"]
    strategy = hetfl.SHEFL(num_models=M, topk_density=cfg["topk-density"], fraction_train=cfg["fraction-train"],
                           hpc_per_round=1, seed=cfg["seed"], device_class=lambda c: "hpc" if c % 2 == 0 else "lpc")
    members = [net() for _ in range(M)]

    def evaluate(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        for model, state in zip(members, hetfl.unpack_models(arrays, M)):
            model.load_state_dict({k: torch.from_numpy(v) for k, v in state.items()})
        return MetricRecord({"accuracy": accuracy(sum(probabilities(m) for m in members) / M)})

    result = strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(net),
                            num_rounds=cfg["num-server-rounds"], evaluate_fn=evaluate,
                            train_config=ConfigRecord({"lr": cfg["lr"], "seed": cfg["seed"]}))
    return {r: dict(m) for r, m in result.evaluate_metrics_serverapp.items()}


@app.main()
def main(grid: Grid, context: Context) -> None:
    cfg = dict(context.run_config)
    metrics = run(grid, cfg)
    if cfg["out"]:
        Path(cfg["out"]).write_text(json.dumps(metrics))
