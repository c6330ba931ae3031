"""AdaptiveFL glue shared by its server and client: the pool of a run config, a node's device capacity."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from flwr.app import Context

from hetfl.common.nodeconfig import NodeProfile
from hetfl.common.hosting import device_value, num_clients
from hetfl.common.rundata import dataset_info

from .core import TIERS, Capacity, SubmodelPool, assign_tiers, budget_capacity, tier_capacities, uniform_ratio
from .keys import CAPACITY, AdaptiveFLParams
from .scalefl import ScaleFLPool


@lru_cache(maxsize=8)
def _pool(model: str, num_classes: int, shape: tuple[int, int, int], ratios: tuple[float, ...],
          starts: tuple[int, ...], tau: int, batch_stats: bool) -> SubmodelPool:
    return SubmodelPool(model, num_classes, shape, ratios, starts or None, tau, batch_stats)


@lru_cache(maxsize=8)
def _scalefl_pool(model: str, num_classes: int, shape: tuple[int, int, int], exits: tuple[int, ...], batch_stats: bool,
                  weak: int, medium: int) -> ScaleFLPool:
    return ScaleFLPool(model, num_classes, shape, (weak, medium), exits or None, batch_stats)


def reference_pool(cfg: dict[str, Any]) -> SubmodelPool:
    """AdaptiveFL's pool for the run config; it also defines the devices' tier capacities for every variant."""
    info, p = dataset_info(cfg), AdaptiveFLParams.from_config(cfg)
    return _pool(cfg["model"], info.num_classes, tuple(info.shape), p.ratios, p.starts, p.tau, p.bn == "batch")


def pool_of(cfg: dict[str, Any]) -> SubmodelPool:
    """The pool the run's variant dispatches from (same on server and clients).

    ScaleFL's levels scale width and depth (docs/readings.md#adaptivefl-scalefl), their widths fitted to the
    weak and medium tiers' capacities like HeteroFL's.

    HeteroFL (Diao et al. 2021) scales every hidden layer by one ratio per level (start layer 0);
    its two ratios are the largest uniform widths whose models fit the weak and medium tiers'
    capacities, so that all variants run on the same devices.
    """
    ref = reference_pool(cfg)
    info, p = dataset_info(cfg), AdaptiveFLParams.from_config(cfg)
    if p.variant.pool == "scalefl":
        return _scalefl_pool(cfg["model"], info.num_classes, tuple(info.shape), p.scalefl_exits, ref.batch_stats,
                             ref.tier_capacity("weak"), ref.tier_capacity("medium"))
    if p.variant.pool != "heterofl":
        return ref
    ratios = tuple(uniform_ratio(ref.size_of, ref.full, ref.tier_capacity(t)) for t in ("medium", "weak"))
    return _pool(cfg["model"], info.num_classes, tuple(info.shape), ratios, (0,), 0, ref.batch_stats)


@lru_cache(maxsize=8)
def _tiers(n: int, proportions: tuple[float, ...], seed: int) -> tuple[str, ...]:
    """The simulated tier of each of `n` clients (cached: a node with many clients asks once per client)."""
    return tuple(assign_tiers(n, list(proportions), seed))


def device_capacity(context: Context, cfg: dict[str, Any], client: int) -> tuple[str, Capacity]:
    """(tier, capacity) of client `client`: node config 'capacity' (weak | medium | strong | #params) in deployment,
    else the simulated tier of client `client` (adaptivefl-tier-proportions; a node with data of its own must declare it). A tier's capacity follows `adaptivefl-tier-capacity`
    (the authors' clipped Gaussian or fixed S1/M1/L1 sizes of the reference pool); a declared number is fixed.

    docs/readings.md#adaptivefl-devices, docs/deployment.md#device-profile
    """
    pool, p = reference_pool(cfg), AdaptiveFLParams.from_config(cfg)
    tiers = tier_capacities(pool, p.tier_capacity)
    value = device_value(context, cfg, client, CAPACITY)  # the node's declared, else its fleet tier's
    if value is None and p.round_budget_s > 0 and cfg["measure-devices"] and (gamma := measured_capacity(context, cfg, client)):
        fits = [t for t in TIERS if pool.tier_capacity(t) <= gamma]
        return (fits[-1] if fits else "weak"), Capacity(gamma, 0.0, gamma, gamma)
    if value is not None:
        if value in TIERS:
            return str(value), tiers[str(value)]
        gamma = float(value)
        fits = [t for t in TIERS if pool.tier_capacity(t) <= gamma]
        return (fits[-1] if fits else "weak"), Capacity(gamma, 0.0, gamma, gamma)
    if NodeProfile(context.node_config).own_data:
        raise ValueError("node config lacks 'capacity': a SuperNode with data of its own declares its device, "
                         "capacity=\"weak\" | \"medium\" | \"strong\" or a number of parameters (docs/deployment.md)")
    tier = _tiers(num_clients(context, cfg), p.tier_proportions, cfg["seed"])[client]
    return tier, tiers[tier]


MEMBER_FLOPS = "adaptivefl.member-step-flops"  # node state: each pool member's FLOPs per training step


def measured_capacity(context: Context, cfg: dict[str, Any], client: int) -> float | None:
    """The parameters a measured device can train in ``adaptivefl-round-budget-s`` (:func:`~.core.budget_capacity`):
    each pool member's local work per round (``local-steps`` x ``batch-size`` samples, or ``local-epochs`` passes
    over the client's data) at its FLOPs per sample (PyTorch's counter) over the device's achieved FLOP/s (measured
    at discovery, then its last round's). None before the node measured itself."""
    from hetfl.common.costs import step_flops
    from hetfl.common.profile import PROFILE
    from hetfl.common.rundata import client_data, model_input_shape

    if PROFILE not in context.state:
        return None
    flops_per_s = float(context.state[PROFILE]["flops-per-s"])
    pool, p = pool_of(cfg), AdaptiveFLParams.from_config(cfg)
    batch = int(cfg["batch-size"])
    samples = cfg["local-steps"] * batch if cfg["local-steps"] else cfg["local-epochs"] * len(client_data(context, cfg, client))
    shape = tuple(model_input_shape(cfg))
    sizes = [pool[i].size for i in range(len(pool))]
    # each member's FLOPs per training step, counted once per node and kept in its state (a deployed ClientApp is a
    # fresh process each round; the pool, the input shape and the batch decide them)
    key = f"{MEMBER_FLOPS}:{cfg['model']}:{','.join(map(str, sizes))}:{'x'.join(map(str, shape))}:{batch}"
    if key not in context.state:
        import torch
        from flwr.app import ConfigRecord

        with torch.random.fork_rng(devices=[]):  # building the pool's models leaves the device's RNG as it was
            context.state[key] = ConfigRecord({"flops": [float(step_flops(pool.build(i), shape, batch))
                                                         for i in range(len(pool))]})
    step = list(context.state[key]["flops"])
    seconds = [samples * f / batch / flops_per_s for f in step]
    return budget_capacity(sizes, seconds, p.round_budget_s)


def remember_speed(context: Context, flops: float, seconds: float) -> None:
    """A measured device's achieved FLOP/s of its latest round, for the next round's capacity (AdaptiveFL's
    uncertain environments: the budget follows the device as it changes)."""
    from flwr.app import ConfigRecord

    from hetfl.common.profile import PROFILE

    if PROFILE in context.state and flops > 0 and seconds > 0:
        context.state[PROFILE] = ConfigRecord({**dict(context.state[PROFILE]), "flops-per-s": float(flops / seconds)})


def inference_model(cfg: dict[str, Any], tensors: dict[str, Any]) -> Any:
    """Builder of the final model file (docs/inference.md): level L1, the full model, as the server evaluates it."""
    from hetfl.common.final_model import split_members
    from hetfl.common.models import set_state

    from .core import slice_state
    from .strategy import LEVELS

    pool = pool_of(cfg)
    states = split_members(tensors)
    src = states[LEVELS.index("L1")] if AdaptiveFLParams.from_config(cfg).variant.models > 1 else states[0]
    model = pool.build(pool.index("L1"))
    set_state(model, slice_state(src, pool.shapes(pool.index("L1"))))
    return model
