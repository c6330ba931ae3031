"""Server side of the FedAvg / FedProx / FedAdam / FedYogi baselines (McMahan et al. 2017; Li et al. 2020; Reddi et al. 2021),
and of FENS's iterative baselines FedNova, Scaffold and FedAvg-STC (docs/readings.md#fens-iterative).

Flower's own `FedAvg` / `FedProx` / `FedAdam` / `FedYogi` strategies do sampling and aggregation; this
module only adds centralized evaluation, byte accounting and the results writer.
"""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord, Context
from torch import nn

from hetfl.baselines import METHOD
from hetfl.baselines.strategy import (
    SeededFedAvg, SeededFedAvgSTC, SeededFedBE, SeededFedNova, SeededFedProx, SeededIterative, SeededScaffold,
)
from hetfl.common.fedopt import SeededFedAdam, SeededFedYogi
from hetfl.common.params import FederationParams, MethodParams
from hetfl.common.comm import MeteredGrid
from hetfl.common.nodes import ClientMap, discover_clients
from hetfl.common.results import run_recorder
from hetfl.common.rounds import run_rounds
from hetfl.common.task import ServerEval, arrays_to_model, make_model, model_to_arrays


STRATEGIES = (SeededFedAvg, SeededFedBE, SeededFedProx, SeededFedAdam, SeededFedYogi, SeededFedNova, SeededScaffold,
              SeededFedAvgSTC)
"""The FedAvg family's strategies, each constructed from its method's parameter class (``params_class``)."""


def make_strategy(params: MethodParams, fed: FederationParams, cmap: ClientMap, model: nn.Module | None = None) -> SeededFedAvg:
    """The strategy of the method whose parameters are `params` (:data:`STRATEGIES`' ``from_params``), sampling from
    the clients of `cmap` with `fed.seed`, with centralized evaluation only. `model`: the global model, whose
    trainable parameters FedNova, Scaffold and FedAvg-STC update (required for them); FedBE's server set comes with
    ``prepare``."""
    cls = {c.params_class: c for c in STRATEGIES}[type(params)]
    extra = {"model": model} if issubclass(cls, SeededIterative) else {}
    return cls.from_params(params, fed, client_map=cmap, **extra)


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run FedAvg/FedProx/FedAdam/FedYogi/FedBE/FedNova/Scaffold/FedAvg-STC for num-server-rounds; returns the run summary."""
    model = make_model(cfg)
    ev = ServerEval.of(cfg)  # its validation half is what a learning rate is picked on (eval-split = "test-half")
    recorder = run_recorder(cfg)
    params = METHOD.params_for(cfg)
    strategy = make_strategy(params, FederationParams.from_config(cfg), discover_clients(grid, cfg), model)
    strategy.prepare(cfg, recorder.run_dir)  # Scaffold: its c_i copies on disk; FedBE: the unlabeled server set

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        loss, acc = ev.evaluate(arrays_to_model(model, arrays))
        if ev.val is None:
            return {"accuracy": acc, "loss": loss}
        return {"accuracy": acc, "loss": loss, "val_accuracy": ev.val_accuracy(model)}

    return recorder.finish(run_rounds(grid, strategy, model_to_arrays(model), cfg, recorder, evaluate_fn))
