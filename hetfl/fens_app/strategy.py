"""The FENS strategy (Alg. 1-2): phase 1's one-shot upload, the (INT8) ensemble download and the federated training
of the aggregator over the ensemble's logits, in one :meth:`FENS.start`; phase 2's FedAdam / FedYogi (Table 8)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from hetfl.common.comm import Traffic, take_traffic
from hetfl.common.compression import dequantize_state, quantize_state
from hetfl.common.fedopt import SeededFedAdam, SeededFedYogi
from hetfl.common.nodes import ClientMap
from hetfl.common.oneshot.ensemble import Ensemble
from hetfl.common.params import FederationParams, apply_options
from hetfl.common.progress import heartbeat
from hetfl.common.strategy import StrategyBase, validate_replies
from hetfl.common.task import model_to_arrays, pack_models

from . import LOCAL, LOGITS
from .aggregators import STATIC, Aggregator, make_aggregator
from .keys import FENSParams

log = logging.getLogger("hetfl")


class AggregatorFedAdam(SeededFedAdam):
    """FedAdam on the aggregator only; the client models stay frozen (their logits are cached on the clients).

    Default (``fedadam-update = "authors"``): the authors' step without bias correction, tau 1e-3,
    clients weighted by the samples they saw, min(n_i, batch x steps) (docs/readings.md#fens-phase2).
    """


class AggregatorFedYogi(SeededFedYogi):
    """Flower's FedYogi on the aggregator (``fens-agg-server-opt = "yogi"``; tau from ``fedadam-tau``)."""


def make_strategy(p: FENSParams, fed: FederationParams, cmap: ClientMap | None) -> AggregatorFedAdam | AggregatorFedYogi:
    """Phase 2's strategy: every client every round (nodes were awaited in phase 1), seeded by client id."""
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1,
                  eta=p.agg_server_lr, eta_l=p.agg_client_lr)
    yogi = p.agg_server_opt == "yogi"
    strategy = (AggregatorFedYogi if yogi else AggregatorFedAdam)(**common, **p.adam.options(yogi))
    return strategy.bind(cmap, fed.seed, fed.round_timeout)


