"""Who the clients are: the one client-to-node map, bounded discovery, and seeded client sampling.

A *client* is what a method samples, trains and aggregates: one data partition (simulation) or
one device's data (deployment), named by a stable integer *client id*. A *node* is a Flower
SuperNode, named by a node id that Flower draws at random in every run and again after a
restart. One node hosts one client by default; with the run-config key ``num-clients`` > 0 each
simulated SuperNode hosts several logical clients (node ``p`` of ``P`` hosts the client ids
``p, p + P, p + 2P, ...``), which is how a simulation reaches 100,000 clients: Flower's
simulation message pump costs time per SuperNode and per stored message on every pass
(docs/architecture.md#scale), so the number of SuperNodes, not of clients, is what must stay
bounded. The same lets one real SuperNode (a silo) serve several data partitions.

Every method plans in client ids and touches node ids only when sending, through
:class:`ClientMap`: it asks each node once (:data:`~hetfl.common.registry.NODE_QUERY`, in
bounded batches) which clients it hosts, maps every client to the node currently serving it
(a restarted node that reports the same client ids takes them over), and sends each message
to its client's node with at most one message in flight per node (a node's ``Context.state``
is read and written back per message, so two concurrent messages to one node would lose one
client's state). Clients are sampled by client id with a generator seeded by the run's
``seed`` and the round, so the same seed gives the same clients however the clients are spread
over SuperNodes.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict

from .comm import CLIENT
from .registry import NODE_QUERY

log = logging.getLogger("hetfl")

CLIENT_IDS = "client-ids"  # a node's discovery answer: the client ids it hosts (other fields: one value per client)
DISCOVERY_BATCH = 100  # nodes asked at once: Flower's simulation pump costs nodes x stored messages per pass


TRAIN_SALT, EVALUATE_SALT = 0x5EED, 0xE5A1  # the streams of train and federated-evaluation sampling


def sample_clients(clients: Iterable[int], k: int, seed: int, server_round: int, salt: int = TRAIN_SALT) -> list[int]:
    """``k`` distinct client ids drawn uniformly without replacement, sorted.

    The generator is seeded by ``(seed, server_round, salt)`` alone, so a round's sample depends on
    neither node ids, nor arrival order, nor earlier rounds (a resumed run samples the same).
    """
    pool = np.unique(np.fromiter((int(c) for c in clients), dtype=np.int64))
    if k <= 0 or not len(pool):
        return []
    rng = np.random.default_rng([seed, server_round, salt])
    return sorted(int(c) for c in rng.choice(pool, size=min(k, len(pool)), replace=False))


class ClientMap:
    """Client id -> the node serving it, and what each client reported when discovered.

    Parameters
    ----------
    answers : mapping of int to mapping
        Node id -> the node's answer to :data:`~hetfl.common.registry.NODE_QUERY`: ``client-ids`` (list of int) and,
        per method field (e.g. ``device-class``), a list with one value per client id.
    """

    def __init__(self, answers: Mapping[int, Mapping[str, Any]] | None = None) -> None:
        self.node: dict[int, int] = {}  # client id -> node id
        self.info: dict[int, dict[str, Any]] = {}  # client id -> reported fields
        self.hosted: dict[int, list[int]] = {}  # node id -> client ids it serves
        self._sender: dict[str, int] = {}  # message id -> client id, of the latest send_and_receive
        self.asked: set[int] = set()  # nodes asked once (answered or not): never asked again
        self.min_nodes = 0  # min-available-nodes: a round waits (bounded) until this many nodes are connected
        self._gave_up_at = -1  # connected count when a wait last ran out (not waited for again at that count)
        self.records: dict[str, ConfigRecord] = {}  # sent with every message (the run's data description)
        self.left_out: dict[int, str] = {}  # node id -> why it did not answer discovery (its error line)
        self.pending: dict[int, str] = {}  # node id -> id of a message sent to it that got no reply in its round
        self.available: Callable[[int, int], bool] | None = None  # (client, round) -> may be sampled (a fleet's)
        self.plain_nodes_are_clients = False  # map_clients: a node that does not answer discovery is one client
        self.add_answers(answers or {})

    def add_answers(self, answers: Mapping[int, Mapping[str, Any]], live: Iterable[int] = ()) -> None:
        """:meth:`add` every node's answer in node-id order; a malformed answer leaves that node out, with a warning.

        A client already served by a node that is still live (in `live`, the connected nodes, or a node of this same
        batch of answers) is not taken over: the later claim is refused with one warning naming both nodes (two
        devices given the same client id or data, or a misconfigured or hostile node), and the claiming node is asked
        again at the next round, so that a restarted SuperNode takes its client over once its old node id is gone
        (docs/deployment.md#client-ids)."""
        live_now = {int(n) for n in live}
        for node in sorted(answers):
            self.asked.add(int(node))
            try:
                refused = self.add(node, answers[node], live=live_now)
            except (KeyError, ValueError, TypeError) as err:
                log.warning("node %d: unusable discovery answer (%s: %s); it is left out", node, type(err).__name__, err)
                continue
            live_now.add(int(node))
            if refused:
                self.asked.discard(int(node))  # asked again next round: its claim stands once the holder is gone

    # --- who is where ---------------------------------------------------------------------

    def add(self, node: int, answer: Mapping[str, Any], live: set[int] = frozenset()) -> list[int]:
        """Record a node's discovery answer; a client it reports moves to it (a restarted node has a new id) unless the
        node serving it is in `live`. Returns the client ids refused to it."""
        node = int(node)
        ids = [int(c) for c in answer[CLIENT_IDS]]
        fields = {k: list(v) for k, v in answer.items() if k != CLIENT_IDS}
        for k, v in fields.items():
            if len(v) != len(ids):
                raise ValueError(f"node {node}: field '{k}' has {len(v)} values for {len(ids)} client ids")
        kept, refused = [], []
        for j, c in enumerate(ids):
            old = self.node.get(c)
            if old is not None and old != node:
                if old in live:
                    log.warning("client %d: node %d claims it while node %d, which serves it, is still connected: refused "
                                "(two devices with the same client id or data?); it moves to node %d only once node %d "
                                "is gone", c, node, old, node, old)
                    refused.append(c)
                    continue
                log.info("client %d moved from node %d to node %d", c, old, node)
                self.hosted[old] = [x for x in self.hosted.get(old, []) if x != c]
            self.node[c] = node
            self.info[c] = {k: v[j] for k, v in fields.items()}
            kept.append(c)
        self.hosted[node] = kept
        return refused

    def clients(self) -> list[int]:
        """Every known client id, sorted."""
        return sorted(self.node)

    def field(self, name: str) -> dict[int, Any]:
        """Client id -> a reported field (e.g. ``device-class``) of every client that reported it."""
        return {c: a[name] for c, a in sorted(self.info.items()) if name in a}

    def online(self, grid, server_round: int | None = None) -> list[int]:
        """The known client ids whose node is connected now, sorted; in `server_round`, only those ``available``
        then (a simulated fleet's availability, hetfl.common.fleet.available)."""
        connected = {int(n) for n in grid.get_node_ids()}
        ok = (lambda c: True) if self.available is None or server_round is None else \
            (lambda c: self.available(c, server_round))
        return [c for c in sorted(self.node) if self.node[c] in connected and ok(c)]

    def refresh(self, grid, timeout: float) -> None:
        """Ask nodes that connected after discovery (a restarted SuperNode gets a new node id) what they host.

        First, as Flower's strategies do with ``min_available_nodes`` before every round, wait until
        ``min_nodes`` nodes are connected, for at most `timeout` seconds (then the round goes on with the
        nodes that are): a SuperNode that restarts between two rounds is back before the next round samples.
        """
        self.await_nodes(grid, timeout)
        connected = {int(n) for n in grid.get_node_ids()}
        new = sorted(connected - self.asked)
        if new:
            log.info("discovering %d node(s) that connected after the start", len(new))
            self.asked.update(new)
            answers = ask_nodes(grid, new, timeout, records=self.records, errors=self.left_out)
            self.add_answers(answers, live=set(self.hosted) & connected)
            if self.plain_nodes_are_clients:
                self.add_plain([n for n in new if n not in answers])

    def add_plain(self, nodes: Sequence[int]) -> None:
        """Nodes that do not answer discovery, each one client numbered after the known ones (:func:`map_clients`)."""
        first = max(self.node, default=-1) + 1
        for k, node in enumerate(sorted(int(n) for n in nodes)):
            self.left_out.pop(node, None)
            self.add(node, {CLIENT_IDS: [first + k]})

    def await_nodes(self, grid, timeout: float, poll: float = 0.5) -> int:
        """Wait until ``min_nodes`` nodes are connected or `timeout` seconds have passed; the connected count.

        A wait that ran out is not repeated while the same number of nodes is connected (a node gone for good costs
        one wait, not one per round); another count below min-available-nodes waits again."""
        end = time.monotonic() + timeout
        count = len(grid.get_node_ids())
        if count < self.min_nodes and count != self._gave_up_at:
            log.info("%d of min-available-nodes = %d SuperNodes connected: waiting up to %.0f s before the round",
                     count, self.min_nodes, timeout)
            while count < self.min_nodes and time.monotonic() < end:
                time.sleep(poll)
                count = len(grid.get_node_ids())
            log.info("%d SuperNodes connected: the round starts", count)
            self._gave_up_at = count if count < self.min_nodes else -1
        elif count >= self.min_nodes:
            self._gave_up_at = -1
        return count

    # --- sending ------------------------------------------------------------------------------

    def message(self, client: int, content: RecordDict, message_type: str) -> Message:
        """A message for `client`: `content` (shared records are not copied) plus the client's id, to its node."""
        records = {**self.records, **dict(content.items())}
        records[CLIENT] = ConfigRecord({"client-id": int(client)})
        return Message(RecordDict(records), message_type=message_type, dst_node_id=self.node[int(client)])

    def send_and_receive(self, grid, messages: Iterable[Message], timeout: float) -> list[Message]:
        """Send messages made by :meth:`message`; at most one in flight per node; the replies that came in time.

        Messages to distinct nodes go out at once. A node hosting several sampled clients gets
        them one after the other (waves), so its ``Context.state`` is never updated by two
        ClientApp runs at once. :meth:`client_of` names each reply's client afterwards.
        """
        queues: dict[int, list[Message]] = defaultdict(list)
        for m in messages:
            queues[int(m.metadata.dst_node_id)].append(m)
        for node in self.still_busy(grid, set(queues)):  # across rounds too: one ClientApp at a time per node
            skipped = [int(m.content[CLIENT]["client-id"]) for m in queues.pop(node)]
            log.warning("client(s) %s not sent: node %d still runs a message of an earlier round that timed out "
                        "(its node state must not be written by two ClientApps at once)", skipped, node)
        self._sender = {}
        replies: list[Message] = []
        end = time.monotonic() + timeout
        for wave in range(max((len(q) for q in queues.values()), default=0)):
            batch = [q[wave] for q in queues.values() if wave < len(q)]
            left = end - time.monotonic()
            if left <= 0:
                log.warning("round timed out: %d message(s) to nodes hosting several clients were never sent",
                            sum(max(0, len(q) - wave) for q in queues.values()))
                break
            got = list(grid.send_and_receive(batch, timeout=left))  # pushing gives every message its id
            self._sender.update({m.metadata.message_id: int(m.content[CLIENT]["client-id"]) for m in batch})
            replies.extend(got)
            answered = {r.metadata.reply_to_message_id for r in got}
            for m in batch:
                if m.metadata.message_id and m.metadata.message_id not in answered:
                    self.pending[int(m.metadata.dst_node_id)] = m.metadata.message_id
        return replies

    def still_busy(self, grid, nodes: set[int]) -> list[int]:
        """The nodes among `nodes` whose message of an earlier round has neither been answered nor been given up by
        the SuperLink (a late reply or an error: the node is free again; that reply is not used)."""
        busy = []
        for node in sorted(set(self.pending) & nodes):
            if hasattr(grid, "pull_messages") and list(grid.pull_messages([self.pending[node]])):
                del self.pending[node]
            else:
                busy.append(node)
        return busy

    def client_of(self, reply: Message) -> int | None:
        """The client a reply of the latest :meth:`send_and_receive` came from (None: a reply to none of its messages)."""
        return self._sender.get(reply.metadata.reply_to_message_id)


def simulated(grid) -> bool:
    """Whether `grid` is a simulation's (Flower's Simulation Engine, or hetfl's in-process grid), seen through
    MeteredGrid and other wrappers: there a device's measured timing must not decide anything (same seed, same
    run)."""
    from flwr.superlink.grid import InMemoryGrid

    inner = grid
    while hasattr(inner, "_inner"):  # MeteredGrid and other wrappers
        inner = inner._inner
    return isinstance(inner, InMemoryGrid) or bool(getattr(inner, "simulated", False))


def error_line(reply: Message) -> str:
    """A failed reply's error as one line (Flower's reason can hold a whole traceback)."""
    reason = " ".join(str(reply.error.reason).split())
    return reason if len(reason) <= 300 else reason[:297] + "..."


def ask_nodes(grid, nodes: Sequence[int], timeout: float, batch: int = DISCOVERY_BATCH,
              records: Mapping[str, ConfigRecord] | None = None,
              errors: dict[int, str] | None = None) -> dict[int, dict[str, Any]]:
    """Send each node the :data:`~hetfl.common.registry.NODE_QUERY`, `batch` nodes at a time; node id -> its answer (failures left out).

    Flower's simulation pump walks every stored message for every node on each pass, so asking
    all nodes at once costs time quadratic in the nodes; bounded batches keep it linear.
    """
    out: dict[int, dict[str, Any]] = {}
    end = time.monotonic() + timeout
    for i in range(0, len(nodes), batch):
        msgs = [Message(RecordDict({**(records or {}), "config": ConfigRecord({})}), message_type=NODE_QUERY,
                        dst_node_id=int(n))
                for n in nodes[i:i + batch]]
        for r in grid.send_and_receive(msgs, timeout=max(1.0, end - time.monotonic())):
            if r.has_error():
                log.warning("node %d did not answer discovery: %s", r.metadata.src_node_id, error_line(r))
                if errors is not None:
                    errors[int(r.metadata.src_node_id)] = error_line(r)
            else:
                out[int(r.metadata.src_node_id)] = dict(r.content["config"])
    return out


def map_clients(grid, timeout: float = 600.0, min_nodes: int = 1, query_timeout: float = 60.0,
                records: Mapping[str, ConfigRecord] | None = None, plain_are_clients: bool = True) -> ClientMap:
    """Wait for `min_nodes` connected nodes and ask each hetfl's discovery query (`records` sent with it, within
    `query_timeout` seconds): a node that answers declares its clients and their device profiles.

    A node that does not answer is one client when `plain_are_clients` (a Flower user's own ServerApp calling
    ``start``: numbered after the declared ones in node-id order, and so are nodes that connect later; Flower draws
    node ids at random in every run, so without the discovery handler the clients sampled differ from run to run,
    which one log line says), else it is left out with its error line (hetfl's own runs: :func:`discover_clients`).
    Either way it is not asked again every round (those whose claims were refused are: ``add_answers``). A node
    that has not replied at all within `query_timeout` (a simulated node whose ClientApp is still starting on a busy
    machine) is asked once more, waiting up to `timeout`, before the map is made, so that a slow start cannot turn a
    node that declares its clients into a plain one."""
    nodes = wait_for_nodes(grid, min_nodes, timeout)
    errors: dict[int, str] = {}
    answers = ask_nodes(grid, nodes, query_timeout, records=records, errors=errors)
    silent = [n for n in nodes if n not in answers and n not in errors]
    if silent:
        log.warning("%d of %d node(s) sent no reply to the discovery query within %.0f s: asking them again, "
                    "waiting up to %.0f s", len(silent), len(nodes), query_timeout, timeout)
        answers.update(ask_nodes(grid, silent, timeout, records=records, errors=errors))
    plain = [n for n in nodes if n not in answers]
    if plain and not plain_are_clients:
        log.warning("%d of %d nodes did not answer the discovery query", len(plain), len(nodes))
    cmap = ClientMap(answers)
    cmap.min_nodes = int(min_nodes)
    cmap.records = dict(records or {})
    cmap.plain_nodes_are_clients = plain_are_clients
    if plain and plain_are_clients:
        log.warning("%d of %d node(s) do not answer hetfl's discovery query (their ClientApp does not register "
                    "hetfl.register_discovery): each is one client, numbered by its node id, which Flower draws at "
                    "random in every run, so the clients sampled differ from run to run (docs/api.md#discovery)",
                    len(plain), len(nodes))
        cmap.add_plain(plain)
    else:  # each with its error line, or what a silent node did
        cmap.left_out.update({n: errors.get(n, f"no reply to the discovery query within {query_timeout:.0f} s, nor "
                                            f"within {timeout:.0f} s when asked again") for n in plain})
    cmap.asked.update(int(n) for n in plain)
    log.info("%d clients on %d nodes", len(cmap.node), len(nodes) if plain_are_clients else len(answers))
    return cmap


def run_records(cfg: dict[str, Any]) -> dict[str, ConfigRecord]:
    """The records every message of the run carries: for a ``hub:``/``dir:`` dataset the server's description of it
    (classes by name, input shape), which a node holding only its own data cannot know; none for a named dataset
    (every node knows it from the catalog)."""
    from hetfl.data.byo import is_byo
    from hetfl.data.info import RUN_DATA, dataset_info, run_description

    if not is_byo(cfg["dataset"]):
        return {}
    info = dataset_info(cfg["dataset"], cfg["input-column"], cfg["label-column"], cfg["num-classes"])
    return {RUN_DATA: ConfigRecord(run_description(info))}


def discover_clients(grid, cfg: dict[str, Any], timeout: float = 600.0) -> ClientMap:
    """Wait for min-available-nodes nodes and ask each which clients it hosts (and its method's fields); a node that
    does not answer is left out (:func:`map_clients`)."""
    return map_clients(grid, timeout, int(cfg["min-available-nodes"]), cfg["round-timeout"], records=run_records(cfg),
                       plain_are_clients=False)


def wait_for_nodes(grid, min_nodes: int, timeout: float = 600.0, stall: float | None = None,
                   poll: float = 1.0) -> list[int]:
    """Wait until at least `min_nodes` (min-available-nodes) SuperNodes are connected; return their ids (sorted).

    Logs the connected count when it changes (and every 30 s) and never waits silently: it
    fails when fewer than `min_nodes` nodes are connected and no node has joined for `stall`
    seconds, or when no node connects within `timeout` seconds.

    Parameters
    ----------
    stall : float, optional
        Seconds without a new node after which a count below `min_nodes` is final. Default:
        5 s in simulation (Flower registers the whole federation, `num-supernodes`, at once
        before the first ClientApp runs), 120 s in deployment (SuperNodes join over time).
    poll : float
        Seconds between two looks at the connected nodes.

    Raises
    ------
    ConfigError
        min-available-nodes exceeds the nodes that connected (one line: key, value, count).
    TimeoutError
        No node connected within `timeout`.
    """
    from .config import ConfigError

    if stall is None:
        stall = 5.0 if simulated(grid) else 120.0
    start = last_change = last_log = time.monotonic()
    count = -1
    while True:
        nodes = sorted(int(n) for n in grid.get_node_ids())
        now = time.monotonic()
        if len(nodes) >= min_nodes:
            if count >= 0:  # we logged a wait: say that it is over
                log.info("%d SuperNodes connected (min-available-nodes = %d)", len(nodes), min_nodes)
            return nodes
        if len(nodes) != count:
            count, last_change, last_log = len(nodes), now, now
            log.info("waiting for min-available-nodes = %d SuperNodes: %d connected", min_nodes, count)
        elif now - last_log >= 30.0:
            last_log = now
            log.info("still waiting for min-available-nodes = %d SuperNodes: %d connected after %.0f s",
                     min_nodes, count, now - start)
        if count > 0 and now - last_change >= stall:
            raise ConfigError(
                f"run-config key 'min-available-nodes' = {min_nodes} exceeds the {count} SuperNodes connected "
                f"(none joined in {stall:g} s); expected at most {count}, or start {min_nodes} nodes "
                f"(simulation: flwr run . --federation-config \"num-supernodes={min_nodes}\")"
            )
        if now - start >= timeout:
            raise TimeoutError(f"no SuperNode connected within {timeout:g} s (min-available-nodes = {min_nodes})")
        time.sleep(poll)
