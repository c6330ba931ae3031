"""The AdaptiveFL Flower strategy (Algorithm 1) and its baselines from the same code.

Each round: Split the global model into the pool R (leading slices), pick K (model, client)
pairs - RandomSel(R) then the RL ClientSel (Sec. 3.3) - send each client its submodel, and
aggregate the returned (possibly further pruned) submodels with Algorithm 2. The server
never reads a device's capacity: it learns it from which pool member comes back.

Methods from this code (``keys.VARIANTS``; docs/readings.md#adaptivefl-baselines):
  * ``adaptivefl`` - the paper; ``adaptivefl-selection`` = random / curiosity / resource gives
    +Random / +C / +S, ``adaptivefl-dispatch = largest`` with random selection gives +Greed.
  * ``all-large`` - FedAvg of the full model on randomly sampled clients, no resource limits.
  * ``heterofl`` - static uniform-width levels: each slot draws a level uniformly, then a client
    whose tier affords it (tiers queried once; the authors' 'available' rule).
  * ``scalefl`` - ScaleFL's width-and-depth levels with early exits, sampled as HeteroFL's.
  * ``decoupled`` - three separate FedAvg models (S1, M1, L1), each trained every round by its
    own sample of K clients that afford it (a client may train several in one round).
One message per node carries every (model, pool index) job it has this round. Only AdaptiveFL's
devices prune; the baselines know the tiers and send what fits. Malformed replies (wrong pool
index, shapes, NaN/inf) are rejected and logged, never applied.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from hetfl.common.nodes import ClientMap
from hetfl.common.params import FederationParams, apply_options
from hetfl.common.strategy import StrategyBase, evaluate_fraction, check_arrays, check_weight, validate_replies
from hetfl.common.task import pack_models, unpack_models

from . import TRAIN
from .core import ClientSelector, SubmodelPool, aggregate_submodels, plan_round, planning_rng, slice_state, waste_rate
from .keys import AdaptiveFLParams

log = logging.getLogger("hetfl")
LEVELS = ("S1", "M1", "L1")
TIER_LEVEL = {"weak": "S1", "medium": "M1", "strong": "L1"}


class Planner:
    """How a round picks its (client, model slot, pool index) jobs over the online client ids (one per
    ``Variant.plan``; docs/readings.md#adaptivefl-baselines)."""

    rl = False  # the RL ClientSel picks the clients (adaptivefl-selection); otherwise they are drawn at random

    def plan(self, s: AdaptiveFL, nodes: list[int], K: int) -> list[tuple[int, int, int]]:
        raise NotImplementedError

    @staticmethod
    def ranks(s: AdaptiveFL, nodes: list[int]) -> dict[int, int]:
        """Client -> the largest level its known tier affords (index into LEVELS)."""
        return {n: LEVELS.index(TIER_LEVEL[s.tiers.get(n, "weak")]) for n in nodes}


class AdaptiveFLPlanner(Planner):
    """Alg. 1 lines 6-8 (`core.plan_round`): RandomSel(R) (or the largest, +Greed), then ClientSel."""

    rl = True

    def plan(self, s: AdaptiveFL, nodes: list[int], K: int) -> list[tuple[int, int, int]]:
        jobs = plan_round(s.pool, s.selector, s.rng, nodes, K, s.params.dispatch)
        if len(jobs) < min(K, len(nodes)):
            log.warning("%d slot(s) left empty: no client with a positive reward for any pool member",
                        min(K, len(nodes)) - len(jobs))
        return [(c, 0, m) for c, m in jobs]


class AllLargePlanner(Planner):
    """All-Large: the full model on K random clients, no resource limits."""

    def plan(self, s: AdaptiveFL, nodes: list[int], K: int) -> list[tuple[int, int, int]]:
        chosen = s.rng.choice(np.array(nodes, dtype=object), size=min(K, len(nodes)), replace=False)
        return [(int(n), 0, s.pool.largest) for n in chosen]


class LevelPlanner(Planner):
    """HeteroFL and ScaleFL: each slot draws a level uniformly, then a client whose tier affords it (nobody left
    affords it: the largest level some client does; the authors' 'available' rule)."""

    def plan(self, s: AdaptiveFL, nodes: list[int], K: int) -> list[tuple[int, int, int]]:
        rank, out, chosen = self.ranks(s, nodes), [], set()
        for _ in range(min(K, len(nodes))):
            level = int(s.rng.integers(len(LEVELS)))
            free = [n for n in nodes if n not in chosen]
            level = min(level, max(rank[n] for n in free))
            n = int(s.rng.choice(np.array([n for n in free if rank[n] >= level], dtype=object)))
            chosen.add(n)
            out.append((n, 0, s.pool.index(LEVELS[level])))
        return out


class DecoupledPlanner(Planner):
    """Decoupled: each of the three models its own K clients that afford it (the authors' Training_Decoupled)."""

    def plan(self, s: AdaptiveFL, nodes: list[int], K: int) -> list[tuple[int, int, int]]:
        rank, out = self.ranks(s, nodes), []
        for slot, level in enumerate(LEVELS):
            able = np.array([n for n in nodes if rank[n] >= slot], dtype=object)
            for n in s.rng.choice(able, size=min(K, len(able)), replace=False):
                out.append((int(n), slot, s.pool.index(level)))
        return out


PLANNERS: dict[str, type[Planner]] = {"adaptivefl": AdaptiveFLPlanner, "all-large": AllLargePlanner,
                                      "level": LevelPlanner, "decoupled": DecoupledPlanner}
"""``Variant.plan`` -> its planner."""


@dataclass
class _Tally:
    """What one round's replies brought back: per pool slot the (state, weight) updates, returns per pool member,
    parameter counts sent and back (Eq. 5), train losses and the outcome counts."""

    got: list[list[tuple[dict[str, np.ndarray], float]]]
    returned: list[int]
    sent_sizes: list[int] = field(default_factory=list)
    back_sizes: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    failed: int = 0
    pruned: int = 0
    untrained: int = 0
    back_by_client: dict[int, int] = field(default_factory=dict)  # client -> the largest model it returned (params)
    capacity_by_client: dict[int, float] = field(default_factory=dict)  # a measured device's own capacity (record)


class AdaptiveFL(StrategyBase):
    """AdaptiveFL (Alg. 1): a width-wise submodel pool, RL client selection, devices that prune what they receive to
    their own resources, and Alg. 2's aggregation of the submodels that come back; its baselines from the same code.

    Construct it with the pool and keyword arguments, each a field of
    :class:`~hetfl.adaptivefl_app.keys.AdaptiveFLParams` or :class:`~hetfl.common.params.FederationParams`
    (``AdaptiveFL(pool=SubmodelPool(build, widths=(128, 64)), fraction_train=0.5, seed=0)``; ``variant`` names a
    baseline: ``"heterofl"``, ``"all-large"``, ...), or from hetfl's run config with :meth:`from_run_config`. The arrays
    it trains are the full model packed as one member, ``m0.<name>`` (``pack_models([state])``; Decoupled: its three
    models, S1, M1, L1); clients answer with
    :func:`~hetfl.adaptivefl_app.client_app.adaptivefl_train` (the message contract: docs/api.md#adaptivefl).

    Client ids are stable across restarts, so the RL tables and sampling are reproducible and survive a resume. The
    server never reads a device's capacity: it learns it from which pool member comes back. `tiers` (client id ->
    weak/medium/strong) only for the baselines that assume known tiers (HeteroFL, ScaleFL, Decoupled); without it,
    what the nodes declared at discovery (``tier``). `fraction_evaluate` > 0: federated evaluation, that share of the
    online clients sent the packed full model each round (an ``evaluate`` message; metrics averaged by
    ``num-examples``); 0 (default): evaluation on the server.
    """

    def __init__(self, params: AdaptiveFLParams | None = None, federation: FederationParams | None = None, *,
                 pool: SubmodelPool, client_map: ClientMap | None = None, tiers: dict[int, str] | None = None,
                 fraction_evaluate: float = 0.0, **options: Any) -> None:
        if isinstance(options.get("variant"), str):
            from .keys import VARIANTS

            if options["variant"] not in VARIANTS:
                raise ValueError(f"AdaptiveFL: variant={options['variant']!r} is not allowed; expected one of "
                                 + ", ".join(repr(v) for v in VARIANTS))
            options["variant"] = VARIANTS[options["variant"]]
        self.fraction_evaluate, self._evaluating = evaluate_fraction("AdaptiveFL", fraction_evaluate), []
        self.params, self.fed = apply_options("AdaptiveFL", options, params or AdaptiveFLParams(),
                                              federation or FederationParams())
        self.seed = self.fed.seed  # the federated evaluation's sampling
        self.pool = pool
        self.variant = self.params.variant
        self.tiers = dict(tiers or {})
        self.map = client_map
        self.planner = PLANNERS[self.variant.plan]()
        self.selector = ClientSelector(pool, self.params.selection if self.planner.rl else "random", self.fed.seed)
        self.rng = planning_rng(self.fed.seed)
        self.num_models = self.variant.models
        self.sent: dict[int, list[tuple[int, int]]] = {}  # client -> [(model slot, pool index)] this round
        self._states: list[dict[str, np.ndarray]] = []
        self.last_round: dict[str, Any] = {}
        self.total_sent = self.total_back = 0
        if client_map is not None and client_map.hosted:
            self.attach(client_map)

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any], **kwargs: Any) -> AdaptiveFL:
        """The strategy of a validated hetfl run config: its method (the variant), ``adaptivefl-*`` keys and pool."""
        from .task import pool_of

        kwargs.setdefault("pool", pool_of(dict(cfg)))
        return cls(AdaptiveFLParams.from_config(cfg), FederationParams.from_config(cfg), **kwargs)

    def attach(self, cmap: ClientMap) -> None:
        """Serve `cmap`'s clients; the baselines that know tiers take those the nodes declared (``tier``)."""
        super().attach(cmap)
        if self.variant.knows_tiers:
            self.tiers = {**{c: str(t) for c, t in cmap.field("tier").items()}, **self.tiers}
            if not self.tiers:
                raise ValueError(f"method {self.variant.name!r} needs the device tiers of the clients: pass tiers= or "
                                 "let nodes declare theirs (node config 'tier' through hetfl's discovery)")

    # --- planning ---------------------------------------------------------------------------

    def plan(self, nodes: list[int]) -> list[tuple[int, int, int]]:
        """(client, model slot, pool index) jobs of this round over the online client ids `nodes` (the variant's
        :class:`Planner`)."""
        return self.planner.plan(self, nodes, max(1, int(len(nodes) * self.fed.fraction_train)))

    # --- Flower Strategy ----------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._states = unpack_models(arrays, self.num_models)
        self.map.refresh(grid, self.fed.round_timeout)
        if self.tiers:  # the tier baselines: clients found after the start report theirs too
            self.tiers.update({c: str(t) for c, t in self.map.field("tier").items()})
        jobs: dict[int, list[tuple[int, int]]] = {}
        for client, slot, m in self.plan(self.map.online(grid, server_round)):  # plan over client ids (stable)
            jobs.setdefault(client, []).append((slot, m))
        self.sent = jobs
        messages = []
        for client, todo in jobs.items():
            subs = [slice_state(self._states[slot], self.pool.shapes(m)) for slot, m in todo]
            conf = ConfigRecord({**dict(config), "server-round": server_round, "pool-index": [m for _, m in todo],
                                 "slot": [slot for slot, _ in todo], "prune": self.variant.prune})
            messages.append(self.map.message(client, RecordDict({"arrays": pack_models(subs), "config": conf}), TRAIN))
        self.sampled = sorted(self.sent)
        log.info("round %d: sent %s", server_round,
                 ", ".join(self.pool[m].name for todo in jobs.values() for _, m in todo))
        return messages

    def check_reply(self, reply: Message, sent: list[int]) -> tuple[list[int | None], list[dict[str, np.ndarray]], float]:
        """(pool index back or None per sent job, states, weight) of a reply; ValueError if malformed."""
        metrics = reply.content["metrics"]
        weight = check_weight(metrics["num-examples"])
        backs = [int(b) for b in metrics["pool-index"]]
        if len(backs) != len(sent):
            raise ValueError(f"{len(backs)} pool indices returned for {len(sent)} jobs")
        expected: dict[str, tuple[int, ...]] = {}
        dtypes = {k: v.dtype for k, v in self._states[0].items()} if self._states else None  # the global model's
        for j, (back, m) in enumerate(zip(backs, sent, strict=True)):
            if back == -1:  # nothing fit this device
                continue
            if not 0 <= back < len(self.pool):
                raise ValueError(f"pool index {back} out of range [0, {len(self.pool)})")
            if not self.pool[m].contains(self.pool[back]):
                raise ValueError(f"returned {self.pool[back].name}, which is not a submodel of the sent {self.pool[m].name}")
            expected.update({f"m{j}.{k}": shape for k, shape in self.pool.shapes(back).items()})
        flat = check_arrays(reply.content["arrays"], expected,
                            {k: dtypes[k.split(".", 1)[1]] for k in expected} if dtypes else None)
        states: list[dict[str, np.ndarray]] = [{} for _ in sent]
        for key, value in flat.items():
            j, name = key.split(".", 1)
            states[int(j[1:])][name] = value
        return [None if b == -1 else b for b in backs], states, weight

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Alg. 2 per pool slot over the trained submodels that came back; the RL tables learn every outcome."""
        tally = _Tally([[] for _ in range(self.num_models)], [0] * len(self.pool))

        def check(r: Message) -> tuple[list[int | None], list[dict[str, np.ndarray]], float, float | None]:
            backs, states, weight = self.check_reply(r, [m for _, m in self.sent[self.map.client_of(r)]])
            loss = float(r.content["metrics"]["train_loss"]) if any(b is not None for b in backs) else None
            return backs, states, weight, loss

        replies = list(replies)
        ok, _, rejected = validate_replies(replies, check, server_round, self.map, set(self.sent))
        parsed = {id(r): p for r, p in ok}
        answered = set()
        for r in replies:  # client-id order (order_replies): the RL tables see the same sequence in every run
            client = self.map.client_of(r)
            if client not in self.sent or client in answered:
                continue
            answered.add(client)
            self._take_reply(tally, client, r, parsed.get(id(r)))
        lost = [c for c in self.sent if c not in answered]  # timed out: nothing came back
        for client in lost:
            for _, m in self.sent[client]:
                tally.sent_sizes.append(self.pool[m].size)
                tally.back_sizes.append(0)
                self.selector.update(client, m, None)
        tally.failed += len(lost)
        self.rejected = rejected
        new = []
        for slot, st in enumerate(self._states):
            updates = [u for u in tally.got[slot] if u[1] > 0]
            new.append(aggregate_submodels(st, [s for s, _ in updates], [w for _, w in updates]) if updates else st)
        self._close_round(tally, rejected)
        metrics = MetricRecord({"train_loss": float(np.mean(tally.losses)) if tally.losses else float("nan"),
                                "failed": tally.failed, "rejected": rejected})
        return pack_models(new), metrics

    def _take_reply(self, tally: _Tally, client: int, r: Message, parsed: tuple | None) -> None:
        """One client's reply into the tally, each sent submodel's outcome into the RL tables (failed, rejected:
        nothing applied; a rejected reply leaves the tables untouched, as validate_replies logged it)."""
        todo = self.sent[client]
        tally.sent_sizes += [self.pool[m].size for _, m in todo]
        if r.has_error():
            tally.failed += 1
            tally.back_sizes += [0] * len(todo)
            for _, m in todo:
                self.selector.update(client, m, None)
            return
        if parsed is None:
            tally.back_sizes += [0] * len(todo)
            return
        backs, states, weight, loss = parsed
        metrics = r.content["metrics"]
        if "capacity" in metrics:  # what a measured device could afford: recorded, never read by the RL tables
            tally.capacity_by_client[client] = float(metrics["capacity"])
        tally.back_by_client[client] = max((self.pool[b].size for b in backs if b is not None), default=0)
        for (slot, m), back, state in zip(todo, backs, states, strict=True):
            self.selector.update(client, m, back)
            if back is None:
                tally.untrained += 1
                tally.back_sizes.append(0)
                continue
            tally.pruned += back != m
            tally.returned[back] += 1
            tally.back_sizes.append(self.pool[back].size)
            tally.got[slot].append((state, weight))
        if loss is not None:
            tally.losses.append(loss)

    def _close_round(self, tally: _Tally, rejected: int) -> None:
        """The round's columns (waste rate, Eq. 5) and the run's running totals."""
        self.total_sent += sum(tally.sent_sizes)
        self.total_back += sum(tally.back_sizes)
        self.last_round = {
            "waste_rate": waste_rate(tally.sent_sizes, tally.back_sizes),
            "cum_waste_rate": waste_rate([self.total_sent], [self.total_back]),
            "params_sent": int(sum(tally.sent_sizes)), "params_back": int(sum(tally.back_sizes)),
            "pruned": tally.pruned, "untrained": tally.untrained, "failed": tally.failed, "rejected": rejected,
            **{f"back_{e.name}": n for e, n in zip(self.pool.entries, tally.returned, strict=True)},
            "largest_back_by_client": {str(c): n for c, n in sorted(tally.back_by_client.items())},
            **({"capacity_by_client": {str(c): v for c, v in sorted(tally.capacity_by_client.items())}}
               if tally.capacity_by_client else {}),
        }

    def round_metrics(self, traffic: Any) -> dict[str, Any]:
        """Waste rate (Eq. 5), parameters sent/back, pruned/untrained/failed/rejected, returns per pool member."""
        return dict(self.last_round)

    def state_dict(self) -> dict[str, Any]:
        """RL tables, sampling RNG and waste totals (for checkpoints)."""
        return {"selector": self.selector.state(), "selector_rng": self.selector.rng.bit_generator.state,
                "rng": self.rng.bit_generator.state, "totals": (self.total_sent, self.total_back)}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.selector.load(st["selector"])
        self.selector.rng.bit_generator.state = st["selector_rng"]
        self.rng.bit_generator.state = st["rng"]
        self.total_sent, self.total_back = st["totals"]

    def summary(self) -> None:
        log.info("method %s (AdaptiveFL's code), selection %s, pool:\n%s", self.variant.name, self.selector.mode, self.pool.table())
