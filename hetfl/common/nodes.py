"""Who the clients are: node discovery by client id, and seeded client sampling (docs/architecture.md).

Flower gives every SuperNode a random node id, new in every run (and after a restart), so
anything sampled or ordered by node id changes from run to run. Every method here instead
asks each node once for its *client id* (the partition id of its node config, stable in
simulation and deployment) with the one :data:`~hetfl.common.registry.NODE_QUERY` message,
and samples and orders clients by that id with a generator seeded by the run's ``seed``
and the round, so the same seed gives the same clients (a resumed run too).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from .registry import NODE_QUERY
from .task import wait_for_nodes

log = logging.getLogger("hetfl")


def sample_clients(clients: Iterable[int], k: int, seed: int, server_round: int) -> list[int]:
    """``k`` distinct client ids drawn uniformly without replacement, sorted.

    The generator is seeded by ``(seed, server_round)`` alone, so a round's sample depends on
    neither node ids, nor arrival order, nor earlier rounds (a resumed run samples the same).
    """
    pool = sorted(int(c) for c in clients)
    if k <= 0 or not pool:
        return []
    rng = np.random.default_rng([seed, server_round, 0x5EED])
    return sorted(int(c) for c in rng.choice(pool, size=min(k, len(pool)), replace=False))


class NodeDirectory:
    """Node id -> what the node reported when discovered (its ``client-id`` and method-specific fields).

    Parameters
    ----------
    answers : mapping of int to mapping
        Node id -> the node's answer to :data:`NODE_QUERY`; each answer holds ``client-id``.
    """

    def __init__(self, answers: Mapping[int, Mapping[str, Any]]) -> None:
        self.info: dict[int, dict[str, Any]] = {int(n): dict(a) for n, a in answers.items()}

    def client_of(self, node: int) -> int:
        """The client id of a discovered node."""
        return int(self.info[node]["client-id"])

    def clients(self) -> dict[int, int]:
        """Node id -> client id of every discovered node."""
        return {n: self.client_of(n) for n in self.info}

    def field(self, name: str) -> dict[int, Any]:
        """Client id -> a reported field (e.g. ``device-class``) of every node that reported it."""
        return {self.client_of(n): a[name] for n, a in self.info.items() if name in a}

    def refresh(self, grid, timeout: float) -> None:
        """Ask nodes that connected after discovery (a restarted SuperNode gets a new node id)."""
        new = sorted(set(int(n) for n in grid.get_node_ids()) - set(self.info))
        if new:
            log.info("discovering %d node(s) that connected after the start", len(new))
            self.info.update(ask_nodes(grid, new, timeout))

    def online(self, grid) -> dict[int, int]:
        """Client id -> node id of the connected, discovered nodes (the lowest node id if two claim one client)."""
        out: dict[int, int] = {}
        for n in sorted(int(n) for n in grid.get_node_ids()):
            if n in self.info:
                out.setdefault(self.client_of(n), n)
        return out

    def order(self, nodes: Sequence[int]) -> list[int]:
        """`nodes` sorted by client id (then node id): a run-independent order."""
        return sorted(nodes, key=lambda n: (self.client_of(n) if n in self.info else 1 << 62, n))


def ask_nodes(grid, nodes: Sequence[int], timeout: float) -> dict[int, dict[str, Any]]:
    """Send each node the :data:`NODE_QUERY`; node id -> its answer (nodes that fail are left out)."""
    msgs = [Message(RecordDict({"config": ConfigRecord({})}), message_type=NODE_QUERY, dst_node_id=n) for n in nodes]
    replies = list(grid.send_and_receive(msgs, timeout=timeout))
    for r in replies:  # e.g. a device's bad node config (docs/deployment.md#node-config)
        if r.has_error():
            log.warning("node %s did not answer the discovery query: %s", r.metadata.src_node_id, r.error.reason)
    return {int(r.metadata.src_node_id): dict(r.content["config"]) for r in replies if not r.has_error()}


def discover_nodes(grid, cfg: dict[str, Any], timeout: float = 600.0) -> NodeDirectory:
    """Wait for min-available-nodes nodes and ask each for its client id and method-specific fields."""
    nodes = wait_for_nodes(grid, cfg["min-available-nodes"], timeout)
    answers = ask_nodes(grid, nodes, cfg["round-timeout"])
    if len(answers) < len(nodes):
        log.warning("%d of %d nodes did not answer the discovery query", len(nodes) - len(answers), len(nodes))
    return NodeDirectory(answers)
