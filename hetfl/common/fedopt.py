"""Flower's FedOpt strategies (FedAdam, FedYogi; Reddi et al. 2021) fixed for this project: used by the FedAdam and
FedYogi baselines and by FENS's phase 2 (docs/readings.md#fens-phase2, #fens-fedyogi)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAdam, FedYogi

from .config import keys_of
from .params import MethodParams, key
from .strategy import SeededSampling, seeded_init


ADAM_RENAMED = {"adam-update": "fedadam-update", "adam-tau": "fedadam-tau", "adam-beta1": "fedadam-beta1",
                "adam-beta2": "fedadam-beta2"}


@dataclass(frozen=True)
class MomentParams(MethodParams):
    """FedAdam/FedYogi's moment constants (Reddi et al. 2021, Alg. 2); FedYogi reads only these.

    Parameters
    ----------
    tau : float
        Adaptivity (added to sqrt(v)).
    beta1, beta2 : float
        First- and second-moment decays.
    """

    tau: float = key("fedadam-tau", 1e-3, "FedAdam/FedYogi adaptivity tau (fedadam, fedyogi, FENS phase 2)", min=0.0, min_inclusive=False)
    beta1: float = key("fedadam-beta1", 0.9, "FedAdam/FedYogi first-moment decay beta_1", min=0.0, max=1.0, max_inclusive=False)
    beta2: float = key("fedadam-beta2", 0.99, "FedAdam/FedYogi second-moment decay beta_2", min=0.0, max=1.0, max_inclusive=False)

    def options(self) -> dict:
        """Keyword arguments of Flower's FedAdam / FedYogi."""
        return {"beta_1": self.beta1, "beta_2": self.beta2, "tau": self.tau}


@dataclass(frozen=True)
class AdamParams(MomentParams):
    """FedAdam's server-side constants: the moments' and the update rule.

    Parameters
    ----------
    update : {"authors", "flower"}
        "authors": no bias correction, eta_t = eta (the FENS authors' step); "flower": Flower's bias-corrected step.
    """

    update: str = key("fedadam-update", "authors", "FedAdam server step (fedadam, FENS phase 2): 'authors' = no bias correction (FENS code), 'flower' = Flower's bias-corrected step", choices=("authors", "flower"))

    def options(self, yogi: bool = False) -> dict:
        """Keyword arguments of :class:`SeededFedAdam` (FedYogi: all but ``bias_correction``)."""
        return super().options() if yogi else {**super().options(), "bias_correction": self.update == "flower"}


ADAM_KEYS = keys_of({"fedadam": AdamParams, "fens": AdamParams, "fedyogi": MomentParams})


@dataclass(frozen=True)
class FedAdamParams(MethodParams):
    """FedAdam (Reddi et al. 2021, Alg. 2): server learning rate eta and the moment constants.

    Parameters
    ----------
    server_lr : float
        eta of the server step.
    local_lr : float
        The clients' learning rate (Flower's ``eta_l``; the local optimizer reads run-config ``lr`` itself).
    adam : AdamParams
        update rule, tau, beta_1, beta_2.
    """

    server_lr: float = key("fedadam-server-lr", 0.01, "FedAdam/FedYogi server learning rate eta", min=0.0, min_inclusive=False)
    local_lr: float = key("lr", 0.01)
    adam: AdamParams = key("", AdamParams(), nested=AdamParams)


@dataclass(frozen=True)
class FedYogiParams(MethodParams):
    """FedYogi (Reddi et al. 2021, Alg. 2) as the FENS authors run it: FedAdam's server learning rate and moment
    constants, the sign-based second moment, no bias correction (docs/readings.md#fens-fedyogi).

    Parameters
    ----------
    server_lr : float
        eta of the server step (run-config ``fedadam-server-lr``, shared with FedAdam).
    local_lr : float
        The clients' learning rate (Flower's ``eta_l``; the local optimizer reads run-config ``lr`` itself).
    moments : MomentParams
        tau, beta_1, beta_2 (``fedadam-tau``, ``fedadam-beta1``, ``fedadam-beta2``).
    """

    server_lr: float = key("fedadam-server-lr", 0.01)  # declared in FedAdamParams
    local_lr: float = key("lr", 0.01)
    moments: MomentParams = key("", MomentParams(), nested=MomentParams)



def adam_server_step(x: np.ndarray, m: np.ndarray, v: np.ndarray, eta: float, tau: float,
                     beta_1: float, beta_2: float, server_round: int | None = None) -> np.ndarray:
    """FedAdam's server step (Reddi et al. 2021, Alg. 2): x + eta_t * m / (sqrt(v) + tau).

    ``server_round = None``: no bias correction, eta_t = eta (the FENS authors' update);
    otherwise Flower's eta_t = eta * sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1)).
    docs/readings.md#fens-phase2
    """
    eta_t = eta if server_round is None else eta * np.sqrt(1 - beta_2 ** (server_round + 1.0)) / (1 - beta_1 ** (server_round + 1.0))
    return x + eta_t * m / (np.sqrt(v) + tau)


BUFFER_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")  # BatchNorm's state: no parameters


def is_buffer(key: str) -> bool:
    """Whether a state-dict key names a BatchNorm statistic (running mean/var, batch count), not a parameter."""
    return key.rsplit(".", 1)[-1] in BUFFER_SUFFIXES


