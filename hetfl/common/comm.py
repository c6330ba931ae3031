"""Communication accounting and the sparse tensor codec.

Bytes are counted from the messages themselves: Flower 1.41 serialises a Message as a
tree of inflatable objects (Message -> RecordDict -> ArrayRecord -> Array -> ArrayChunk),
and what travels between SuperLink and SuperNode is each object's deflated bytes.
:func:`message_nbytes` sums exactly those. :class:`MeteredGrid` wraps the ServerApp's
Grid and counts every message pushed (download, server -> client) and every reply pulled
(upload, client -> server), per client (per node for messages that name none), in periods that the strategies close once per round.
Each reply also names the host its ClientApp ran on (:func:`tag_host`; the Ray node's address in the Simulation
Engine): the grid takes that tag off before counting, and tallies replies per host (docs/ray-cluster.md).

The sparse codec sends a vector as values + positions. Positions are stored in the
cheapest exact form: none for a dense vector, a bitmap (1 bit per element) when the
density is above 1/32 for 32-bit or 1/16 for 16-bit indices, else uint16/uint32 indices.
"""

from __future__ import annotations

import functools
import socket
import sys
import math
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

try:  # the object tree Flower 1.41 puts on the wire
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
except ImportError:  # pragma: no cover - older/newer layouts
    get_all_nested_objects = None  # type: ignore[assignment]


CLIENT = "client"  # the ConfigRecord of a message naming the client it is for ({"client-id": int}; hetfl.common.nodes)
HOST = "host"  # the ConfigRecord of a reply naming the host its ClientApp ran on ({"host": str}); never counted


@functools.cache
def host_name() -> str:
    """The host this process runs on: its Ray node's IP address in a Ray worker (the Simulation Engine, one host or a
    cluster of several: docs/ray-cluster.md), else the machine's hostname (deployment SuperNodes, in-process grids)."""
    ray = sys.modules.get("ray")  # a ClientApp in a Ray actor has it imported and initialised; nothing else imports it
    if ray is not None and ray.is_initialized():
        return str(ray.util.get_node_ip_address())
    return socket.gethostname()


def tag_host(reply: Message) -> Message:
    """Name this host in a ClientApp's reply (the :data:`HOST` record), for :class:`MeteredGrid` to tally and remove."""
    if reply.has_content():
        reply.content[HOST] = ConfigRecord({HOST: host_name()})
    return reply


def take_host(reply: Message) -> str | None:
    """Remove a reply's :data:`HOST` record (before its bytes are counted and any strategy reads it); its host."""
    if not reply.has_content() or HOST not in reply.content:
        return None
    host = str(reply.content[HOST].get(HOST, ""))
    del reply.content[HOST]
    return host or None


def record_nbytes(obj) -> int:
    """Serialized size of a Message, RecordDict or ArrayRecord (sum of its unique deflated objects)."""
    objs = get_all_nested_objects(obj)
    return sum(len(o.deflate()) for o in objs.values())


def content_nbytes(content, cache: dict[int, tuple[object, int]]) -> int:
    """:func:`record_nbytes` of a RecordDict, each of its records serialised once per `cache` (id -> (record, bytes)).

    The RecordDict's own object (its record names and their object ids) plus each record's tree;
    equal to ``record_nbytes(content)`` unless two of its records hold identical objects.
    """
    total = len(content.deflate())
    for rec in content.values():
        if id(rec) not in cache:
            cache[id(rec)] = (rec, record_nbytes(rec))
        total += cache[id(rec)][1]
    return total


def message_nbytes(msg: Message, content_nbytes: int | None = None) -> int:
    """Bytes a Message occupies on the wire: its content's object tree plus its metadata."""
    if content_nbytes is None:
        content_nbytes = record_nbytes(msg.content) if msg.has_content() else 0
    return content_nbytes + _metadata_nbytes(msg)


_ERROR_NAMES = {v: k for k, v in vars(ErrorCode).items() if k.isupper() and isinstance(v, int)}


def error_name(code: int) -> str:
    """Flower's name for a reply's error code (``NODE_UNAVAILABLE``: the SuperLink's stand-in reply for a node that
    missed its heartbeats), or the number where Flower has none."""
    return _ERROR_NAMES.get(code, str(code))


