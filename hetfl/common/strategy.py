"""The strategy contract every method keeps, and the one reply validator (docs/architecture.md).

:class:`StrategyBase` is the base of every Strategy here (SHEFL, AdaptiveFL, and through
:class:`SeededSampling` Flower's FedAvg/FedProx/FedAdam): checkpoint state
(``state_dict`` / ``load_state_dict``, saved by :mod:`hetfl.common.rounds`), the client ids it
sent work to this round (``sampled``, written to metrics.json), and the count of rejected
replies. Every ``aggregate_train`` validates each reply with :func:`validate_replies` and the
checks below (finite arrays, expected keys, shapes and dtypes, sparse positions in range, and for
Flower's aggregation one array and one metric record named alike in every reply) before anything
is applied; a malformed reply is logged, counted and dropped, never aggregated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.exception import InconsistentMessageReplies
from flwr.serverapp.strategy import FedAvg, Result, Strategy

from .comm import decode_sparse, get_sparse
from .params import FederationParams, MethodParams, NoParams
from .nodes import EVALUATE_SALT, TRAIN_SALT, ClientMap, error_line, map_clients, sample_clients

log = logging.getLogger("hetfl")


class _CentralEvaluationOnly(logging.Filter):
    """Drops Flower's "fraction_evaluate is set to 0.0" warning: every method here evaluates on the server, by design."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("fraction_evaluate is set to 0.0")


logging.getLogger("flwr").addFilter(_CentralEvaluationOnly())
T = TypeVar("T")


# --- the one reply validator ------------------------------------------------------------------