class FedOptState:
    """What this project adds to Flower's FedOpt family (FedAdam, FedYogi): checkpoint state, the parameters'
    dtypes kept, and BatchNorm statistics averaged rather than stepped.

    Flower 1.41's FedAdam multiplies float32 arrays by a NumPy float64 scalar, which NumPy 2 promotes to float64,
    silently doubling every later download, and FedYogi turns an integer buffer into float64 (its step adds a float
    to it); the result is cast back to each array's dtype. Reddi et al.'s adaptive step is for the model's
    parameters; BatchNorm's running mean/var and batch count (:func:`is_buffer`) are statistics, which Flower would
    step like weights (a running variance can even go negative): they become the clients' weighted mean, as FedAvg
    sets them (docs/training.md#server-optimizers-batchnorm-statistics-are-averaged). Put it before Flower's class: ``(FedOptState, FedYogi)``.
    """

    _buffer_mean: dict[str, np.ndarray] = {}  # this round's weighted mean of the BatchNorm statistics

    def _compute_deltat_and_mt(self, aggregated_arrayrecord: ArrayRecord):  # Flower's; remembers the buffers' mean
        self._buffer_mean = {k: a.numpy() for k, a in aggregated_arrayrecord.items() if is_buffer(k)}
        return super()._compute_deltat_and_mt(aggregated_arrayrecord)  # type: ignore[misc]

    def state_dict(self) -> dict:
        """Moments m_t, v_t and the current model (for checkpoints)."""
        return {"m_t": self.m_t, "v_t": self.v_t, "current": self.current_arrays}

    def load_state_dict(self, st: dict) -> None:
        self.m_t, self.v_t, self.current_arrays = st["m_t"], st["v_t"], st["current"]

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        dtypes = {k: np.asarray(v).dtype for k, v in self.current_arrays.items()} if self.current_arrays else {}
        self._buffer_mean = {}
        arrays, metrics = self.server_step(server_round, replies)
        if arrays is not None and self._buffer_mean:  # BatchNorm statistics: the mean, not the step
            arrays = ArrayRecord({k: Array(np.asarray(self._buffer_mean[k])) if k in self._buffer_mean else v
                                  for k, v in arrays.items()})
        if arrays is not None and dtypes:
            arrays = ArrayRecord({k: Array(np.asarray(v.numpy(), dtype=dtypes.get(k))) for k, v in arrays.items()})
        return arrays, metrics

    def server_step(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The new global arrays before the dtype cast (default: Flower's step)."""
        return super().aggregate_train(server_round, replies)  # type: ignore[misc]


class FedAdamF32(FedOptState, FedAdam):
    """Flower's FedAdam (Reddi et al. 2021) that keeps the parameters' dtype, with or without bias correction.

    Parameters
    ----------
    bias_correction : bool
        True: Flower's update (Adam's bias-corrected step size). False: the FENS authors'
        update, ``x + eta * m / (sqrt(v) + tau)`` with zero-initialised moments
        (run-config ``fedadam-update = "authors"``, docs/readings.md#fens-phase2).
    **kwargs
        Flower's :class:`FedAdam` arguments (``eta``, ``eta_l``, ``beta_1``, ``beta_2``, ``tau``, ...).
    """

    def __init__(self, *args, bias_correction: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bias_correction = bias_correction

    def server_step(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        if self.bias_correction:
            return super().server_step(server_round, replies)
        # the weighted mean from the FedAvg family (validated replies), then the authors' step
        arrays, metrics = super(FedAdam, self).aggregate_train(server_round, replies)
        if arrays is not None:
            delta, m, _ = self._compute_deltat_and_mt(arrays)
            if not self.v_t:
                self.v_t = {k: np.zeros_like(d) for k, d in delta.items()}
            self.v_t = {k: self.beta_2 * v + (1 - self.beta_2) * delta[k] ** 2 for k, v in self.v_t.items()}
            arrays = ArrayRecord({k: Array(np.asarray(adam_server_step(x, m[k], self.v_t[k], self.eta, self.tau,
                                                                       self.beta_1, self.beta_2)))
                                  for k, x in self.current_arrays.items()})
        return arrays, metrics


class SeededFedAdam(FedAdamF32, SeededSampling):
    """Flower's FedAdam (Reddi et al. 2021), dtype-preserving, with seeded sampling by client id."""

    __init__ = seeded_init(FedAdamF32)
    params_class = FedAdamParams

    @staticmethod
    def options(params: FedAdamParams) -> dict[str, Any]:
        """eta, eta_l and the moment constants (and the update rule) of :class:`FedAdamParams`."""
        return {"eta": params.server_lr, "eta_l": params.local_lr, **params.adam.options()}


class SeededFedYogi(FedOptState, FedYogi, SeededSampling):
    """Flower's FedYogi (Reddi et al. 2021), dtype-preserving, with seeded sampling by client id: the FedYogi baseline
    and a FENS phase-2 option. Its step is the FENS authors' (zero-initialised moments, no bias correction,
    docs/readings.md#fens-fedyogi)."""

    __init__ = seeded_init(FedYogi)
    params_class = FedYogiParams

    @staticmethod
    def options(params: FedYogiParams) -> dict[str, Any]:
        """eta, eta_l and the moment constants of :class:`FedYogiParams`."""
        return {"eta": params.server_lr, "eta_l": params.local_lr, **params.moments.options()}