class FENS(StrategyBase):
    """FENS (Alg. 1-2): every client trains the initial model once and uploads it (phase 1), the server sends the
    ensemble back (INT8 with ``quantize``), each client caches the ensemble's logits on its aggregator split, and
    FedAdam (or FedYogi) trains a small aggregator over those logits for `num_rounds` rounds.

    Construct it with keyword arguments, each a field of :class:`~hetfl.fens_app.keys.FENSParams` or
    :class:`~hetfl.common.params.FederationParams` (``FENS(num_classes=10, aggregator="nn", seed=0)``), or from hetfl's
    run config with :meth:`from_run_config`. ``start``'s `initial_arrays` is the model every client starts phase 1
    from; ``Result.arrays`` holds the M members as the clients use them (``m<j>.<name>``, dequantized) and the
    aggregator (``agg.<name>``); `evaluate_fn` gets the aggregator's arrays. Clients answer with
    :func:`~hetfl.fens_app.client_app.fens_local_train`, :func:`~hetfl.fens_app.client_app.fens_logits` and
    :func:`~hetfl.fens_app.client_app.fens_aggregator_train` (the message contract: docs/api.md#fens).

    Parameters
    ----------
    num_classes : int
        Classes of the task (the aggregator's outputs, the label counts' length).
    """

    def __init__(self, params: FENSParams | None = None, federation: FederationParams | None = None, *,
                 num_classes: int, client_map: ClientMap | None = None, **options: Any) -> None:
        self.params, self.fed = apply_options("FENS", options, params or FENSParams(), federation or FederationParams())
        self.num_classes, self.map = int(num_classes), client_map
        self.inner = make_strategy(self.params, self.fed, client_map)  # phase 2
        self.ensemble: Ensemble | None = None
        self.sent: list[dict[str, np.ndarray]] = []  # the members as downloaded (INT8 with quantize)
        self.confusion: np.ndarray | None = None  # (M, C, C) counts of each member on its client's aggregator split
        self.download = Traffic()
        self.ready: list = []  # the replies of the clients that cached the ensemble's logits
        self.aggregator: Aggregator | None = None

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any], **kwargs: Any) -> FENS:
        """The strategy of a validated hetfl run config (its ``fens-*`` keys, seed, round-timeout, the classes)."""
        from hetfl.common.rundata import num_classes

        return cls(FENSParams.from_config(cfg), FederationParams.from_config(cfg), num_classes=num_classes(dict(cfg)),
                   **kwargs)

    # --- phase 2 is the inner FedAdam / FedYogi strategy's ------------------------------------------------------

    def attach(self, cmap: ClientMap) -> None:
        super().attach(cmap)
        self.inner.map = cmap

    @property
    def sampled(self) -> list[int]:  # type: ignore[override]
        return self.inner.sampled

    @property
    def rejected(self) -> int:  # type: ignore[override]
        return self.inner.rejected

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.inner.aggregate_train(server_round, replies)

    def round_metrics(self, traffic: Any) -> dict[str, Any]:
        return self.inner.round_metrics(traffic)

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.inner.load_state_dict(state)

    def summary(self) -> None:
        log.info("FENS: a %s aggregator over the %d members' logits%s", self.params.aggregator, len(self.sent),
                 f", trained by {type(self.inner).__name__.removeprefix('Aggregator')}" if self.trains else " (static)")

    @property
    def trains(self) -> bool:
        """Whether the aggregator has parameters to train (a static one is evaluated once, round 0)."""
        return self.aggregator is not None and self.params.aggregator not in STATIC and self.aggregator.trainable

    # --- the phases ------------------------------------------------------------------------------------------------

    def collect(self, grid: Grid, initial_arrays: ArrayRecord, timeout: float, train_config: ConfigRecord | None = None,
                progress: float = 10.0) -> Ensemble:
        """Phase 1 (Sec. 3.1): every client trains `initial_arrays` once (its own random start with ``diff_init``)."""
        from hetfl.common.oneshot.server import gather_local_models

        return gather_local_models(grid, self.map, self.map.clients(), initial_arrays, LOCAL,
                                   send_init=not self.params.diff_init, num_classes=self.num_classes, timeout=timeout,
                                   progress=progress, label="FENS phase 1", train_config=train_config)

    def send_ensemble(self, grid: Grid, ens: Ensemble, timeout: float, progress: float = 10.0) -> None:
        """Phase 2's start (Sec. 3.2): the (INT8) ensemble to every client, which caches its logits on its aggregator
        split and returns its own member's confusion counts there (for voting): ``sent``, ``confusion``,
        ``download`` (its traffic) and ``ready``."""
        p, cmap, clients = self.params, self.map, self.map.clients()
        M, C = len(ens.states), self.num_classes
        member_of = {c: j for j, c in enumerate(ens.client_ids)}  # client id -> its model's index in the ensemble
        sent = [quantize_state(s) for s in ens.states] if p.quantize else ens.states
        msgs = []
        shared = pack_models(sent)  # one record for every client that receives all M models
        for c in clients:
            own = member_of.get(c, -1)
            rec = pack_models(sent, skip=own) if p.exclude_own and own >= 0 else shared
            conf = ConfigRecord({"num-models": M, "own-index": own, "quantized": p.quantize})
            msgs.append(cmap.message(c, RecordDict({"ensemble": rec, "config": conf}), LOGITS))

        def check_logits(r: Message) -> tuple[int, np.ndarray]:
            """The client's own member index (as sent) and its confusion counts on the aggregator split."""
            own = int(r.content["metrics"]["own-index"])
            if own != member_of.get(cmap.client_of(r), -1):
                raise ValueError(f"own-index {own}: this client's member is {member_of.get(cmap.client_of(r), -1)}")
            counts = r.content["confusion"]["counts"].numpy()
            if counts.shape != (C, C) or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any():
                raise ValueError(f"confusion counts of shape {counts.shape} / dtype {counts.dtype}; expected ({C}, {C}) "
                                 "non-negative integers")
            return own, counts

        log.info("FENS: sending the %d-model ensemble to %d clients (they cache its logits for the aggregator)", M,
                 len(clients))
        with heartbeat(f"FENS: ensemble download and logits on {len(clients)} clients", progress):
            replies = cmap.send_and_receive(grid, msgs, timeout)
        self.ready, _, _ = validate_replies(replies, check_logits, 0, cmap, set(clients))
        self.download = take_traffic(grid)
        self.confusion = np.zeros((M, C, C), np.int64)
        for _, (own, counts) in self.ready:
            if own >= 0:
                self.confusion[own] = counts
        self.sent = sent

    @property
    def members(self) -> list[dict[str, np.ndarray]]:
        """The members as the clients use them (dequantized with ``quantize``)."""
        return [dequantize_state(s) for s in self.sent] if self.params.quantize else list(self.sent)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int = 3, timeout: float = 3600,
              train_config: ConfigRecord | None = None, evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None, *,
              callbacks: Any = (), progress: float = 10.0, ensemble: Ensemble | None = None,
              on_ensemble: Callable[[FENS], None] | None = None) -> Result:
        """Phase 1 (unless an `ensemble` is given: a saved one, a resume), the ensemble download, then `num_rounds`
        aggregator rounds through the round loop (:meth:`~hetfl.common.strategy.StrategyBase.start`'s contract; a static aggregator: none).

        Parameters
        ----------
        ensemble : Ensemble, optional
            Start from this phase-1 result instead of training phase 1.
        on_ensemble : callable, optional
            Called with the strategy after the download, before the aggregator's rounds (``ensemble``,
            ``sent``, ``confusion``, ``aggregator`` are set): hetfl's ServerApp evaluates the members and
            the static aggregators there.
        """
        from hetfl.common.rounds import run_strategy

        self.ensure_map(grid, timeout)
        ens = ensemble if ensemble is not None else self.collect(grid, initial_arrays, timeout, train_config, progress)
        self.ensemble = ens
        self.send_ensemble(grid, ens, timeout, progress)
        p = self.params
        self.aggregator = make_aggregator(p.aggregator, len(ens.states), self.num_classes, p.aggregator_hidden,
                                          label_counts=ens.label_counts, init=p.aggregator_init, seed=self.fed.seed,
                                          confusion=self.confusion)
        if on_ensemble is not None:
            on_ensemble(self)
        result = run_strategy(self, grid, model_to_arrays(self.aggregator), num_rounds if self.trains else 0, timeout,
                              train_config, evaluate_config, evaluate_fn, callbacks, progress)
        result.arrays = ArrayRecord({**pack_models(self.members), **{f"agg.{k}": v for k, v in result.arrays.items()}})
        return result
