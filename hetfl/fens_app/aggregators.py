"""FENS aggregators f: Z^M -> Z over the ensemble's logits (FENS Sec. 2, appendix B.3-B.4).

Biases, initialisation and hidden width as read here: docs/readings.md#fens-aggregators.

Every aggregator maps logits of shape (N, M, C) to (N, C). `nn`, `per-class` and
`linear` are trained in phase 2; `average`, `weighted-average` and `voting` are static.
Trainable aggregators are initialised from a seeded generator, so server and sweep runs agree.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hetfl.common.oneshot.ensemble import label_count_weights

AGGREGATORS = ("nn", "per-class", "linear", "average", "weighted-average", "voting")
STATIC = ("average", "weighted-average", "voting")
STATIC_LABELS = {"average": "FedENS (averaging)", "weighted-average": "weighted averaging", "voting": "polychotomous voting",
                 "oneshot-fedavg": "one-shot FedAvg"}  # names in tables of what every FENS run scores on its ensemble
INITS = ("xavier", "average")


class Aggregator(nn.Module):
    """Base class: forward(z) with z of shape (N, M, C) -> (N, C)."""

    trainable = True

    def __init__(self, num_models: int, num_classes: int) -> None:
        super().__init__()
        self.M, self.C = num_models, num_classes


class NNAggregator(Aggregator):
    """f = W2^T relu(W1^T z), z = concat(z_1..z_M) in R^{MC}, hidden width k (B.3; biases included).

    PyTorch's default initialisation, as the authors' SmallNN (docs/readings.md#fens-aggregators).
    """

    def __init__(self, num_models: int, num_classes: int, hidden: int = 40, generator: torch.Generator | None = None) -> None:
        super().__init__(num_models, num_classes)
        self.net = nn.Sequential(nn.Linear(num_models * num_classes, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        if generator is not None:  # nn.Linear.reset_parameters with a seeded generator
            for lin in (self.net[0], self.net[2]):
                bound = 1.0 / lin.in_features ** 0.5
                with torch.no_grad():
                    lin.weight.uniform_(-bound, bound, generator=generator)  # kaiming_uniform(a=sqrt 5) = U(+-1/sqrt(fan_in))
                    lin.bias.uniform_(-bound, bound, generator=generator)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z.flatten(1))


class PerClassAggregator(Aggregator):
    """f = sum_i lambda_i (elementwise) z_i, lambda in R^{M x C} (B.4).

    ``init = "xavier"``: Xavier-uniform as the authors' WeightedAggregatorNN (an (M, C) matrix:
    fan_in C, fan_out M); ``"average"``: lambda = 1/M (docs/readings.md#fens-aggregators).
    """

    def __init__(self, num_models: int, num_classes: int, init: str = "xavier", generator: torch.Generator | None = None) -> None:
        super().__init__(num_models, num_classes)
        w = nn.init.xavier_uniform_(torch.empty(num_models, num_classes), generator=generator) if init == "xavier" \
            else torch.full((num_models, num_classes), 1.0 / num_models)
        self.weight = nn.Parameter(w)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (z * self.weight).sum(dim=1)


class LinearAggregator(Aggregator):
    """f = sum_i w_i z_i + b, one scalar per client and one shared bias (B.4; the authors' LinearAggregator).

    ``init = "xavier"``: w Xavier-uniform as the authors' (1, M, 1) tensor (fan_in M, fan_out 1), b = 1;
    ``"average"``: w = 1/M, b = 0 (docs/readings.md#fens-aggregators).
    """

    def __init__(self, num_models: int, num_classes: int, init: str = "xavier", generator: torch.Generator | None = None) -> None:
        super().__init__(num_models, num_classes)
        xavier = init == "xavier"
        # Xavier on the authors' (1, M, 1) shape (its fans: M in, 1 out), kept as (M,)
        self.weight = nn.Parameter(nn.init.xavier_uniform_(torch.empty(1, num_models, 1), generator=generator).view(num_models)
                                   if xavier else torch.full((num_models,), 1.0 / num_models))
        self.bias = nn.Parameter(torch.ones(1) if xavier else torch.zeros(1))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return torch.einsum("nmc,m->nc", z, self.weight) + self.bias


class StaticAggregator(Aggregator):
    """f = sum_i lambda_i (elementwise) z_i with fixed lambda (averaging / weighted averaging, B.4)."""

    trainable = False

    def __init__(self, weights: np.ndarray) -> None:
        super().__init__(*weights.shape)
        self.register_buffer("weight", torch.as_tensor(weights, dtype=torch.float32))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return (z * self.weight).sum(dim=1)


class VotingAggregator(Aggregator):
    """Polychotomous voting (FENS appendix B.4): predict argmax_k prod_i P_i(pred = c_i | true = k).

    ``competencies[i, k, j]`` is P_i(pred j | true k), client i's confusion matrix on its 10%
    split normalised by row (:func:`competencies`); c_i is member i's predicted class. The
    output is the log of the product, so argmax and accuracy are the vote's; the loss is not
    meaningful. docs/readings.md#fens-voting
    """

    trainable = False

    def __init__(self, competencies: np.ndarray) -> None:
        super().__init__(competencies.shape[0], competencies.shape[1])
        with np.errstate(divide="ignore"):  # log 0 = -inf: a class the member never predicts for it
            log_comp = np.log(np.asarray(competencies, np.float64))
        self.register_buffer("log_comp", torch.as_tensor(log_comp, dtype=torch.float64))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        votes = z.argmax(dim=2)  # (N, M): every member's predicted class
        # log P_i(pred c_i | true k) for all k: (N, M, C), summed over members
        picked = self.log_comp.permute(0, 2, 1)[torch.arange(self.M, device=z.device)[None, :], votes]
        return picked.sum(dim=1).float()


def competencies(confusion: np.ndarray) -> np.ndarray:
    """P_i(pred j | true k) from confusion counts (M, C, C) [client, true, predicted].

    Rows of classes a client never saw get 1/(its seen classes) on its seen classes and 0 elsewhere,
    as the authors' code does; seen rows are normalised over all columns (docs/readings.md#fens-voting).
    """
    conf = np.asarray(confusion, np.float64)
    totals = conf.sum(axis=2, keepdims=True)  # (M, C, 1) samples of each true class
    seen = totals[..., 0] > 0  # (M, C)
    out = np.where(totals > 0, conf / np.maximum(totals, 1), 0.0)
    for i in range(conf.shape[0]):
        n_seen = int(seen[i].sum())
        if n_seen:
            out[i][~seen[i]] = np.where(seen[i], 1.0 / n_seen, 0.0)
        else:  # no data at all: an uninformative voter
            out[i][:] = 1.0 / conf.shape[1]
    return out


def confusion_counts(logits: np.ndarray, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """C x C counts [true, predicted] of one member's logits (N, C) against the labels."""
    out = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(out, (np.asarray(labels, np.int64), np.asarray(logits).argmax(axis=1)), 1)
    return out


def make_aggregator(name: str, num_models: int, num_classes: int, hidden: int = 0,
                    label_counts: np.ndarray | None = None, init: str = "xavier", seed: int | None = None,
                    confusion: np.ndarray | None = None) -> Aggregator:
    """The aggregator for run-config `aggregator`.

    Parameters
    ----------
    hidden : int
        NN hidden width k; 0 = 2 * num_models (the authors' ``d = 2``: k = 40 at M = 20).
    label_counts : ndarray, optional
        (M, C) per-class training counts of each member (``weighted-average``).
    init : str
        ``xavier`` or ``average`` start of ``per-class`` / ``linear`` (run-config ``fens-aggregator-init``).
    seed : int, optional
        Seeds the initialisation of trainable aggregators (None: torch's global generator).
    confusion : ndarray, optional
        (M, C, C) confusion counts of each member on its client's 10% split (``voting``).
    """
    gen = torch.Generator().manual_seed(int(seed)) if seed is not None else None
    if name == "nn":
        return NNAggregator(num_models, num_classes, hidden or 2 * num_models, gen)
    if name == "per-class":
        return PerClassAggregator(num_models, num_classes, init, gen)
    if name == "linear":
        return LinearAggregator(num_models, num_classes, init, gen)
    if name == "voting":
        if confusion is None:
            raise ValueError("voting needs the clients' confusion matrices")
        return VotingAggregator(competencies(confusion))
    if name == "average":
        return StaticAggregator(np.full((num_models, num_classes), 1.0 / num_models, np.float32))
    if name == "weighted-average":
        if label_counts is None:
            raise ValueError("weighted-average needs the clients' per-class label counts")
        return StaticAggregator(label_count_weights(label_counts))
    raise ValueError(f"unknown aggregator {name!r}; expected one of {AGGREGATORS}")