UNATTRIBUTED = -1
"""The :class:`Traffic` key of bytes no client can be named for (an ensemble saved before per-client counts)."""


@dataclass
class Traffic:
    """Bytes and replies counted over one period (normally one round)."""

    down: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # client (or node) -> bytes sent to it
    up: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # client (or node) -> bytes received from it
    replies: int = 0
    failures: int = 0
    comm_s: float = 0.0  # wall time spent inside send_and_receive
    hosts: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # host -> replies from ClientApps there
    flops: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # client -> FLOPs its replies report
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # Flower error code name -> failures
    # client -> seconds from sending its message to its reply's arrival, as the server saw it (Flower's polling
    # included: a reply is seen at the first pull after it came, every `pull_interval` s; 3 s on a SuperLink)
    reply_s: dict[int, float] = field(default_factory=lambda: defaultdict(float))
    train_s: dict[int, float] = field(default_factory=lambda: defaultdict(float))  # client -> training s it reported

    def add(self, other: Traffic) -> Traffic:
        """Fold another period into this one (e.g. several phases reported as one round)."""
        for mine, theirs in ((self.down, other.down), (self.up, other.up), (self.hosts, other.hosts),
                             (self.flops, other.flops), (self.errors, other.errors), (self.reply_s, other.reply_s),
                             (self.train_s, other.train_s)):
            for node, b in theirs.items():
                mine[node] = mine.get(node, 0) + b
        self.replies += other.replies
        self.failures += other.failures
        self.comm_s += other.comm_s
        return self

    @property
    def bytes_down(self) -> int:
        return sum(self.down.values())

    @property
    def bytes_up(self) -> int:
        return sum(self.up.values())


