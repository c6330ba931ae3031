"""The SHEFL Flower strategy: M global models, cluster sampling, per-client model assignment, Eq. 2 aggregation.

The M models travel as one ArrayRecord with keys ``m<j>.<param>`` so that Flower's
``Strategy.start`` loop drives the rounds; each client receives only the models it trains
(HPCs all M, LPCs one, by :class:`PermutationSchedule`). Clients return top-k sparse
deltas; the server scales them with :func:`workload_weights` (the papers scale on the
client before top-k; the selected entries are the same for a positive scale) and adds
the weighted mean to each model. Replies that are errors or malformed are dropped and
counted, and H/L come from the replies actually received (docs/readings.md#shefl-coefficients).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from hetfl.common.compression import StateLayout
from hetfl.common.nodes import ClientMap
from hetfl.common.params import FederationParams, apply_options
from hetfl.common.strategy import StrategyBase, evaluate_fraction, check_sparse, validate_replies
from hetfl.common.task import pack_models, unpack_models

from . import TRAIN
from .keys import SHEFLParams
from .core import (
    PermutationSchedule,
    RoundPlan,
    aggregate_deltas,
    make_clusters,
    measured_classes,
    sample_from_clusters,
    topk_densities,
    workload_weights,
)

log = logging.getLogger("hetfl")


class SHEFL(StrategyBase):
    """SHEFL (Algorithm 1): M global models, HPC/LPC cluster sampling, LPC models by the permutation schedule, top-k
    sparse deltas aggregated with the workload-aware weights of Eq. 2.

    Construct it with keyword arguments, each a field of :class:`~hetfl.shefl_app.keys.SHEFLParams` or
    :class:`~hetfl.common.params.FederationParams` (``SHEFL(num_models=5, topk_density=0.05, fraction_train=0.5,
    seed=0)``), or from hetfl's run config with :meth:`from_run_config`. The arrays it trains are the M members in
    one ArrayRecord, keys ``m<j>.<name>`` (:meth:`initial_arrays` makes them from a model builder;
    :func:`~hetfl.common.task.unpack_models` splits ``Result.arrays`` again); clients answer with
    :func:`~hetfl.shefl_app.client_app.shefl_train` (the message contract: docs/api.md#shefl).

    Parameters
    ----------
    params, federation : SHEFLParams, FederationParams, optional
        Parameter objects to start from (defaults: the run config's defaults); keyword `options` replace fields.
    device_class : mapping or callable, optional
        Client id -> ``"hpc"`` | ``"lpc"`` (a dict, or a function of the client id). Without it, each client's class
        is what its node declared at discovery (node config ``device-class``); a client that declared none is an LPC.
    client_map : ClientMap, optional
        Where each client is served; ``start`` builds one by discovery when not given.
    fraction_evaluate : float
        Federated evaluation: the share of the online clients sent the M members each round (an ``evaluate``
        message; their metrics averaged by ``num-examples``); 0 (default): none, evaluation on the server.
    """

    def __init__(self, params: SHEFLParams | None = None, federation: FederationParams | None = None, *,
                 device_class: Mapping[int, str] | Callable[[int], str] | None = None,
                 client_map: ClientMap | None = None, fraction_evaluate: float = 0.0, **options: Any) -> None:
        self.fraction_evaluate, self._evaluating = evaluate_fraction("SHEFL", fraction_evaluate), []
        self.params, self.fed = apply_options("SHEFL", options, params or SHEFLParams(), federation or FederationParams())
        self.seed = self.fed.seed  # the federated evaluation's sampling
        self.M = self.params.num_models
        self.device_class = device_class
        self.map = client_map
        self.roles: dict[int, str] = {}
        self.measured_roles: dict[int, str] = {}  # the classes assigned from measured speed (attach)
        self.rng = np.random.default_rng([self.fed.seed, 0x5A])
        self.k_l, self.k_h = topk_densities(self.params.topk_density, self.params.resource_ratio, self.M)
        self.sent: dict[int, tuple[str, list[int]]] = {}  # client -> (role, models) of the current round
        self._states: list[dict[str, np.ndarray]] | None = None
        self.layout: StateLayout | None = None
        self.last_round: dict[str, Any] = {}
        if client_map is not None and client_map.hosted:
            self.attach(client_map)
        elif isinstance(device_class, Mapping):  # the clients are known: plan now (a test, a notebook)
            self._plan(dict(device_class))

    @classmethod
    def from_run_config(cls, cfg: Mapping[str, Any], **kwargs: Any) -> SHEFL:
        """The strategy of a validated hetfl run config (its ``shefl-*`` keys, seed, fraction-train, round-timeout)."""
        return cls(SHEFLParams.from_config(cfg), FederationParams.from_config(cfg), **kwargs)

    def initial_arrays(self, build: Callable[[], Any], seed: int | None = None) -> ArrayRecord:
        """The M members from a model builder, member j built after ``torch.manual_seed(seed * 1000 + j)`` (distinct
        initialisations, the same at the same seed; `seed` defaults to the strategy's), packed for :meth:`~hetfl.common.strategy.StrategyBase.start`."""
        import torch

        from hetfl.common.models import get_state

        base = self.fed.seed if seed is None else seed
        states = []
        for m in range(self.M):
            torch.manual_seed(base * 1000 + m)
            states.append(get_state(build()))
        return pack_models(states)

    def attach(self, cmap: ClientMap) -> None:
        """Plan over `cmap`'s clients: their device classes (``device_class``, else what their nodes declared, else
        from their measured speed by :func:`~hetfl.shefl_app.core.measured_classes` where nodes measured themselves,
        else LPC), then the HPC and LPC clusters and the permutation schedule (Alg. 1 lines 1-4). The classes are
        fixed for the run (SHEFL's clusters are made once)."""
        super().attach(cmap)
        clients = cmap.clients()
        declared = {c: str(r) for c, r in cmap.field("device-class").items()}
        dc = self.device_class
        speeds = {c: float(v) for c, v in cmap.field("samples-per-s").items()
                  if c not in declared and not callable(dc) and c not in (dc or {})}  # the caller's classes first
        measured = measured_classes(speeds, self.params.hpc_fraction, self.params.hpc_speed) if speeds else {}

        def role(c: int) -> str:
            if isinstance(dc, Mapping) and c in dc:
                return str(dc[c])
            return str(dc(c)) if callable(dc) else declared.get(c, measured.get(c, "lpc"))

        roles = {c: role(c) for c in clients}
        bad = sorted({r for r in roles.values() if r not in ("hpc", "lpc")})
        if bad:
            raise ValueError(f"SHEFL: device class {bad[0]!r}; allowed: 'hpc', 'lpc'")
        if not callable(dc) and (undeclared := [c for c in clients if c not in declared and c not in (dc or {})
                                                and c not in measured]):
            log.info("SHEFL: %d client(s) declared no device class: LPCs (pass device_class= to say otherwise)",
                     len(undeclared))
        rule = (f"at least {self.params.hpc_speed:g} samples/s" if self.params.hpc_speed > 0 else
                f"the fastest {self.params.hpc_fraction:g} of them")
        for c in sorted(measured):
            log.info("SHEFL: client %d measured %.1f training samples/s: %s (HPC: %s)", c, speeds[c],
                     roles[c].upper(), rule)
        self.measured_roles = {c: roles[c] for c in measured}
        self._plan(roles)
        log.info("device classes: %d HPC, %d LPC", len([r for r in roles.values() if r == "hpc"]),
                 len([r for r in roles.values() if r != "hpc"]))

    def _plan(self, roles: dict[int, str]) -> None:
        """Clusters and schedule over the clients of `roles` (client id -> hpc | lpc)."""
        self.roles = roles
        params, fed = self.params, self.fed
        hpc = sorted(c for c, r in roles.items() if r == "hpc")
        lpc = sorted(c for c, r in roles.items() if r != "hpc")
        # shefl-hpc-models = "one" (restricted Fed-Ensemble, Fig. 7): every device is scheduled as a one-model client;
        # an HPC device keeps its HPC local work (its role in the message) but trains one model at the LPC density
        self.one_model_hpcs = set(hpc) if params.hpc_models == "one" else set()
        if self.one_model_hpcs:
            hpc, lpc = [], sorted(roles)
        C = max(1, int(len(roles) * fed.fraction_train))
        self.C_h = min(params.hpc_per_round, len(hpc), C)
        self.C_l = min(C - self.C_h, len(lpc))
        if self.C_h + self.C_l == 0:
            raise ValueError("SHEFL: no client can be sampled (check shefl-hpc-per-round, fraction-train)")
        self.hpc_clusters = make_clusters(hpc, self.C_h, fed.seed)
        self.lpc_clusters = make_clusters(lpc, self.C_l, fed.seed + 1)
        self.schedule = PermutationSchedule(self.M, self.C_l, fed.seed)

    def state_dict(self) -> dict[str, Any]:
        """Sampling RNG (the schedule and clusters are functions of the seed and the clients)."""
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        self.rng.bit_generator.state = st["rng"]

    def summary(self) -> None:
        log.info(
            "SHEFL: M=%d, C_h=%d HPC clusters, C_l=%d LPC clusters, k_l=%.4f, k_h=%.4f, coefficients=%s",
            self.M, self.C_h, self.C_l, self.k_l, self.k_h, self.params.coefficients,
        )

    def plan(self, server_round: int, available: set[int] | None = None) -> RoundPlan:
        """Sample one client per cluster (among the `available` ones) and assign LPC models by the permutation schedule."""
        hpc = sample_from_clusters(self.hpc_clusters, self.rng, available)
        lpc = sample_from_clusters(self.lpc_clusters, self.rng, available)
        models = self.schedule.models_for_round(server_round).tolist() if self.C_l else []
        return RoundPlan(hpc, lpc, models)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        states = unpack_models(arrays, self.M)
        self._states = states
        self.layout = StateLayout.of(states[0])
        per_model = [ArrayRecord({k: Array(v) for k, v in st.items()}) for st in states]
        self.map.refresh(grid, self.fed.round_timeout)
        online = set(self.map.online(grid, server_round))  # connected, and available in this round (a fleet's)
        plan = self.plan(server_round, online)
        hpc_set = set(plan.hpc_nodes)
        self.sent = {}
        messages = []
        for client, models in plan.assignments(self.M).items():
            if client not in online:  # its node is gone (until a node that hosts it connects again)
                log.warning("round %d: client %d is not connected; its slot stays empty", server_round, client)
                continue
            role = "hpc" if client in hpc_set or client in self.one_model_hpcs else "lpc"
            conf = ConfigRecord({  # start's train_config, then this round's plan (the plan's keys win)
                **dict(config), "server-round": server_round, "role": role, "models": models,
                "density": self.k_h if client in hpc_set else self.k_l,
            })
            content = RecordDict({**{f"model.{m}": per_model[m] for m in models}, "config": conf})
            messages.append(self.map.message(client, content, TRAIN))
            self.sent[client] = (role, models)
        self.sampled = sorted(self.sent)
        log.info("round %d: %d HPCs train all %d models, %d LPCs train models %s",
                 server_round, len(plan.hpc_nodes), self.M, len(plan.lpc_nodes), plan.lpc_models)
        return messages

    def round_metrics(self, traffic: Any) -> dict[str, Any]:
        """H/L per model, failed/rejected, and the mean bytes a sampled HPC / LPC moved down and up."""
        per_role = {}
        for role in ("hpc", "lpc"):
            clients = [c for c, (r, _) in self.sent.items() if r == role]
            for direction, counts in (("down", traffic.down), ("up", traffic.up)):
                vals = [counts.get(c, 0) for c in clients]
                per_role[f"bytes_{direction}_{role}_mean"] = float(np.mean(vals)) if vals else 0.0
        return {**per_role, **self.last_round}

    def _deltas_of(self, reply: Message, models: list[int]) -> dict[int, np.ndarray]:
        """Decode and check every model's delta in a reply; raise ValueError if malformed."""
        assert self.layout is not None
        rec = reply.content["deltas"]
        out = {}
        for m in models:
            idx, val = check_sparse(rec, f"m{m}", self.layout.size)
            dense = np.zeros(self.layout.size, np.float32)
            dense[idx] = val
            out[m] = dense
        return out

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        assert self._states is not None and self.layout is not None
        hpc: list[list[np.ndarray]] = [[] for _ in range(self.M)]
        lpc: list[list[np.ndarray]] = [[] for _ in range(self.M)]

        def check(r: Message) -> tuple[dict[int, np.ndarray], float]:
            role, models = self.sent[self.map.client_of(r)]
            return self._deltas_of(r, models), float(r.content["metrics"]["train_loss"])

        ok, failed, self.rejected = validate_replies(replies, check, server_round, self.map, set(self.sent))
        losses = []
        for r, (deltas, loss) in ok:
            role, _ = self.sent[self.map.client_of(r)]
            for m, d in deltas.items():
                (hpc if role == "hpc" else lpc)[m].append(d)
            losses.append(loss)
        lost = len(self.sent) - len(ok) - failed - self.rejected  # no reply within the round timeout
        failed += max(0, lost)
        new_states, stats = [], {}
        for m in range(self.M):
            H, L = len(hpc[m]), len(lpc[m])
            a_h, a_l = workload_weights(H, L, self.params.coefficients, self.M, self.C_h, self.C_l)
            step = aggregate_deltas(hpc[m], lpc[m], a_h, a_l)
            st = self._states[m]
            if step is not None:
                st = self.layout.unflatten(self.layout.flatten(st) + step, st)
            new_states.append(st)
            stats[f"H_m{m}"], stats[f"L_m{m}"] = H, L
        self.last_round = {**stats, "failed": failed, "rejected": self.rejected}
        metrics = MetricRecord({"train_loss": float(np.mean(losses)) if losses else float("nan"),
                                "failed": failed, "rejected": self.rejected})
        return pack_models(new_states), metrics
