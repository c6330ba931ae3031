"""Which clients a SuperNode hosts, and what each is: its client id, its partition, its device profile and the
node-state keys of its records. The same in simulation and deployment (docs/architecture.md#scale,
docs/node-data.md, docs/deployment.md#device-profile); the server's side of it is :mod:`hetfl.common.nodes`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flwr.app import Context

from hetfl.data.byo import LocalDataError, content_client_id

from .fleet import tiers_of
from .nodeconfig import NodeKey, NodeProfile


def node_partition(context: Context) -> tuple[int, int]:
    """(partition-id, num-partitions) from the node config (simulation and deployment alike)."""
    nc = context.node_config
    try:
        pid, n = int(nc["partition-id"]), int(nc["num-partitions"])
    except KeyError as err:
        raise KeyError(
            f"node config lacks {err}: start the SuperNode with "
            "--node-config \"partition-id=<i> num-partitions=<n>\" (or 'data-path=\"<dir>\"' for data of its own)"
        ) from err
    if not 0 <= pid < n:
        raise ValueError(f"node config partition-id={pid} out of range [0, {n})")
    return pid, n


def node_data_where(path: str, context: Context | None = None) -> str:
    """How errors name a node's data (:class:`~hetfl.data.byo.LocalDataError` messages start with it): the client
    id it serves (with `context`) and the path."""
    if context is None:
        return f"node data-path {path!r}"
    try:
        return f"client {node_client_id(context)}: node data-path {path!r}"
    except Exception:  # noqa: BLE001 - an unreadable directory has no content id: the data error says why
        return f"node data-path {path!r}"


def node_client_id(context: Context) -> int:
    """This node's client id: node config ``client-id`` if given, else ``partition-id``, else, for a node with a
    ``data-path``, an id derived from its data's content (:func:`hetfl.data.byo.content_client_id`: the first
    31 bits of the SHA-256 of the directory's files). docs/node-data.md

    Raises
    ------
    KeyError
        The node config has none of ``client-id``, ``partition-id`` and ``data-path``.
    ValueError
        ``client-id`` is not a non-negative integer.
    """
    nc = context.node_config
    if "client-id" in nc:
        raw = nc["client-id"]
        if isinstance(raw, bool) or not (isinstance(raw, int) or (isinstance(raw, str) and raw.strip().isdigit())) \
                or int(raw) < 0:
            raise ValueError(f"node config client-id={raw!r}; expected a non-negative integer")
        return int(raw)
    if "partition-id" in nc:
        return int(nc["partition-id"])
    if (path := NodeProfile(nc).data_path) is not None:
        if not Path(path).is_dir():
            raise LocalDataError(f"{node_data_where(path)}: no such directory; expected a directory written by "
                                 "Dataset.save_to_disk or an image folder")
        return content_client_id(path)
    raise KeyError("node config lacks a client id: start the SuperNode with --node-config \"partition-id=<i> "
                   "num-partitions=<n>\" (a partition of the run's dataset) or 'data-path=\"<dir>\"' (data of its own; "
                   "optionally client-id=<int>)")


def device_value(context: Context, cfg: dict[str, Any], client: int, key: NodeKey) -> Any:
    """A client's device-profile value of `key` (SHEFL's ``device-class``, AdaptiveFL's ``capacity``): what its node
    declares (a real device), else its tier's in the run's ``fleet`` (simulation), else None (the method draws it)."""
    value = NodeProfile(context.node_config).device(key)
    if value is None and (tiers := tiers_of(cfg)) is not None and 0 <= client < len(tiers):
        value = tiers[client].node_config().get(key.name)
    return value


def num_clients(context: Context, cfg: dict[str, Any]) -> int:
    """Clients of the federation: run-config ``num-clients``, or one per SuperNode (``num-partitions``) when 0."""
    return cfg["num-clients"] or node_partition(context)[1]


def hosted_clients(partition_id: int, num_partitions: int, num_clients: int) -> list[int]:
    """Client ids hosted by SuperNode `partition_id` of `num_partitions` (``num_clients`` 0: its partition id).

    With ``num_clients`` > 0 the clients are dealt round robin: node ``p`` hosts ``p, p + P, ...``
    (docs/architecture.md#scale).
    """
    if num_clients <= 0:
        return [int(partition_id)]
    return list(range(int(partition_id), int(num_clients), int(num_partitions)))


def _single_client(nc) -> bool:
    """Whether a node is one client named by :func:`node_client_id` (data of its own, a declared id, no partition)."""
    return NodeProfile(nc).own_data or "client-id" in nc or "partition-id" not in nc


def node_clients(context: Context, cfg: dict[str, Any]) -> list[int]:
    """The client ids this node hosts (what it answers to discovery).

    A node with data of its own (``data-path``) or a declared ``client-id`` is one client
    (:func:`node_client_id`); a node that holds a partition of the run's dataset hosts its
    partition id, or with ``num-clients`` > 0 its share of the clients (:func:`hosted_clients`).
    """
    if _single_client(context.node_config):
        return [node_client_id(context)]
    pid, n = node_partition(context)
    return hosted_clients(pid, n, cfg["num-clients"])


def message_client(msg, context: Context, cfg: dict[str, Any]) -> int:
    """The client id a message is for: its ``client`` record (a client this node hosts), else the node's one client.

    Raises
    ------
    ValueError
        The message names a client this node does not host, or names none on a node that hosts several.
    """
    if "client" in msg.content:
        client = int(msg.content["client"]["client-id"])
        if _single_client(context.node_config) or not cfg["num-clients"]:
            hosted = client in node_clients(context, cfg)
        else:  # round robin: no list of thousands of ids per message
            pid, n = node_partition(context)
            hosted = 0 <= client < cfg["num-clients"] and client % n == pid
        if not hosted:
            raise ValueError(f"message for client {client}, which this SuperNode does not host "
                             f"(it hosts {node_clients(context, cfg)[:5]}...)")
        return client
    clients = node_clients(context, cfg)
    if len(clients) != 1:
        raise ValueError(f"message names no client and this node hosts {len(clients)}")
    return clients[0]


def state_key(client: int, name: str) -> str:
    """The node-state (``Context.state``) key of a client's record `name`: each hosted client keeps its own."""
    return f"{name}@{int(client)}"


DECLARED = ("device-class", "capacity")  # the device profile a node may declare (SHEFL, AdaptiveFL)


def declare_clients(msg, context: Context):
    """The discovery handler for a ClientApp of one's own (``register_discovery(app)``): this node is one client,
    its id the node config's ``client-id`` (else ``partition-id``), with the device profile its node config declares
    (``device-class``, ``capacity``). With it, a Strategy's ``start`` samples by these ids, so a run is the same at
    the same seed whatever node ids Flower draws (docs/api.md#discovery)."""
    from flwr.app import ConfigRecord, Message, RecordDict

    from .nodes import CLIENT_IDS

    answer: dict[str, Any] = {CLIENT_IDS: [node_client_id(context)]}
    for key in DECLARED:
        if key in context.node_config:
            answer[key] = [context.node_config[key]]
    return Message(RecordDict({"config": ConfigRecord(answer)}), reply_to=msg)


def register_discovery(app) -> None:
    """Register :func:`declare_clients` on a Flower ``ClientApp`` as the answer to hetfl's discovery query."""
    from .registry import NODE_QUERY

    category, _, action = NODE_QUERY.partition(".")
    getattr(app, category)(action)(declare_clients)
