"""Server side of the FedAvg / FedProx / FedAdam / FedYogi baselines (McMahan et al. 2017; Li et al. 2020; Reddi et al. 2021),
and of FENS's iterative baselines FedNova, Scaffold and FedAvg-STC (docs/readings.md#fens-iterative).

Flower's own `FedAvg` / `FedProx` / `FedAdam` / `FedYogi` strategies do sampling and aggregation; this
module only adds centralized evaluation, byte accounting and the results writer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import ArrayRecord, Context
from torch import nn

from hetfl.baselines import METHOD
from hetfl.baselines.params import (
    FedAdamParams, FedBEParams, FedNovaParams, FedProxParams, FedYogiParams, ScaffoldParams, STCParams,
)
from hetfl.baselines.strategy import SeededFedAvg, SeededFedAvgSTC, SeededFedBE, SeededFedNova, SeededFedProx, SeededScaffold
from hetfl.common.fedopt import SeededFedAdam, SeededFedYogi
from hetfl.common.params import FederationParams, MethodParams, NoParams
from hetfl.common.comm import MeteredGrid
from hetfl.common.nodes import ClientMap, discover_clients
from hetfl.common.results import run_recorder
from hetfl.common.rounds import run_rounds
from hetfl.common.task import ServerEval, arrays_to_model, make_model, model_to_arrays


ITERATIVE = {FedNovaParams: SeededFedNova, ScaffoldParams: SeededScaffold, STCParams: SeededFedAvgSTC}
"""Strategies that update the model's trainable parameters themselves (they need the global model)."""
BUILDERS: dict[type, Callable[[Any, dict[str, Any]], SeededFedAvg]] = {
    NoParams: lambda p, kw: SeededFedAvg(**kw),
    FedBEParams: lambda p, kw: SeededFedBE(**kw),  # its server set comes with prepare() (SeededFedBE.prepare)
    FedProxParams: lambda p, kw: SeededFedProx(proximal_mu=p.mu, **kw),
    FedAdamParams: lambda p, kw: SeededFedAdam(eta=p.server_lr, eta_l=p.local_lr, **p.adam.options(), **kw),
    FedYogiParams: lambda p, kw: SeededFedYogi(eta=p.server_lr, eta_l=p.local_lr, **p.moments.options(), **kw),
}
"""Parameter class -> the Flower strategy it configures (the other baselines: :data:`ITERATIVE`)."""


def make_strategy(params: MethodParams, fed: FederationParams, cmap: ClientMap, model: nn.Module | None = None) -> SeededFedAvg:
    """The Flower strategy of the method whose parameters are `params` (FedAvg: NoParams, FedProx, FedAdam, FedYogi,
    FedNova, Scaffold, FedAvg-STC; FedBE's strategy needs its server set too: :func:`_fedbe`), sampling from the clients of
    `cmap` with `fed.seed`, with centralized evaluation only. `model`: the global model, whose trainable parameters
    FedNova and Scaffold update (required for them)."""
    kwargs = dict(
        fraction_train=fed.fraction_train,
        fraction_evaluate=0.0,
        min_train_nodes=1,
        # the ServerApp waits for min-available-nodes once before round 1; afterwards a round goes on
        # with whoever is connected (Flower would otherwise block forever when a node dies)
        min_available_nodes=1,
    )
    if type(params) in ITERATIVE:
        if model is None:
            raise ValueError(f"{type(params).__name__}: make_strategy needs the global model")
        trainable = {k: p.detach().cpu().numpy() for k, p in model.named_parameters() if p.requires_grad}
        return ITERATIVE[type(params)](**kwargs).bind(cmap, fed.seed, fed.round_timeout).setup(trainable, params)
    return BUILDERS[type(params)](params, kwargs).bind(cmap, fed.seed, fed.round_timeout)


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