class MeteredGrid(Grid):
    """A Grid that forwards everything to `inner` and counts message bytes per node.

    Counts accumulate in the current :class:`Traffic` period until :meth:`take` closes
    it (the strategies call it once per round, from their evaluation hook).
    """

    def __init__(self, inner: Grid) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.current = Traffic()
        self.history: list[Traffic] = []

    def take(self) -> Traffic:
        """Close the current period and return its traffic."""
        with self._lock:
            t, self.current = self.current, Traffic()
            self.history.append(t)
        return t

    def total_bytes(self) -> tuple[int, int]:
        """(download, upload) bytes of the whole run so far."""
        periods = self.history + [self.current]
        return sum(t.bytes_down for t in periods), sum(t.bytes_up for t in periods)

    def _count_down(self, messages: list[Message]) -> None:
        # Strategies send the same records (the global model) to many clients, each message with its own
        # small per-client record: serialise each distinct record once.
        cache: dict[int, tuple[object, int]] = {}  # id -> (record kept alive, bytes)
        for m in messages:
            nbytes = message_nbytes(m, content_nbytes(m.content, cache) if m.has_content() else 0)
            with self._lock:
                self.current.down[_client_or_node(m, m.metadata.dst_node_id)] += nbytes

    def _count_up(self, replies: list[Message], sent: dict[str, Message] | None = None,
                  seconds: dict[str, float] | None = None) -> None:
        for r in replies:
            host = take_host(r)  # the host tag is bookkeeping, not the method's traffic: off before counting
            nbytes = message_nbytes(r)
            to = (sent or {}).get(r.metadata.reply_to_message_id)
            with self._lock:
                if host is not None:
                    self.current.hosts[host] += 1
                self.current.up[_client_or_node(to, r.metadata.src_node_id)] += nbytes
                if r.has_error():
                    self.current.failures += 1
                    self.current.errors[error_name(r.error.code)] += 1
                else:
                    self.current.replies += 1
                    flops = reported_flops(r)
                    if flops:
                        self.current.flops[_client_or_node(to, r.metadata.src_node_id)] += flops
                    if seconds and r.metadata.reply_to_message_id in seconds and to is not None:
                        who = _client_or_node(to, r.metadata.src_node_id)
                        self.current.reply_s[who] += seconds[r.metadata.reply_to_message_id]
                        self.current.train_s[who] += reported_train_s(r)

    # --- Grid API (forwarded) -------------------------------------------------------
    def set_run(self, run):  # noqa: D102
        return self._inner.set_run(run)

    @property
    def run(self):  # noqa: D102
        return self._inner.run

    def create_message(self, *args, **kwargs) -> Message:  # noqa: D102
        return self._inner.create_message(*args, **kwargs)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102
        return self._inner.get_node_ids()

    def get_nodes(self):  # noqa: D102
        return self._inner.get_nodes()

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # noqa: D102
        messages = list(messages)
        self._count_down(messages)
        return self._inner.push_messages(messages)

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        replies = list(self._inner.pull_messages(message_ids))
        self._count_up(replies)
        return replies

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Flower's ``send_and_receive``, counting bytes and keeping when each reply was seen (:class:`Traffic`'s
        ``reply_s``)."""
        messages = list(messages)
        self._count_down(messages)
        t0 = time.perf_counter()
        if hasattr(self._inner, "push_messages") and hasattr(self._inner, "pull_messages"):
            replies, seconds = self._push_and_pull(messages, timeout, t0)
        else:  # a grid of one's own: every reply is seen when the call returns
            replies = list(self._inner.send_and_receive(messages, timeout=timeout))
            seconds = dict.fromkeys((r.metadata.reply_to_message_id for r in replies), time.perf_counter() - t0)
        self.current.comm_s += time.perf_counter() - t0
        self._count_up(replies, {m.metadata.message_id: m for m in messages}, seconds)  # pushing gave each its id
        return replies

    def _push_and_pull(self, messages: list[Message], timeout: float | None, t0: float
                       ) -> tuple[list[Message], dict[str, float]]:
        """Flower 1.41's ``Grid.send_and_receive`` loop (push all, then pull every ``pull_interval`` s, 3 s on a
        SuperLink, until every message is answered or `timeout` passes), noting the seconds since `t0` at which
        each reply was pulled."""
        ids = set(self._inner.push_messages(messages))
        interval = float(getattr(self._inner, "pull_interval", FLOWER_PULL_S))
        end = time.time() + (timeout if timeout is not None else 0.0)
        replies: list[Message] = []
        seconds: dict[str, float] = {}
        while timeout is None or time.time() < end:
            got = list(self._inner.pull_messages(ids))
            now = time.perf_counter() - t0
            for r in got:
                seconds[r.metadata.reply_to_message_id] = now
            replies.extend(got)
            ids.difference_update(r.metadata.reply_to_message_id for r in got)
            if not ids:
                break
            time.sleep(interval)
        return replies, seconds

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


FLOP_METRICS = ("train_flops", "infer_flops")
"""Reply metrics in which a client reports the floating-point operations it computed for the message
(:func:`~hetfl.common.costs.step_flops`: training steps, and the inference of FENS's ensemble logits)."""


FLOWER_PULL_S = 3.0
"""Seconds between two pulls of Flower 1.41's Grid on a SuperLink (``Grid.send_and_receive``)."""


def reported_train_s(reply: Message) -> float:
    """The training seconds a reply reports (``train_s`` of its ``metrics`` record; 0 where it reports none)."""
    if not reply.has_content() or "metrics" not in reply.content:
        return 0.0
    v = reply.content["metrics"].get("train_s", 0.0)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0 else 0.0


def take_traffic(grid) -> Traffic:
    """The traffic of the period `grid` closes now (:meth:`MeteredGrid.take`); an empty one for a grid that counts
    nothing (a Flower Grid of one's own)."""
    return grid.take() if hasattr(grid, "take") else Traffic()


def reported_flops(reply: Message) -> int:
    """The FLOPs a reply reports in its ``metrics`` record (:data:`FLOP_METRICS`; 0 where it reports none)."""
    if not reply.has_content() or "metrics" not in reply.content:
        return 0
    metrics = reply.content["metrics"]
    values = [metrics[k] for k in FLOP_METRICS if k in metrics]
    # a malformed report (a list, NaN, a negative number) counts nothing: the reply's own checks judge the reply
    ok = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v >= 0]
    return int(sum(ok))


def _client_or_node(m: Message | None, node: int) -> int:
    """The key bytes are counted under: the client a message names (its :data:`CLIENT` record), else the node."""
    if m is not None and m.has_content() and CLIENT in m.content:
        return int(m.content[CLIENT]["client-id"])
    return int(node)