def check_arrays(record: ArrayRecord, expected: Mapping[str, tuple[int, ...]],
                 dtypes: Mapping[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The record's arrays as NumPy if its keys and shapes are exactly `expected` and floats are finite.

    Parameters
    ----------
    dtypes : mapping, optional
        Key -> the dtype the array must have (that of the global model's array). Without it, any
        numeric dtype passes.

    Raises
    ------
    ValueError
        Naming the first key that is missing, unexpected, of the wrong shape or dtype, or holds NaN/inf.
    """
    got = set(record.keys())
    if got != set(expected):
        missing, extra = sorted(set(expected) - got), sorted(got - set(expected))
        raise ValueError(f"array keys differ from the expected ones (missing {missing[:3]}, unexpected {extra[:3]})")
    out = {}
    for k, shape in expected.items():
        a = record[k].numpy()
        if tuple(a.shape) != tuple(shape):
            raise ValueError(f"'{k}' has shape {tuple(a.shape)}, expected {tuple(shape)}")
        if dtypes is not None and a.dtype != np.dtype(dtypes[k]):
            raise ValueError(f"'{k}' has dtype {a.dtype}, expected {np.dtype(dtypes[k])}")
        if a.dtype.kind not in "biuf":
            raise ValueError(f"'{k}' has non-numeric dtype {a.dtype}")
        if np.issubdtype(a.dtype, np.floating) and not np.all(np.isfinite(a)):
            raise ValueError(f"'{k}' has NaN/inf")
        out[k] = a
    return out


def as_dtype(a: np.ndarray, dtype: Any) -> np.ndarray:
    """`a` as `dtype`, rounded first when that is an integer type (an averaged BatchNorm step counter)."""
    dtype = np.dtype(dtype)
    return np.asarray((np.rint(a) if dtype.kind in "iu" and a.dtype.kind == "f" else a).astype(dtype, copy=False))


def weighted_mean(states: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """Data-size-weighted mean of model states (FedAvg): sum_i w_i state_i / sum_i w_i in float64, then each array's
    dtype (integer buffers rounded, :func:`as_dtype`). FedBE's mean and FENS's one-shot FedAvg."""
    w = np.asarray(weights, np.float64) / float(np.sum(weights))
    return {k: as_dtype(sum(wi * np.asarray(s[k], np.float64) for wi, s in zip(w, states, strict=True)), np.asarray(ref).dtype)
            for k, ref in states[0].items()}


def check_sparse(record: ArrayRecord, prefix: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(positions, values) of a sparse vector of length `size` stored under `prefix`; ValueError if malformed.

    :func:`~hetfl.common.comm.decode_sparse` checks that positions are in range and match the values.
    """
    enc = get_sparse(record, prefix)
    if not np.issubdtype(np.asarray(enc["val"]).dtype, np.floating):
        raise ValueError(f"'{prefix}': values of dtype {np.asarray(enc['val']).dtype}, expected floats")
    idx, val, got = decode_sparse(enc)
    if got != size:
        raise ValueError(f"'{prefix}': sparse vector of length {got}, expected {size}")
    if not np.all(np.isfinite(val)):
        raise ValueError(f"'{prefix}': values have NaN/inf")
    return idx, val


def check_weight(value: Any, name: str = "num-examples") -> float:
    """A non-negative finite aggregation weight."""
    w = float(value)
    if not np.isfinite(w) or w < 0:
        raise ValueError(f"{name} = {value!r}; expected a finite number >= 0")
    return w


def single_array_record(reply: Message) -> ArrayRecord:
    """The one ArrayRecord of a FedAvg-style reply."""
    recs = [v for v in reply.content.values() if isinstance(v, ArrayRecord)]
    if len(recs) != 1:
        raise ValueError(f"expected one ArrayRecord, got {len(recs)}")
    return recs[0]


def validate_replies(replies: Iterable[Message], check: Callable[[Message], T], server_round: int,
                     cmap: ClientMap | None = None, sent: Collection[int] | None = None,
                     ) -> tuple[list[tuple[Message, T]], int, int]:
    """Apply `check` to every reply: ([(reply, check(reply)) that passed], #error replies, #rejected).

    The one reply check of every strategy (docs/architecture.md#the-strategy-contract). A reply is
    counted as failed when it is an error reply (its error is logged in one line, naming the client
    and node), and rejected with a warning when `check` raises ValueError, KeyError or TypeError,
    or, given `cmap` and `sent`, when it answers no message of this round (a client that was not
    sent work) or is a second reply from the same client.
    """
    ok: list[tuple[Message, T]] = []
    failed = rejected = 0
    seen: set[int] = set()
    for r in replies:
        node = r.metadata.src_node_id
        client = cmap.client_of(r) if cmap is not None else None
        who = f"client {client} (node {node})" if client is not None else f"node {node}"
        if r.has_error():
            failed += 1
            log.warning("round %d: %s failed: %s", server_round, who, error_line(r))
            continue
        try:
            if sent is not None:
                if client is None or client not in sent:
                    raise ValueError("a reply to no message of this round (that client was not sent work)")
                if client in seen:
                    raise ValueError("a second reply from the same client")
                seen.add(client)
            ok.append((r, check(r)))
        except (ValueError, KeyError, TypeError) as err:
            rejected += 1
            log.warning("round %d: rejected update from %s: %s", server_round, who, err)
    return ok, failed, rejected


# --- the contract -------------------------------------------------------------------------------


class StrategyBase(Strategy):
    """What every method's Strategy provides besides Flower's interface.

    Attributes
    ----------
    map : ClientMap
        The one client-to-node map (:mod:`hetfl.common.nodes`): plans name client ids, and only
        :meth:`~hetfl.common.nodes.ClientMap.message` / :meth:`~hetfl.common.nodes.ClientMap.send_and_receive` touch node ids.
    sampled : list of int
        Client ids sent a train message in the current round (recorded per round in metrics.json).
    rejected : int
        Malformed replies dropped in the latest ``aggregate_train``.
    """

    map: ClientMap | None = None
    _attached: ClientMap | None = None  # the map attach() last planned over
    sampled: list[int] = []  # reassigned every round, never mutated
    rejected: int = 0

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None, *,
              callbacks: Sequence[Any] = (), progress: float = 10.0) -> Result:
        """Run the method for `num_rounds` rounds on any Flower Grid; Flower 1.41's ``Strategy.start`` (the same
        parameters, types and ``Result``), with this project's round loop (:func:`hetfl.common.rounds.run_strategy`).

        Differences from Flower's loop, each the method's contract: replies are matched to the messages this round
        sent (by ``reply_to_message_id``), at most one message is in flight per node, and a run in which no client
        update is accepted raises :class:`~hetfl.common.results.NoClientSucceeded` instead of returning the untrained
        arrays. Without a client map (none given at construction) it is built here (:func:`~hetfl.common.nodes.map_clients`): nodes that
        answer hetfl's discovery query declare their clients; any other node is one client.

        Parameters
        ----------
        train_config : ConfigRecord, optional
            Sent to every sampled client in its train message (its ``config`` record, with ``server-round``).
        callbacks : sequence of RoundCallback
            Jobs of the round loop (:class:`hetfl.common.rounds.RoundCallback`): evaluation and metrics.json,
            checkpoints and the resume from one, the idle stop; called in the order given.
        progress : float
            Seconds between two "still running" lines while a round trains.
        """
        from .rounds import run_strategy

        self.ensure_map(grid, timeout)
        return run_strategy(self, grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config,
                            evaluate_fn, callbacks, progress)

    def ensure_map(self, grid: Grid, timeout: float) -> ClientMap:
        """The client map, built by discovery where none was given (:func:`~hetfl.common.nodes.map_clients`), and
        :meth:`attach` called once for it."""
        if self.map is None or not (self.map.node or self.map.asked):  # no map, or one that never asked a node
            self.map = map_clients(grid, timeout, min_nodes=max(1, int(getattr(self, "min_available_nodes", 1))),
                                   query_timeout=min(timeout, 60.0))
        if self._attached is not self.map:
            self.attach(self.map)
        return self.map

    def attach(self, cmap: ClientMap) -> None:
        """Serve the clients of `cmap` (``start`` calls it once the map is built); a strategy that plans over its
        clients (SHEFL's clusters) does that here. Default: keep the map."""
        self.map = self._attached = cmap

    def order_replies(self, replies: Iterable[Message]) -> list[Message]:
        """Replies in client-id order (errors last): arrival order is timing and node ids are random per run,
        so float sums in aggregation would otherwise differ between runs with the same seed."""
        far = 1 << 62

        def key(r: Message) -> tuple:
            client = self.map.client_of(r)
            return r.has_error(), far if client is None else client, r.metadata.src_node_id

        return sorted(replies, key=key)

    def round_metrics(self, traffic: Any) -> dict[str, Any]:
        """The strategy's own columns of the round's row in metrics.json (`traffic`: the round's Traffic)."""
        return {}

    def summary(self) -> None:
        """Log what the strategy will do, once before round 1 (default: nothing)."""

    def prepare(self, cfg: dict[str, Any], run_dir: Any) -> StrategyBase:
        """What the strategy needs from the run on the server before round 1 (its directory, a server data set);
        returns self (default: nothing)."""
        return self

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue identically (default: nothing)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""

    seed: int = 0  # seeds the client sampling, with the round and a stream's salt
    fraction_evaluate: float = 0.0  # federated evaluation: the share of the online clients asked each round (0: none)
    min_evaluate_nodes: int = 1  # at least this many of them (Flower's name)
    arrayrecord_key, configrecord_key = "arrays", "config"  # the evaluate message's records (Flower's names)
    _evaluating: list[int] = []  # the clients sent an evaluate message this round (reassigned, never mutated)

    def _sample(self, grid: Grid, server_round: int, fraction: float, minimum: int, salt: int = TRAIN_SALT) -> list[int]:
        """Flower's count, ``max(int(n * fraction), minimum)`` of the n online clients, drawn by client id."""
        online = self.map.online(grid, server_round)
        return sample_clients(online, max(int(len(online) * fraction), minimum), self.seed, server_round, salt)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Federated evaluation where ``fraction_evaluate`` > 0: ``max(int(n * fraction), min_evaluate_nodes)`` of the n
        online clients, sampled by client id from a seeded stream of their own, each sent an ``evaluate`` message with
        the global ``arrays`` (the method's packing: SHEFL's M members, AdaptiveFL's full model) and ``config``
        (start's ``evaluate_config`` and ``server-round``). None at 0: hetfl's runs evaluate on the server."""
        if not self.fraction_evaluate or self.map is None:
            return []
        self._evaluating = self._sample(grid, server_round, self.fraction_evaluate, self.min_evaluate_nodes, EVALUATE_SALT)
        content = RecordDict({self.arrayrecord_key: arrays,
                              self.configrecord_key: ConfigRecord({**dict(config), "server-round": server_round})})
        return [self.map.message(c, content, MessageType.EVALUATE) for c in self._evaluating]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The clients' metrics averaged, weighted by their ``num-examples`` (Flower's rule), over the replies that
        answer this round's evaluate messages with one MetricRecord of finite numbers; None if none did."""
        def check(r: Message) -> dict[str, float]:
            recs = [v for v in r.content.values() if isinstance(v, MetricRecord)]
            if len(recs) != 1:
                raise ValueError(f"expected one MetricRecord, got {len(recs)}")
            values = {k: float(v) for k, v in recs[0].items() if isinstance(v, (int, float))}
            check_weight(values.get("num-examples", -1))
            if not all(np.isfinite(list(values.values()))):
                raise ValueError("a metric is NaN/inf")
            return values

        ok, _, _ = validate_replies(replies, check, server_round, self.map, set(self._evaluating))
        total = sum(m["num-examples"] for _, m in ok)
        if not ok or total <= 0:
            return None
        keys = [k for k in ok[0][1] if k != "num-examples" and all(k in m for _, m in ok)]
        return MetricRecord({"num-examples": total,
                             **{k: sum(m[k] * m["num-examples"] for _, m in ok) / total for k in keys}})


def evaluate_fraction(owner: str, fraction: float) -> float:
    """A strategy's ``fraction_evaluate``, checked: a float in [0, 1] (ValueError in one line naming `owner`)."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"{owner}: fraction_evaluate={fraction!r} is not allowed; expected a float in [0, 1]")
    return float(fraction)


def seeded_init(flower: type) -> Callable[..., None]:
    """The constructor of a :class:`SeededSampling` subclass whose Flower base comes first in its bases
    (``class SeededFedProx(FedProx, SeededSampling): __init__ = seeded_init(FedProx)``): Flower's arguments, then
    the keyword-only `seed`, `client_map` and `timeout`."""

    def __init__(self, *, seed: int = 0, client_map: ClientMap | None = None, timeout: float = 600.0,
                 **kwargs: Any) -> None:
        flower.__init__(self, **kwargs)
        self.bind(client_map, seed, timeout)

    __init__.__doc__ = f"Flower's {flower.__name__} arguments, and the keyword-only seed, client_map and timeout."
    return __init__


class SeededSampling(FedAvg, StrategyBase):
    """Flower's FedAvg family with clients sampled by client id from a seeded generator, and validated replies.

    Flower's ``FedAvg.configure_train`` samples node ids with Python's ``random``; node ids are
    random per run, so the same seed gave other clients. Here a round's clients are
    :func:`~hetfl.common.nodes.sample_clients` of the online client ids (same count as
    Flower's: ``max(int(n * fraction_train), min_train_nodes)``, n counted in clients);
    aggregation is Flower's. Use it as the last base before ``FedAvg``:
    ``class SeededFedProx(FedProx, SeededSampling)``.

    Construct it with Flower's arguments and the keyword-only `seed` (of the client sampling), `client_map` (built
    by ``start`` when not given) and `timeout` (the query of nodes that connect later), or from hetfl's run config
    with :meth:`from_run_config`. A subclass whose Flower base comes first (FedProx, FedAdam) takes the same
    keywords through :func:`seeded_init`.
    """

    params_class: ClassVar[type[MethodParams]] = NoParams  # the method's parameters (from_run_config reads them)

    __init__ = seeded_init(FedAvg)

    @classmethod
    def from_params(cls, params: MethodParams, federation: FederationParams, **kwargs: Any) -> SeededSampling:
        """The strategy for a method's parameters and the federation's (fraction-train, seed, round-timeout),
        evaluating on the server only; `kwargs` go to the constructor (``client_map``)."""
        return cls(fraction_train=federation.fraction_train, fraction_evaluate=0.0, min_train_nodes=1,
                   # the ServerApp waits for min-available-nodes once before round 1; afterwards a round goes on with
                   # whoever is connected (Flower would otherwise block forever when a node dies)
                   min_available_nodes=1, seed=federation.seed, timeout=federation.round_timeout,
                   **cls.options(params), **kwargs)

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any], **kwargs: Any) -> SeededSampling:
        """The strategy of a validated hetfl run config (its method's keys, fraction-train, seed, round-timeout)."""
        return cls.from_params(cls.params_class.from_config(cfg), FederationParams.from_config(cfg), **kwargs)

    @staticmethod
    def options(params: MethodParams) -> dict[str, Any]:
        """Flower's constructor arguments that the method's parameters set (FedProx: ``proximal_mu``)."""
        return {}

    timeout: float = 600.0  # bounds the discovery of nodes that connect later (bind)
    accepted: list[Message] = []  # the replies the latest aggregate_train aggregated (reassigned, never mutated)
    _reference: dict[str, tuple[int, ...]] | None = None
    _dtypes: dict[str, np.dtype] | None = None
    train_metrics: dict[str, float] = {}  # of the latest aggregate_train (reassigned, never mutated)
    train_type: str = MessageType.TRAIN  # message type of the train messages (a method with its own handler: its own)

    def client_records(self, client: int) -> dict[str, Any]:
        """Records a client's train message carries besides the global arrays and config (default: none)."""
        return {}

    def check_reply(self, reply: Message) -> None:
        """A method's own checks of one reply, after the common ones (raise ValueError to reject it)."""

    def summary(self) -> None:
        """One line instead of Flower's banner, whose "Minimum available nodes: 1" is the per-round minimum (the run
        waits once for min-available-nodes before round 1, then a round goes on with whoever is connected)."""
        log.info("%s: a fraction %g of the online clients per round (at least %d), sampled by client id; weighted by '%s'; "
                 "evaluation on the server", type(self).__name__.removeprefix("Seeded"), self.fraction_train,
                 self.min_train_nodes, self.weighted_by_key)

    def bind(self, cmap: ClientMap | None, seed: int, timeout: float = 600.0) -> SeededSampling:
        """Sample from the clients of `cmap` with the run's `seed`; returns self.

        `timeout` bounds the query of nodes that connect later (a restarted SuperNode has a new node id).
        """
        self.map, self.seed, self.timeout, self.sampled = cmap, seed, timeout, []
        return self

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Sample clients by id (seeded by seed and round) and send each the global arrays."""
        if self.map is None:
            raise RuntimeError("SeededSampling: call bind(client_map, seed) before the first round")
        if self.fraction_train == 0.0:
            return []
        self.map.refresh(grid, self.timeout)
        self.sampled = self._sample(grid, server_round, self.fraction_train, self.min_train_nodes)
        self._reference = {k: tuple(v.shape) for k, v in arrays.items()}
        self._dtypes = {k: np.dtype(v.dtype) for k, v in arrays.items()}
        config["server-round"] = server_round
        shared = {self.arrayrecord_key: arrays, self.configrecord_key: config}
        log.info("round %d: sampled clients %s", server_round, self.sampled)
        return [self.map.message(c, RecordDict({**shared, **self.client_records(c)}), self.train_type)
                for c in self.sampled]

    # sampled by client id, sent through the client map (not Flower's node-id sampling); Flower's aggregate_evaluate
    configure_evaluate = StrategyBase.configure_evaluate

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Drop malformed replies (keys/shapes of the global model, finite values), then Flower's aggregation."""
        replies = list(replies)
        reference = self._reference or {}

        layout: list[tuple] = []  # (array record name, metric record name, metric keys) of the first good reply

        def check(r: Message) -> None:
            arrays = [k for k, v in r.content.items() if isinstance(v, ArrayRecord)]
            metrics = [k for k, v in r.content.items() if isinstance(v, MetricRecord)]
            if len(arrays) != 1 or len(metrics) != 1:
                raise ValueError(f"expected one ArrayRecord and one MetricRecord, got {arrays} and {metrics}")
            check_arrays(r.content[arrays[0]], reference, self._dtypes)
            check_weight(r.content[metrics[0]][self.weighted_by_key])
            self.check_reply(r)
            shape = (arrays[0], metrics[0], sorted(r.content[metrics[0]].keys()))
            if layout and shape != layout[0]:  # Flower's aggregation needs the same records and metric keys in all
                raise ValueError(f"records/metric keys {shape} differ from the other replies' {layout[0]}")
            layout[:] = [shape]

        ok, _, self.rejected = validate_replies(replies, check, server_round, self.map, set(self.sampled))
        # a client without data (more clients than samples) trains nothing and weighs 0: it changes no average
        self.accepted = [r for r, _ in ok if float(r.content["metrics"][self.weighted_by_key]) > 0]
        if not self.accepted:
            self.train_metrics = {}
            return None, None  # nothing to average: the global model stays
        errors = [r for r in replies if r.has_error()]  # Flower counts them itself
        try:
            new, metrics = super().aggregate_train(server_round, self.accepted + errors)
        except InconsistentMessageReplies as err:  # a safety net: the check above should leave nothing for it
            log.warning("round %d: replies rejected by Flower's aggregation: %s", server_round, err)
            self.rejected += len(self.accepted)
            self.accepted, self.train_metrics = [], {}
            return None, None
        if new is not None and self._dtypes:  # Flower averages int buffers (num_batches_tracked) into float64
            new = ArrayRecord({k: Array(as_dtype(v.numpy(), self._dtypes[k])) for k, v in new.items()})
        self.train_metrics = {f"client_{k}": float(v) for k, v in (metrics or {}).items() if k != self.weighted_by_key}
        return new, metrics

    def round_metrics(self, traffic: Any) -> dict[str, Any]:
        """The clients' weighted-average train metrics of the round (``client_train_loss``, ...)."""
        out, self.train_metrics = self.train_metrics, {}
        return out
