"""Strategy fixes shared by the baselines and FENS."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.serverapp.strategy import FedAdam, FedProx

from hetfl.common.strategy import SeededSampling


class FedAdamF32(FedAdam):
    """Flower's FedAdam (Reddi et al. 2021) that keeps the parameters' dtype.

    Flower 1.41's FedAdam multiplies float32 arrays by a NumPy float64 scalar, which NumPy 2
    promotes to float64, silently doubling every later download. The update is unchanged;
    only the result is cast back to each array's dtype.
    """

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        dtypes = {k: np.asarray(v).dtype for k, v in self.current_arrays.items()} if self.current_arrays else {}
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is not None and dtypes:
            arrays = ArrayRecord({k: Array(np.asarray(v.numpy(), dtype=dtypes.get(k))) for k, v in arrays.items()})
        return arrays, metrics

    def state_dict(self) -> dict:
        """Adam moments and the current model (for checkpoints)."""
        return {"m_t": self.m_t, "v_t": self.v_t, "current": self.current_arrays}

    def load_state_dict(self, st: dict) -> None:
        self.m_t, self.v_t, self.current_arrays = st["m_t"], st["v_t"], st["current"]


class SeededFedAvg(SeededSampling):
    """Flower's FedAvg (McMahan et al. 2017) with seeded sampling by client id and validated replies."""


class SeededFedProx(FedProx, SeededSampling):
    """Flower's FedProx (Li et al. 2020; mu travels in the train config) with seeded sampling by client id."""


class SeededFedAdam(FedAdamF32, SeededSampling):
    """Flower's FedAdam (Reddi et al. 2021), dtype-preserving, with seeded sampling by client id."""