def _metadata_nbytes(m: Message) -> int:
    """Approximate size of a message's metadata (ids, type, group) - tens of bytes."""
    md = m.metadata
    return 64 + len(md.message_type) + len(md.group_id)


# ---------------------------------------------------------------------------
# Sparse codec: values + positions
# ---------------------------------------------------------------------------

_BITMAP, _U16, _U32, _DENSE = 0, 1, 2, 3


def encode_sparse(indices: np.ndarray, values: np.ndarray, size: int) -> dict[str, np.ndarray]:
    """Encode the sparse vector (indices, values) of length `size` as arrays: values + positions.

    Indices must be unique. The positions use whichever exact format is smallest:
    a bitmap (size/8 bytes), uint16 (2 bytes each, size <= 65536) or uint32 indices.
    Values are stored in ascending index order.
    """
    indices = np.asarray(indices, dtype=np.int64)
    values = np.asarray(values, dtype=np.float32)
    if indices.shape != values.shape or indices.ndim != 1:
        raise ValueError("indices and values must be 1-D arrays of equal length")
    if size < 0 or (len(indices) and (indices.min() < 0 or indices.max() >= size)):
        raise ValueError(f"indices out of range [0, {size})")
    order = np.argsort(indices, kind="stable")
    indices, values = indices[order], values[order]
    if len(indices) > 1 and np.any(np.diff(indices) == 0):
        raise ValueError("indices must be unique")
    k = len(indices)
    if k == size:  # every position present: no positions to send
        return {"val": values, "pos": np.zeros(0, np.uint8), "hdr": np.array([size, _DENSE], dtype=np.int64)}
    costs = {_BITMAP: (size + 7) // 8, _U32: 4 * k}
    if size <= 1 << 16:
        costs[_U16] = 2 * k
    scheme = min(costs, key=lambda s: (costs[s], s))
    if scheme == _BITMAP:
        mask = np.zeros(size, dtype=bool)
        mask[indices] = True
        pos = np.packbits(mask)
    elif scheme == _U16:
        pos = indices.astype(np.uint16)
    else:
        pos = indices.astype(np.uint32)
    return {"val": values, "pos": pos, "hdr": np.array([size, scheme], dtype=np.int64)}


def decode_sparse(enc: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, int]:
    """Inverse of :func:`encode_sparse`: (indices int64 ascending, values float32, size)."""
    size, scheme = (int(v) for v in enc["hdr"])
    values = np.asarray(enc["val"], dtype=np.float32)
    if scheme == _BITMAP:
        mask = np.unpackbits(np.asarray(enc["pos"], dtype=np.uint8), count=size).astype(bool)
        indices = np.flatnonzero(mask)
    elif scheme in (_U16, _U32):
        indices = np.asarray(enc["pos"]).astype(np.int64)
    elif scheme == _DENSE:
        indices = np.arange(size, dtype=np.int64)
    else:
        raise ValueError(f"unknown sparse scheme {scheme}")
    if len(indices) != len(values):
        raise ValueError(f"sparse payload corrupt: {len(indices)} positions for {len(values)} values")
    if len(indices) and (indices.min() < 0 or indices.max() >= size):
        raise ValueError(f"sparse payload corrupt: index out of range [0, {size})")
    return indices, values, size


def densify(enc: dict[str, np.ndarray]) -> np.ndarray:
    """Decode to a dense float32 vector."""
    indices, values, size = decode_sparse(enc)
    out = np.zeros(size, dtype=np.float32)
    out[indices] = values
    return out


def put_sparse(record: ArrayRecord, prefix: str, enc: dict[str, np.ndarray]) -> None:
    """Store an encoded sparse vector in an ArrayRecord under `prefix.val/.pos/.hdr`."""
    for k, v in enc.items():
        record[f"{prefix}.{k}"] = Array(np.ascontiguousarray(v))


def get_sparse(record: ArrayRecord, prefix: str) -> dict[str, np.ndarray]:
    """Read an encoded sparse vector stored by :func:`put_sparse`."""
    try:
        return {k: record[f"{prefix}.{k}"].numpy() for k in ("val", "pos", "hdr")}
    except KeyError as err:
        raise ValueError(f"sparse payload '{prefix}' incomplete: missing {err}") from err

