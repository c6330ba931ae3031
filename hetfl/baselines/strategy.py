"""Strategy fixes shared by the baselines and FENS."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAdam, FedProx, FedYogi

from hetfl.common.models import get_state
from hetfl.common.strategy import SeededSampling, single_array_record

from .fedbe import fedbe_round


def adam_server_step(x: np.ndarray, m: np.ndarray, v: np.ndarray, eta: float, tau: float,
                     beta_1: float, beta_2: float, server_round: int | None = None) -> np.ndarray:
    """FedAdam's server step (Reddi et al. 2021, Alg. 2): x + eta_t * m / (sqrt(v) + tau).

    ``server_round = None``: no bias correction, eta_t = eta (the FENS authors' update);
    otherwise Flower's eta_t = eta * sqrt(1 - beta_2^(t+1)) / (1 - beta_1^(t+1)).
    docs/readings.md#fens-phase2
    """
    eta_t = eta if server_round is None else eta * np.sqrt(1 - beta_2 ** (server_round + 1.0)) / (1 - beta_1 ** (server_round + 1.0))
    return x + eta_t * m / (np.sqrt(v) + tau)


def adam_options(cfg: dict) -> dict:
    """FedAdam's run-config keys as strategy arguments (``adam-*``; FedYogi takes all but ``bias_correction``)."""
    return {"beta_1": cfg["adam-beta1"], "beta_2": cfg["adam-beta2"], "tau": cfg["adam-tau"],
            "bias_correction": cfg["adam-update"] == "flower"}


class FedOptState:
    """Checkpoint state of Flower's FedOpt family (FedAdam, FedYogi): the moments and the current model."""

    def state_dict(self) -> dict:
        """Moments m_t, v_t and the current model (for checkpoints)."""
        return {"m_t": self.m_t, "v_t": self.v_t, "current": self.current_arrays}

    def load_state_dict(self, st: dict) -> None:
        self.m_t, self.v_t, self.current_arrays = st["m_t"], st["v_t"], st["current"]


class FedAdamF32(FedOptState, FedAdam):
    """Flower's FedAdam (Reddi et al. 2021) that keeps the parameters' dtype, with or without bias correction.

    Flower 1.41's FedAdam multiplies float32 arrays by a NumPy float64 scalar, which NumPy 2
    promotes to float64, silently doubling every later download; the result is cast back to
    each array's dtype.

    Parameters
    ----------
    bias_correction : bool
        True: Flower's update (Adam's bias-corrected step size). False: the FENS authors'
        update, ``x + eta * m / (sqrt(v) + tau)`` with zero-initialised moments
        (run-config ``adam-update = "authors"``, docs/readings.md#fens-phase2).
    **kwargs
        Flower's :class:`FedAdam` arguments (``eta``, ``eta_l``, ``beta_1``, ``beta_2``, ``tau``, ...).
    """

    def __init__(self, *args, bias_correction: bool = True, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.bias_correction = bias_correction

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        dtypes = {k: np.asarray(v).dtype for k, v in self.current_arrays.items()} if self.current_arrays else {}
        if self.bias_correction:
            arrays, metrics = super().aggregate_train(server_round, replies)
        else:  # the weighted mean from the FedAvg family (validated replies), then the authors' step
            arrays, metrics = super(FedAdam, self).aggregate_train(server_round, replies)
            if arrays is not None:
                delta, m, _ = self._compute_deltat_and_mt(arrays)
                if not self.v_t:
                    self.v_t = {k: np.zeros_like(d) for k, d in delta.items()}
                self.v_t = {k: self.beta_2 * v + (1 - self.beta_2) * delta[k] ** 2 for k, v in self.v_t.items()}
                arrays = ArrayRecord({k: Array(np.asarray(adam_server_step(x, m[k], self.v_t[k], self.eta, self.tau,
                                                                           self.beta_1, self.beta_2)))
                                      for k, x in self.current_arrays.items()})
        if arrays is not None and dtypes:
            arrays = ArrayRecord({k: Array(np.asarray(v.numpy(), dtype=dtypes.get(k))) for k, v in arrays.items()})
        return arrays, metrics


class SeededFedAvg(SeededSampling):
    """Flower's FedAvg (McMahan et al. 2017) with seeded sampling by client id and validated replies."""


class SeededFedProx(FedProx, SeededSampling):
    """Flower's FedProx (Li et al. 2020; mu travels in the train config) with seeded sampling by client id."""


class SeededFedAdam(FedAdamF32, SeededSampling):
    """Flower's FedAdam (Reddi et al. 2021), dtype-preserving, with seeded sampling by client id."""


class SeededFedYogi(FedOptState, FedYogi, SeededSampling):
    """Flower's FedYogi (Reddi et al. 2021) with seeded sampling by client id (a FENS phase-2 option)."""


class SeededFedBE(SeededSampling):
    """FedBE (Chen and Chao, ICLR 2021): Flower's FedAvg with seeded sampling, then the Bayesian ensemble of the
    round's client models distilled into the FedAvg mean on the server's unlabeled set (:mod:`hetfl.baselines.fedbe`).

    Call :meth:`setup` after :meth:`bind`. docs/readings.md#fedbe
    """

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
