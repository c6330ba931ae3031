"""The baselines' strategies: Flower's FedAvg/FedProx with seeded sampling, and FedBE (FedAdam: hetfl.common.fedopt)."""

from __future__ import annotations

from collections.abc import Iterable

from pathlib import Path

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedProx

from hetfl.common.clientstore import ClientStateStore
from hetfl.common.comm import get_sparse
from hetfl.common.compression import StateLayout, topk_count
from hetfl.common.models import get_state
from hetfl.common.params import MethodParams, NoParams
from hetfl.common.strategy import (
    SeededSampling,
    seeded_init,
    as_dtype,
    check_arrays,
    check_sparse,
    check_weight,
    single_array_record,
    validate_replies,
)

from . import TRAIN_SCAFFOLD, TRAIN_STC
from .core import (
    CONTROL,
    CONTROL_OWN,
    SCAFFOLD,
    STC_PREFIX,
    STC_UPDATE,
    apply_delta,
    data_weights,
    fednova_direction,
    fednova_normalizer,
    fednova_step,
    scaffold_model,
    scaffold_server_control,
    stc_decode,
    weighted_mean,
)
from .fedbe import fedbe_round
from .params import FedBEParams, FedNovaParams, FedProxParams, ScaffoldParams, STCParams


class SeededFedAvg(SeededSampling):
    """Flower's FedAvg (McMahan et al. 2017) with seeded sampling by client id and validated replies."""


class SeededFedProx(FedProx, SeededSampling):
    """Flower's FedProx (Li et al. 2020; mu travels in the train config) with seeded sampling by client id."""

    __init__ = seeded_init(FedProx)
    params_class = FedProxParams

    @staticmethod
    def options(params: FedProxParams) -> dict:
        """Flower's ``proximal_mu``."""
        return {"proximal_mu": params.mu}


class SeededFedBE(SeededSampling):
    """FedBE (Chen and Chao, ICLR 2021): Flower's FedAvg with seeded sampling, then the Bayesian ensemble of the
    round's client models distilled into the FedAvg mean on the server's unlabeled set (:mod:`hetfl.baselines.fedbe`).

    Its server set comes with :meth:`prepare` (hetfl's run) or :meth:`setup`. docs/readings.md#fedbe
    """

    params_class = FedBEParams

    def prepare(self, cfg: dict, run_dir: Path) -> SeededFedBE:
        """FedBE's server side: the held-out unlabeled images (never their labels) and the distillation settings."""
        from hetfl.common.task import compute_options, make_model
        from hetfl.common.train import Normalizer

        from .fedbe import server_inputs
        from .params import FedBEParams

        p = FedBEParams.from_config(cfg)
        held, opts = server_inputs(cfg, p)
        return self.setup(lambda: make_model(cfg), held.x, Normalizer(cfg["dataset"]), p.samples, opts,
                          compute_options(cfg, server=True))

    def setup(self, make_model, unlabeled_x: np.ndarray, normalize, samples: int, opts, compute: dict) -> SeededFedBE:
        """`make_model()` builds an empty global-model architecture; `unlabeled_x` are the held-out images."""
        self.make_model, self.unlabeled_x, self.normalize = make_model, unlabeled_x, normalize
        self.samples, self.opts, self.compute = samples, opts, compute
        return self

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        arrays, metrics = super().aggregate_train(server_round, replies)
        accepted = self.order_replies(self.accepted)
        if arrays is None or not accepted:
            return arrays, metrics
        clients = [{k: v.numpy() for k, v in single_array_record(r).items()} for r in accepted]
        weights = [float(r.content["metrics"][self.weighted_by_key]) for r in accepted]
        mean = {k: v.numpy() for k, v in arrays.items()}
        student = fedbe_round(self.make_model, mean, clients, weights, self.unlabeled_x, self.normalize, self.samples,
                              self.opts, self.seed, server_round, **self.compute).student
        return ArrayRecord({k: Array(v) for k, v in get_state(student).items()}), metrics


# --- FENS's iterative baselines: FedNova, Scaffold, FedAvg-STC (docs/readings.md#fens-iterative) ----------------


