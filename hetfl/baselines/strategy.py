"""The baselines' strategies: Flower's FedAvg/FedProx with seeded sampling, and FedBE (FedAdam: hetfl.common.fedopt)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedProx

from hetfl.common.models import get_state
from hetfl.common.strategy import SeededSampling, single_array_record

from .fedbe import fedbe_round


class SeededFedAvg(SeededSampling):
    """Flower's FedAvg (McMahan et al. 2017) with seeded sampling by client id and validated replies."""


class SeededFedProx(FedProx, SeededSampling):
    """Flower's FedProx (Li et al. 2020; mu travels in the train config) with seeded sampling by client id."""


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
