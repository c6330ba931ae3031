"""SHEFL server: learn device classes, build M models, run the SHEFL strategy, evaluate the ensemble."""

from __future__ import annotations

from typing import Any

from flwr.app import ArrayRecord, Context

from hetfl.common.comm import MeteredGrid
from hetfl.common.models import get_state, set_state
from hetfl.common.nodes import ClientMap, discover_clients, simulated
from hetfl.common.results import run_recorder
from hetfl.common.rounds import run_rounds
from hetfl.common.task import ServerEval, make_model, pack_models, unpack_models
from hetfl.common.train import ensemble_metrics, member_disagreement, predict_proba

from .core import hpc_partitions
from .keys import SHEFLParams
from .strategy import SHEFL


def simulated_classes(grid: Any, cmap: ClientMap, cfg: dict[str, Any]) -> dict[str, Any]:
    """With measure-devices in a simulation, nodes measure themselves but declare no class: the classes are drawn
    as without it (the seeded draw of :func:`~.core.hpc_partitions`), so that timing decides nothing there."""
    if not (cfg["measure-devices"] and simulated(grid)):
        return {}
    declared = {c: str(v) for c, v in cmap.field("device-class").items()}
    hpc = hpc_partitions(len(cmap.clients()), cfg["shefl-hpc-fraction"], cfg["seed"])
    return {"device_class": lambda c: declared.get(c, "hpc" if c in hpc else "lpc")}


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run SHEFL for num-server-rounds with ensemble evaluation after every round."""
    params = SHEFLParams.from_config(cfg)
    M = params.num_models
    members = [make_model(cfg, seed=cfg["seed"] * 1000 + m) for m in range(M)]  # distinct inits
    # clusters and sampling are over client ids, not Flower's random node ids: the same at the same seed, and a
    # resumed run continues identically
    cmap = discover_clients(grid, cfg)
    strategy = SHEFL.from_run_config(cfg, client_map=cmap, **simulated_classes(grid, cmap, cfg))
    roles = strategy.roles
    ev = ServerEval.of(cfg)
    recorder = run_recorder(cfg)
    recorder.extra["roles"] = {"hpc": sum(v == "hpc" for v in roles.values()), "lpc": sum(v != "hpc" for v in roles.values()),
                               "C_h": strategy.C_h, "C_l": strategy.C_l, "k_h": strategy.k_h, "k_l": strategy.k_l}
    if strategy.measured_roles:  # classes assigned from measured speed (measure-devices, deployment)
        recorder.extra["roles"]["measured"] = {str(c): r for c, r in sorted(strategy.measured_roles.items())}

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        for model, st in zip(members, unpack_models(arrays, M), strict=True):
            set_state(model, st)
        probs = predict_proba(members, ev.test, ev.norm, ev.batch_size, **ev.opts)
        loss, acc, accs = ensemble_metrics(probs, ev.test.y)
        disagreement = member_disagreement(probs)  # None with one member: the key is then left out
        out = {"accuracy": acc, "loss": loss, **{f"acc_m{m}": a for m, a in enumerate(accs)},
               **({"disagreement": disagreement} if disagreement is not None else {})}
        if ev.val is not None:  # the half hyper-parameters are chosen on (eval-split = "test-half"; hetfl.tune)
            out["val_accuracy"] = ensemble_metrics(predict_proba(members, ev.val, ev.norm, ev.batch_size, **ev.opts), ev.val.y)[1]
        return out

    recorder.describe("ensemble")  # the mean of the members' softmax; acc_m<j>: each member
    final = run_rounds(grid, strategy, pack_models([get_state(m) for m in members]), cfg, recorder, evaluate_fn)
    return recorder.finish(final, builder="hetfl.common.final_model:mean_softmax", members=M)

