"""Server side of the FedAvg / FedProx / FedAdam baselines (McMahan et al. 2017; Li et al. 2020; Reddi et al. 2021).

Flower's own `FedAvg` / `FedProx` / `FedAdam` strategies do sampling and aggregation; this
module only adds centralized evaluation, byte accounting and the results writer.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord, Context

from hetfl.baselines.fedbe import DistillOptions
from hetfl.baselines.strategy import SeededFedAdam, SeededFedAvg, SeededFedBE, SeededFedProx, adam_options
from hetfl.common.data import ArrayData, DataSpec, load_server_set
from hetfl.common.comm import MeteredGrid
from hetfl.common.nodes import ClientMap, discover_clients
from hetfl.common.results import RunRecorder
from hetfl.common.rounds import run_rounds
from hetfl.common.task import (
    arrays_to_model,
    centralized_evaluator,
    compute_options,
    dataset_threshold,
    make_model,
    model_to_arrays,
)
from hetfl.common.train import Normalizer


def make_strategy(cfg: dict[str, Any], cmap: ClientMap) -> SeededFedAvg:
    """The Flower strategy for `method` (fedavg | fedprox | fedadam | fedbe), sampling from the clients of `cmap`
    with the run's seed, with centralized evaluation only."""
    kwargs = dict(
        fraction_train=cfg["fraction-train"],
        fraction_evaluate=0.0,
        min_train_nodes=1,
        # the ServerApp waits for min-available-nodes once before round 1; afterwards a round goes on
        # with whoever is connected (Flower would otherwise block forever when a node dies)
        min_available_nodes=1,
    )
    if cfg["method"] == "fedbe":
        return _fedbe(cfg, SeededFedBE(**kwargs).bind(cmap, cfg["seed"], cfg["round-timeout"]))
    if cfg["method"] == "fedprox":
        strategy = SeededFedProx(proximal_mu=cfg["proximal-mu"], **kwargs)
    elif cfg["method"] == "fedadam":
        strategy = SeededFedAdam(eta=cfg["server-lr"], eta_l=cfg["lr"], **adam_options(cfg), **kwargs)
    else:
        strategy = SeededFedAvg(**kwargs)
    return strategy.bind(cmap, cfg["seed"], cfg["round-timeout"])


def fedbe_inputs(cfg: dict[str, Any]) -> tuple[ArrayData, DistillOptions]:
    """FedBE's server set (the held-out train images; the strategy gets only their `x`) and distillation settings."""
    held = load_server_set(DataSpec.from_config(cfg, 1), cfg["cache-dir"])
    opts = DistillOptions(cfg["fedbe-epochs"], cfg["fedbe-batch-size"], cfg["fedbe-lr"], cfg["fedbe-momentum"],
                          cfg["fedbe-weight-decay"], cfg["fedbe-swa-start"])
    return held, opts


def _fedbe(cfg: dict[str, Any], strategy: SeededFedBE) -> SeededFedBE:
    """FedBE's server side: the held-out unlabeled images (never their labels) and the distillation settings."""
    held, opts = fedbe_inputs(cfg)
    return strategy.setup(lambda: make_model(cfg), held.x, Normalizer(cfg["dataset"]), cfg["fedbe-samples"], opts,
                          compute_options(cfg, server=True))


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run FedAvg/FedProx/FedAdam/FedBE for num-server-rounds; returns the run summary."""
    model = make_model(cfg)
    evaluate = centralized_evaluator(cfg)
    recorder = RunRecorder(cfg, dataset_threshold(cfg))
    strategy = make_strategy(cfg, discover_clients(grid, cfg))

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        loss, acc = evaluate(arrays_to_model(model, arrays))
        return {"accuracy": acc, "loss": loss}

    return recorder.finish(run_rounds(grid, strategy, model_to_arrays(model), cfg, recorder, evaluate_fn))
