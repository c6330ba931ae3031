"""FENS aggregators f: Z^M -> Z over the ensemble's logits (FENS Sec. 2, appendix B.3-B.4).

Biases, initialisation and hidden width as read here: docs/readings.md#fens-aggregators.

Every aggregator maps logits of shape (N, M, C) to (N, C). `nn`, `per-class` and
`linear` are trained in phase 2; `average` and `weighted-average` are static.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

AGGREGATORS = ("nn", "per-class", "linear", "average", "weighted-average")
STATIC = ("average", "weighted-average")


class Aggregator(nn.Module):
    """Base class: forward(z) with z of shape (N, M, C) -> (N, C)."""

    trainable = True

    def __init__(self, num_models: int, num_classes: int) -> None:
        super().__init__()
        self.M, self.C = num_models, num_classes


class NNAggregator(Aggregator):
    """f = W2^T relu(W1^T z), z = concat(z_1..z_M) in R^{MC}, hidden width k (B.3; biases included).

    docs/readings.md#fens-aggregators
    """

    def __init__(self, num_models: int, num_classes: int, hidden: int = 40) -> None:
        super().__init__(num_models, num_classes)
        self.net = nn.Sequential(nn.Linear(num_models * num_classes, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.flatten(1))


class PerClassAggregator(Aggregator):
    """f = sum_i lambda_i (elementwise) z_i, lambda in R^{M x C} (B.4), initialised to averaging.

    The authors start from Xavier-uniform instead (docs/readings.md#fens-not-yet).
    """

    def __init__(self, num_models: int, num_classes: int) -> None:
        super().__init__(num_models, num_classes)
        self.weight = nn.Parameter(torch.full((num_models, num_classes), 1.0 / num_models))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (z * self.weight).sum(dim=1)


class LinearAggregator(Aggregator):
    """f = sum_i w_i z_i, one scalar per client (B.4), initialised to averaging (docs/readings.md#fens-aggregators)."""

    def __init__(self, num_models: int, num_classes: int) -> None:
        super().__init__(num_models, num_classes)
        self.weight = nn.Parameter(torch.full((num_models,), 1.0 / num_models))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.einsum("nmc,m->nc", z, self.weight)


class StaticAggregator(Aggregator):
    """f = sum_i lambda_i (elementwise) z_i with fixed lambda (averaging / weighted averaging, B.4)."""

    trainable = False

    def __init__(self, weights: np.ndarray) -> None:
        super().__init__(*weights.shape)
        self.register_buffer("weight", torch.as_tensor(weights, dtype=torch.float32))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (z * self.weight).sum(dim=1)


def label_count_weights(counts: np.ndarray) -> np.ndarray:
    """FedKD's weighted averaging: lambda_i^c = n_i^c / sum_j n_j^c (classes nobody holds: 1/M).

    n_i^c counts client i's 90% training split (docs/readings.md#fens-aggregators).
    """
    counts = np.asarray(counts, dtype=np.float64)
    tot = counts.sum(axis=0, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(tot > 0, counts / tot, 1.0 / counts.shape[0])
    return w.astype(np.float32)


def make_aggregator(name: str, num_models: int, num_classes: int, hidden: int = 40,
                    label_counts: np.ndarray | None = None) -> Aggregator:
    """The aggregator for run-config `aggregator`."""
    if name == "nn":
        return NNAggregator(num_models, num_classes, hidden)
    if name == "per-class":
        return PerClassAggregator(num_models, num_classes)
    if name == "linear":
        return LinearAggregator(num_models, num_classes)
    if name == "average":
        return StaticAggregator(np.full((num_models, num_classes), 1.0 / num_models, np.float32))
    if name == "weighted-average":
        if label_counts is None:
            raise ValueError("weighted-average needs the clients' per-class label counts")
        return StaticAggregator(label_count_weights(label_counts))
    raise ValueError(f"unknown aggregator {name!r}; expected one of {AGGREGATORS}")
