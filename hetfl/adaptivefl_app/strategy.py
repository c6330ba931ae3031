"""The AdaptiveFL Flower strategy (Algorithm 1) and its baselines from the same code.

Each round: Split the global model into the pool R (leading slices), pick K (model, client)
pairs - RandomSel(R) then the RL ClientSel (Sec. 3.3) - send each client its submodel, and
aggregate the returned (possibly further pruned) submodels with Algorithm 2. The server
never reads a device's capacity: it learns it from which pool member comes back.

Variants (``adaptivefl-variant``; docs/readings.md#adaptivefl-baselines):
  * ``adaptivefl`` - the paper; ``adaptivefl-selection`` = random / curiosity / resource gives
    +Random / +C / +S, ``adaptivefl-dispatch = largest`` with random selection gives +Greed.
  * ``all-large`` - FedAvg of the full model on randomly sampled clients, no resource limits.
  * ``heterofl`` - static uniform-width levels assigned by the device tier (queried once).
  * ``decoupled`` - three separate FedAvg models (S1, M1, L1), each trained by clients that can
    afford it (a sampled client trains one affordable level, chosen uniformly).
Malformed replies (wrong pool index, shapes, NaN/inf) are rejected and logged, never applied.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from hetfl.common.strategy import StrategyBase, check_arrays, check_weight
from hetfl.common.task import pack_models, unpack_models

from . import TRAIN
from .core import ClientSelector, SubmodelPool, aggregate_submodels, slice_state, waste_rate

log = logging.getLogger("hetfl")
LEVELS = ("S1", "M1", "L1")
TIER_LEVEL = {"weak": "S1", "medium": "M1", "strong": "L1"}


class AdaptiveFL(StrategyBase):
    """AdaptiveFL (Alg. 1) over the known clients.

    `clients` maps node id -> client id (the node's partition id, a stable identity across
    restarts, so RL tables and sampling are reproducible and survive a resume); `tiers`
    (client id -> weak/medium/strong) only for the heterofl/decoupled baselines.
    """


    def __init__(self, cfg: dict[str, Any], pool: SubmodelPool, clients: dict[int, int] | None = None,
                 tiers: dict[int, str] | None = None) -> None:
        self.cfg, self.pool = cfg, pool
        self.variant = cfg["adaptivefl-variant"]
        if self.variant in ("heterofl", "decoupled") and not tiers:
            raise ValueError(f"adaptivefl-variant = {self.variant!r} needs the device tiers of the clients")
        self.tiers = tiers or {}
        self.clients = dict(clients or {})
        mode = "random" if self.variant != "adaptivefl" else cfg["adaptivefl-selection"]
        self.selector = ClientSelector(pool, mode, cfg["seed"])
        self.rng = np.random.default_rng([cfg["seed"], 0xAF])
        self.num_models = len(LEVELS) if self.variant == "decoupled" else 1
        self.sent: dict[int, tuple[int, int]] = {}  # node -> (model slot, pool index) this round
        self._states: list[dict[str, np.ndarray]] = []
        self.last_round: dict[str, Any] = {}
        self.total_sent = self.total_back = 0

    # --- planning ---------------------------------------------------------------------------

    def plan(self, nodes: list[int]) -> list[tuple[int, int, int]]:
        """(client, model slot, pool index) for this round's K slots over the online client ids `nodes`."""
        K = max(1, int(len(nodes) * self.cfg["fraction-train"]))
        if self.variant == "adaptivefl":
            return self._plan_adaptivefl(nodes, K)
        chosen = [int(n) for n in self.rng.choice(np.array(nodes, dtype=object), size=min(K, len(nodes)), replace=False)]
        if self.variant == "all-large":
            return [(n, 0, self.pool.largest) for n in chosen]
        out = []
        for n in chosen:
            level = TIER_LEVEL[self.tiers.get(n, "weak")]
            if self.variant == "heterofl":
                out.append((n, 0, self.pool.index(level)))
            else:  # decoupled: one affordable level, uniformly
                slot = int(self.rng.integers(LEVELS.index(level) + 1))
                out.append((n, slot, self.pool.index(LEVELS[slot])))
        return out

    def _plan_adaptivefl(self, nodes: list[int], K: int) -> list[tuple[int, int, int]]:
        """Alg. 1 lines 6-8: RandomSel(R) (or the largest, +Greed), then ClientSel; a model no client can take is redrawn."""
        out: list[tuple[int, int, int]] = []
        chosen: list[int] = []
        for _ in range(min(K, len(nodes))):
            if self.cfg["adaptivefl-dispatch"] == "largest":
                order = [self.pool.largest]
            else:
                first = int(self.rng.integers(len(self.pool)))
                order = [first] + [int(i) for i in self.rng.permutation(len(self.pool)) if i != first]
            for m in order:
                c = self.selector.select(m, nodes, chosen)
                if c is not None:
                    out.append((c, 0, m))
                    chosen.append(c)
                    break
            else:
                log.warning("no client with a positive reward for any pool member; slot left empty")
        return out

    # --- Flower Strategy ----------------------------------------------------------------------

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._states = unpack_models(arrays, self.num_models)
        online = {int(n) for n in grid.get_node_ids()}
        # plan over client ids (stable), send to the node currently serving each client
        node_of = {c: n for n, c in self.clients.items() if n in online}
        unknown = online - set(self.clients)
        if unknown:
            log.warning("round %d: %d connected nodes are not known clients (joined after start); not sampled",
                        server_round, len(unknown))
        self.sent = {}
        messages = []
        for client, slot, m in self.plan(sorted(node_of)):
            node = node_of[client]
            sub = slice_state(self._states[slot], self.pool.shapes(m))
            conf = ConfigRecord({"server-round": server_round, "pool-index": m, "slot": slot,
                                 "prune": self.variant != "all-large"})
            content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in sub.items()}), "config": conf})
            messages.append(Message(content=content, message_type=TRAIN, dst_node_id=node))
            self.sent[node] = (slot, m)
        self.sampled = sorted(self.clients[n] for n in self.sent)
        log.info("round %d: sent %s", server_round,
                 ", ".join(f"{self.pool[m].name}" for _, m in self.sent.values()))
        return messages

    def check_reply(self, reply: Message, sent: int) -> tuple[int | None, dict[str, np.ndarray], float]:
        """(pool index back or None, state, weight) of a reply; ValueError if malformed."""
        metrics = reply.content["metrics"]
        weight = check_weight(metrics["num-examples"])
        if int(metrics["trained"]) == 0:
            return None, {}, weight
        back = int(metrics["pool-index"])
        if not 0 <= back < len(self.pool):
            raise ValueError(f"pool index {back} out of range [0, {len(self.pool)})")
        if not self.pool[sent].contains(self.pool[back]):
            raise ValueError(f"returned {self.pool[back].name}, which is not a submodel of the sent {self.pool[sent].name}")
        try:
            state = check_arrays(reply.content["arrays"], self.pool.shapes(back))
        except ValueError as err:
            raise ValueError(f"{self.pool[back].name}: {err}") from None
        return back, state, weight

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        got: list[list[tuple[dict[str, np.ndarray], float]]] = [[] for _ in range(self.num_models)]
        sent_sizes, back_sizes, losses = [], [], []
        failed = rejected = pruned = untrained = 0
        answered = set()
        for r in replies:
            node = int(r.metadata.src_node_id)
            if node not in self.sent or node in answered:
                continue
            answered.add(node)
            slot, m = self.sent[node]
            sent_sizes.append(self.pool[m].size)
            if r.has_error():
                failed += 1
                back_sizes.append(0)
                self.selector.update(self.clients[node], m, None)
                continue
            try:
                back, state, weight = self.check_reply(r, m)
            except (ValueError, KeyError, TypeError) as err:
                rejected += 1
                back_sizes.append(0)
                log.warning("round %d: rejected update from node %d: %s", server_round, node, err)
                continue
            self.selector.update(self.clients[node], m, back)
            if back is None:
                untrained += 1
                back_sizes.append(0)
                continue
            pruned += back != m
            back_sizes.append(self.pool[back].size)
            got[slot].append((state, weight))
            losses.append(float(r.content["metrics"]["train_loss"]))
        lost = [n for n in self.sent if n not in answered]  # timed out: nothing came back
        for node in lost:
            sent_sizes.append(self.pool[self.sent[node][1]].size)
            back_sizes.append(0)
            self.selector.update(self.clients[node], self.sent[node][1], None)
        new = []
        for slot, st in enumerate(self._states):
            updates = [u for u in got[slot] if u[1] > 0]
            new.append(aggregate_submodels(st, [s for s, _ in updates], [w for _, w in updates]) if updates else st)
        self.total_sent += sum(sent_sizes)
        self.total_back += sum(back_sizes)
        self.last_round = {
            "waste_rate": waste_rate(sent_sizes, back_sizes),
            "cum_waste_rate": waste_rate([self.total_sent], [self.total_back]),
            "params_sent": int(sum(sent_sizes)), "params_back": int(sum(back_sizes)),
            "pruned": pruned, "untrained": untrained, "failed": failed + len(lost), "rejected": rejected,
        }
        metrics = MetricRecord({"train_loss": float(np.mean(losses)) if losses else float("nan"),
                                "failed": failed + len(lost), "rejected": rejected})
        return pack_models(new), metrics

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
        log.info("AdaptiveFL variant %s, selection %s, pool:\n%s", self.variant, self.selector.mode, self.pool.table())
