"""AdaptiveFL server: build the global model, run the strategy, evaluate the full model and each level."""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import ArrayRecord, Context

from hetfl.common.comm import MeteredGrid
from hetfl.common.models import get_state, set_state
from hetfl.common.nodes import ClientMap, discover_clients
from hetfl.common.results import run_recorder
from hetfl.common.rounds import run_rounds
from hetfl.common.task import ServerEval, log, pack_models, unpack_models

from .core import slice_state, tier_capacities
from .keys import AdaptiveFLParams
from .strategy import LEVELS, AdaptiveFL
from .task import pool_of, reference_pool


def discover_tiers(grid: MeteredGrid, cfg: dict[str, Any]) -> tuple[ClientMap, dict[int, str]]:
    """Ask every node for its clients; the HeteroFL/Decoupled/ScaleFL baselines also get each client's device tier
    (they assume known tiers; AdaptiveFL's server never asks)."""
    cmap = discover_clients(grid, cfg)
    tiers = {c: str(t) for c, t in cmap.field("tier").items()}
    for c, line in cmap.field("capacity-warning").items():
        if line:
            log.warning("%s", line)
    if tiers:
        log.info("device tiers: %s", {t: sum(v == t for v in tiers.values()) for t in ("weak", "medium", "strong")})
    return cmap, tiers


def run(grid: MeteredGrid, context: Context, cfg: dict[str, Any]) -> dict[str, Any]:
    """Run AdaptiveFL or one of its baselines (the run's ``method``) with per-level evaluation after every round."""
    params = AdaptiveFLParams.from_config(cfg)
    pool = pool_of(cfg)
    log.info("submodel pool (%s):\n%s", cfg["model"], pool.table())
    cmap, tiers = discover_tiers(grid, cfg)
    strategy = AdaptiveFL.from_run_config(cfg, pool=pool, client_map=cmap, tiers=tiers)
    torch.manual_seed(cfg["seed"])  # the full model L1, as make_model would build it, with the pool's BatchNorm
    full = get_state(pool.build(pool.largest))
    if params.variant.models > 1:  # Decoupled: separate models, each initialised from the same full model's slices
        initial = [slice_state(full, pool.shapes(pool.index(level))) for level in LEVELS]
    else:
        initial = [full]
    models = {level: pool.build(pool.index(level)) for level in LEVELS}
    ev = ServerEval.of(cfg)
    recorder = run_recorder(cfg)
    recorder.extra["pool"] = [{"name": e.name, "ratio": e.ratio, "start": e.start, "params": e.size, "exits": e.depth}
                              for e in pool.entries]
    caps = tier_capacities(reference_pool(cfg), params.tier_capacity)
    recorder.extra["devices"] = {t: vars(c) for t, c in caps.items()}
    log.info("device capacities (%s, parameters): %s", params.tier_capacity, ", ".join(
        f"{t} {c.loc:,.0f}" + (f" +- {c.scale:,.0f} in [{c.low:,.0f}, {c.high:,.0f}]" if c.scale else "") for t, c in caps.items()))

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> dict[str, float]:
        states = unpack_models(arrays, strategy.num_models)
        accs, losses = {}, {}
        for slot, level in enumerate(LEVELS):
            src = states[slot] if params.variant.models > 1 else states[0]
            model = models[level]
            set_state(model, slice_state(src, pool.shapes(pool.index(level))))
            losses[level], accs[level] = ev.evaluate(model)
        out = {"accuracy": accs["L1"], "loss": losses["L1"], **{f"acc_{k}": v for k, v in accs.items()},
               "acc_avg": sum(accs.values()) / len(accs)}
        if ev.val is not None:  # the full model (L1) is what is reported, so it is what is chosen on
            out["val_accuracy"] = ev.val_accuracy(models["L1"])
        return out

    # the paper's figures: accuracy of each level (S1, M1, L1 = the full model) and the waste rate (Eq. 5)
    recorder.describe("L1 (full model)", panels={"waste rate": ["waste_rate", "cum_waste_rate"]}, same_as="acc_L1")
    final = run_rounds(grid, strategy, pack_models(initial), cfg, recorder, evaluate_fn)
    return recorder.finish(final, builder="hetfl.adaptivefl_app.task:inference_model", level="L1")