class SeededIterative(SeededSampling):
    """Seeded sampling (:class:`SeededSampling`) plus what the iterative baselines' own updates need: the round's
    global arrays and the names of the model's trainable parameters. Call :meth:`setup` after :meth:`bind`."""

    params: dict[str, np.ndarray] = {}  # name -> initial value of every trainable parameter (keys and shapes)
    p: MethodParams = NoParams()  # the method's parameters (FedNovaParams, ScaffoldParams, STCParams)
    _x: dict[str, np.ndarray] = {}  # the global arrays sent this round

    @classmethod
    def from_params(cls, params: MethodParams, federation, *, model=None, **kwargs) -> SeededIterative:
        """As :meth:`SeededSampling.from_params`, with the global `model` (an nn.Module) whose trainable parameters
        the strategy updates itself."""
        if model is None:
            raise ValueError(f"{cls.__name__}: from_params/from_run_config needs the global model (model=...)")
        trainable = {k: p.detach().cpu().numpy() for k, p in model.named_parameters() if p.requires_grad}
        return super().from_params(params, federation, **kwargs).setup(trainable, params)

    def setup(self, params: dict[str, np.ndarray], p: MethodParams) -> SeededIterative:
        """`params`: the trainable parameters (name -> array) of the model; `p`: the method's parameters."""
        self.params, self.p = dict(params), p
        return self

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._x = {k: v.numpy() for k, v in arrays.items()}
        return super().configure_train(server_round, arrays, config, grid)

    def _result(self, accepted: list[Message], new: dict[str, np.ndarray]) -> tuple[ArrayRecord, MetricRecord | None]:
        """The new global arrays in the global model's dtypes, and the clients' weighted train metrics."""
        self.accepted = accepted
        metrics = self.train_metrics_aggr_fn([r.content for r in accepted], self.weighted_by_key) if accepted else None
        self.train_metrics = {f"client_{k}": float(v) for k, v in (metrics or {}).items() if k != self.weighted_by_key}
        dtypes = self._dtypes or {}
        return ArrayRecord({k: Array(as_dtype(np.asarray(v), dtypes.get(k, np.asarray(v).dtype))) for k, v in new.items()}), metrics

    def _weighted(self, ys: list[dict[str, np.ndarray]], p: np.ndarray, skip: Iterable[str] = ()) -> dict[str, np.ndarray]:
        """The global arrays with every key but `skip` replaced by the clients' weighted mean (FedAvg)."""
        skip = set(skip)
        return {k: (v if k in skip else weighted_mean(ys, p, k)) for k, v in self._x.items()}


class SeededFedNova(SeededIterative):
    """FedNova (Wang et al. 2020) as the FENS authors run it (``distoptim/FedNova.py``): clients train plain local
    SGD (with momentum rho) and report their steps tau_i; the server moves the parameters along
    sum_i p_i (tau_eff / a_i) (x - y_i) with global momentum ``fednova-gmf``; buffers get the weighted mean.
    docs/readings.md#fens-fednova"""

    params_class = FedNovaParams

    buf: dict[str, np.ndarray] | None = None  # the global momentum buffer (None before the first update)
    tau_eff: float | None = None

    def check_reply(self, reply: Message) -> None:
        """A client with data reports its local steps, a positive integer."""
        metrics = reply.content["metrics"]
        if float(metrics["num-examples"]) > 0:
            steps = float(metrics["steps"])
            if not (np.isfinite(steps) and steps >= 1 and steps == int(steps)):
                raise ValueError(f"steps = {metrics['steps']!r}; expected a whole number >= 1")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        new, metrics = super().aggregate_train(server_round, replies)  # checked replies, weighted mean of every array
        if new is None:
            return new, metrics
        accepted = self.accepted
        ys = [{k: v.numpy() for k, v in single_array_record(r).items()} for r in accepted]
        p = data_weights([float(r.content["metrics"][self.weighted_by_key]) for r in accepted])
        a = [fednova_normalizer(int(r.content["metrics"]["steps"]), self.p.sgd.momentum) for r in accepted]
        d, self.tau_eff = fednova_direction(self._x, ys, p, a, list(self.params))
        step, self.buf = fednova_step(self._x, d, self.p.sgd.lr_at(server_round), self.p.gmf, self.buf)
        train_metrics = self.train_metrics
        arrays, _ = self._result(accepted, {**{k: v.numpy() for k, v in new.items()}, **step})
        self.train_metrics = {**train_metrics, "fednova_tau_eff": self.tau_eff}
        return arrays, metrics

    def state_dict(self) -> dict:
        """The global momentum buffer."""
        return {"buf": self.buf}

    def load_state_dict(self, st: dict) -> None:
        self.buf = st["buf"]


