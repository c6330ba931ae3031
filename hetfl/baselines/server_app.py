"""Server side of the FedAvg / FedProx baselines (McMahan et al. 2017; Li et al. 2020).

Flower's own `FedAvg` / `FedProx` strategies do sampling and weighted averaging; this
module only adds centralized evaluation, byte accounting and the results writer.
"""

from __future__ import annotations

import time
from typing import Any

from flwr.app import ArrayRecord, Context, MetricRecord
from flwr.serverapp.strategy import FedAvg, FedProx

from hetfl.common.comm import MeteredGrid
from hetfl.common.results import RunRecorder
from hetfl.common.task import (
    arrays_to_model,
    centralized_evaluator,
    dataset_threshold,
    make_model,
    model_to_arrays,
)


def make_strategy(cfg: dict[str, Any]) -> FedAvg:
    """The Flower strategy for `method` (fedavg | fedprox), with centralized evaluation only."""
    kwargs = dict(
        fraction_train=cfg["fraction-train"],
        fraction_evaluate=0.0,
        min_train_nodes=1,
        min_available_nodes=cfg["min-available-nodes"],
    )
    if cfg["method"] == "fedprox":
        return FedProx(proximal_mu=cfg["proximal-mu"], **kwargs)
    return FedAvg(**kwargs)


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run FedAvg/FedProx for num-server-rounds; returns the run summary."""
    model = make_model(cfg)
    evaluate = centralized_evaluator(cfg)
    recorder = RunRecorder(cfg, dataset_threshold(cfg))

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        t0 = time.perf_counter()
        loss, acc = evaluate(arrays_to_model(model, arrays))
        traffic = grid.take()
        recorder.record(
            server_round, acc, loss, traffic.bytes_down, traffic.bytes_up,
            eval_s=time.perf_counter() - t0, comm_s=traffic.comm_s,
            replies=traffic.replies, failures=traffic.failures,
        )
        return MetricRecord({"accuracy": acc, "loss": loss})

    make_strategy(cfg).start(
        grid=grid,
        initial_arrays=model_to_arrays(model),
        num_rounds=cfg["num-server-rounds"],
        timeout=cfg["round-timeout"],
        evaluate_fn=evaluate_fn,
    )
    return recorder.finish()