class SeededScaffold(SeededIterative):
    """Scaffold (Karimireddy et al. 2020, option II) as the FENS authors run it (``distoptim/Scaffold.py``).

    A train message carries the global model x and the server control variate c (twice the model down); the
    reply the local model y_i and Delta c_i (twice the model up). Each client's c_i lives in its node's state
    (:func:`hetfl.baselines.client_app.train_scaffold`). The server keeps a copy of every c_i (the sum of the
    Delta c_i it accepted) and the round it last changed, so that a node that lost its state (a resumed run, a
    restarted SuperNode) or whose reply was not accepted gets its c_i once more in its next message. Those copies
    live on disk, one file per client (:class:`~hetfl.common.clientstore.ClientStateStore` under
    ``<run-dir>/scaffold-ci/``, set by :meth:`keep_state_in`), so the server's memory holds c, the round of each
    c_i and the c_i of the current round's clients only, however many clients there are (in memory without a
    directory: tests). docs/readings.md#fens-scaffold
    """

    params_class = ScaffoldParams

    train_type = TRAIN_SCAFFOLD

    def setup(self, params: dict[str, np.ndarray], p: MethodParams) -> SeededScaffold:
        super().setup(params, p)
        self.c = {k: np.zeros(np.shape(v), np.float32) for k, v in self.params.items()}
        self.store: ClientStateStore | None = None  # the server's copy of every c_i (None: in `_mem`)
        self._mem: dict[int, dict[str, np.ndarray]] = {}
        self.ci_round: dict[int, int] = {}  # client -> round its c_i last changed (0 = never: c_i = 0)
        self.synced: dict[int, int] = {}  # client -> node known to hold its current c_i (this process only)
        self._c_record: ArrayRecord | None = None
        return self

    def prepare(self, cfg: dict, run_dir: Path) -> SeededScaffold:
        """The server's copies of the clients' c_i on disk in the run's directory, one file each, not in memory."""
        return self.keep_state_in(run_dir)

    def keep_state_in(self, run_dir: Path) -> SeededScaffold:
        """Keep the server's copies of the c_i in ``<run_dir>/scaffold-ci/`` (one file per client)."""
        self.store = ClientStateStore(Path(run_dir) / "scaffold-ci")
        for client, ci in self._mem.items():
            self.store.put(client, self.ci_round.get(client, 0), ci)
        self._mem = {}
        return self

    def c_i(self, client: int) -> dict[str, np.ndarray] | None:
        """The server's copy of `client`'s c_i (None: never changed, i.e. zero)."""
        if client not in self.ci_round:
            return None
        return self.store.get(client, self.ci_round[client]) if self.store is not None else self._mem[client]

    def _set_c_i(self, client: int, rnd: int, ci: dict[str, np.ndarray]) -> None:
        if self.store is not None:
            self.store.put(client, rnd, ci)
        else:
            self._mem[client] = ci
        self.ci_round[client] = rnd

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._c_record = ArrayRecord({k: Array(v) for k, v in self.c.items()})  # one record, shared by the messages
        return super().configure_train(server_round, arrays, config, grid)

    def client_records(self, client: int) -> dict:
        """c, the round of the client's c_i, and its c_i itself when its node may not hold it."""
        out = {CONTROL: self._c_record, SCAFFOLD: ConfigRecord({"ci-round": self.ci_round.get(client, 0)})}
        if client in self.ci_round and self.synced.get(client) != self.map.node.get(client):
            out[CONTROL_OWN] = ArrayRecord({k: Array(v) for k, v in self.c_i(client).items()})
        return out

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        reference, shapes = self._reference or {}, {k: np.shape(v) for k, v in self.c.items()}
        cdtypes = dict.fromkeys(self.c, np.float32)

        def check(r: Message) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], float]:
            y = check_arrays(r.content[self.arrayrecord_key], reference, self._dtypes)
            dc = check_arrays(r.content[CONTROL], shapes, cdtypes)
            return y, dc, check_weight(r.content["metrics"][self.weighted_by_key])

        ok, _, self.rejected = validate_replies(replies, check, server_round, self.map, set(self.sampled))
        done = set()
        for r, (_, dc, _) in ok:  # client-id order (run_rounds orders the replies)
            client = self.map.client_of(r)
            before = self.c_i(client) or {k: np.zeros_like(v) for k, v in self.c.items()}
            self._set_c_i(client, server_round, apply_delta(before, dc))
            self.synced[client] = self.map.node[client]
            done.add(client)
        for client in set(self.sampled) - done:  # its node may or may not have changed c_i: send it next time
            self.synced.pop(client, None)
        if ok:
            self.c = scaffold_server_control(self.c, [dc for _, (_, dc, _) in ok], len(self.map.clients()))
        trained = [(r, y, n) for r, (y, _, n) in ok if n > 0]
        if not trained:
            self.accepted, self.train_metrics = [], {}
            return None, None
        ys = [y for _, y, _ in trained]
        p = data_weights([n for _, _, n in trained])
        new = {**self._weighted(ys, p, self.params),
               **scaffold_model(self._x, ys, p, list(self.params), self.p.server_lr)}
        return self._result([r for r, _, _ in trained], new)

    def state_dict(self) -> dict:
        """c and the round each client's c_i last changed (the c_i themselves: in the store's files, which keep that
        round's version; without a store, in the checkpoint)."""
        return {"c": self.c, "ci_round": self.ci_round, **({"c_i": self._mem} if self.store is None else {})}

    def load_state_dict(self, st: dict) -> None:
        self.c, self.ci_round = st["c"], {int(k): int(v) for k, v in st["ci_round"].items()}
        old = {int(k): v for k, v in st.get("c_i", {}).items()}  # a checkpoint that holds the c_i (no store, or older)
        if self.store is not None:
            for client, ci in old.items():
                self.store.put(client, self.ci_round.get(client, 0), ci)
        else:
            self._mem = old
        self.synced = {}  # a new process: no node is known to hold its client's c_i


class SeededFedAvgSTC(SeededIterative):
    """FedAvg whose uploads are STC-style compressed (FENS Sec. B.2): the top ``stc-density`` of the update's
    entries by magnitude, values in 16 bits; the server decodes each update and adds the clients' weighted mean
    to the float entries of the global model (integer buffers stay). docs/readings.md#fens-stc"""

    params_class = STCParams

    train_type = TRAIN_STC

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self.layout = StateLayout.of({k: v.numpy() for k, v in arrays.items()})
        return super().configure_train(server_round, arrays, config, grid)

    def expected_values(self) -> int:
        """How many values an update holds (top-k over the whole vector, or per tensor)."""
        density = self.p.density
        if self.p.topk_scope == "tensor":
            return sum(topk_count(n, density) for n in self.layout.segments)
        return topk_count(self.layout.size, density)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        size, k = self.layout.size, self.expected_values()

        def check(r: Message) -> tuple[np.ndarray, float]:
            rec = r.content[STC_UPDATE]
            stc_decode(get_sparse(rec, STC_PREFIX))  # 16-bit values
            idx, val = check_sparse(rec, STC_PREFIX, size)
            if len(idx) != k:
                raise ValueError(f"update with {len(idx)} values, expected {k} (stc-density {self.p.density})")
            dense = np.zeros(size, np.float32)
            dense[idx] = val
            return dense, check_weight(r.content["metrics"][self.weighted_by_key])

        ok, _, self.rejected = validate_replies(replies, check, server_round, self.map, set(self.sampled))
        trained = [(r, d, n) for r, (d, n) in ok if n > 0]
        if not trained:
            self.accepted, self.train_metrics = [], {}
            return None, None
        p = data_weights([n for _, _, n in trained])
        step = sum(float(w) * d.astype(np.float64) for w, (_, d, _) in zip(p, trained, strict=True))
        flat = (self.layout.flatten(self._x).astype(np.float64) + step).astype(np.float32)
        return self._result([r for r, _, _ in trained], self.layout.unflatten(flat, self._x))
