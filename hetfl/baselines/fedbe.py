"""FedBE (Chen and Chao, ICLR 2021), a baseline of SHEFL's Table 1: FedAvg plus a Bayesian model ensemble
distilled into the global model on the server.

Each round, after FedAvg: fit a diagonal Gaussian to the returned client models (mean = the
FedAvg model, per-parameter variance across clients, both weighted by data size), draw S samples,
label the server's unlabeled set with the mean softmax of {FedAvg mean, client models, samples},
and distill those soft labels into a student that starts from the FedAvg mean, averaging the
student's weights over the distillation epochs (SWA). docs/readings.md#fedbe
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetfl.common.models import get_state, set_state
from hetfl.common.strategy import weighted_mean
from hetfl.common.train import Normalizer, predict_proba, train
from hetfl.data.arrays import ArrayData

State = dict[str, np.ndarray]


def gaussian_samples(states: Sequence[State], weights: Sequence[float], num_samples: int,
                     rng: np.random.Generator) -> list[State]:
    """S models drawn from N(mu, diag(sigma^2)) fitted to the client models (FedBE Sec. 4).

    mu = sum_i p_i w_i and sigma^2 = sum_i p_i (w_i - mu)^2 with p_i proportional to `weights`; integer
    buffers (e.g. BatchNorm's num_batches_tracked) are copied from mu.
    """
    mu = weighted_mean(states, weights)
    p = np.asarray(weights, np.float64) / float(np.sum(weights))
    sigma = {}
    for k, m in mu.items():
        if np.issubdtype(m.dtype, np.floating):
            var = sum(pi * (np.asarray(s[k], np.float64) - m) ** 2 for pi, s in zip(p, states, strict=True))
            sigma[k] = np.sqrt(var)
    return [{k: (m + sigma[k] * rng.standard_normal(m.shape)).astype(m.dtype) if k in sigma else m.copy()
             for k, m in mu.items()} for _ in range(num_samples)]


def soft_labels(models: Sequence[nn.Module], x: np.ndarray, normalize: Normalizer, batch_size: int = 256,
                **compute) -> torch.Tensor:
    """The ensemble's pseudo-labels: mean softmax of the members on the unlabeled images, (N, C)."""
    data = ArrayData(x, np.zeros(len(x), np.int64))
    return predict_proba(models, data, normalize, batch_size, **compute).mean(dim=0)


@dataclass(frozen=True)
class DistillOptions:
    """Server-side distillation as in the FedBE authors' code (docs/readings.md#fedbe).

    Parameters
    ----------
    epochs, batch_size, lr, momentum, weight_decay : SGD over the unlabeled set (authors: 20, 128, 1e-3, 0.9, 1e-5).
    swa_start : optimiser steps before the first SWA snapshot (authors: 500); snapshots are taken at the end of
        every later epoch; 0 = from the first epoch. With no snapshot the last iterate is kept.
    """

    epochs: int = 20
    batch_size: int = 128
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 1e-5
    swa_start: int = 500


def distill(student: nn.Module, x: np.ndarray, targets: torch.Tensor, normalize: Normalizer, opts: DistillOptions,
            seed: int = 0, **compute) -> nn.Module:
    """Train `student` (in place) on soft `targets`, one epoch at a time through the one training loop, then load
    the average of its end-of-epoch weights after `swa_start` steps (SWA).

    Loss: KL(P || Q) averaged over batch and classes, P = targets, Q = the student's softmax (the authors'
    hand-written KL; it differs from cross-entropy to P by a constant).
    """
    index = ArrayData(x, np.arange(len(x), dtype=np.int64))  # y carries each sample's row in `targets`

    def loss_fn(model: nn.Module, xb: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        p = targets[rows.cpu()].to(xb.device)
        return (p * (torch.log(p.clamp_min(1e-12)) - F.log_softmax(model(xb).float(), dim=1))).mean()

    swa: State | None = None
    snapshots = steps = 0
    for epoch in range(opts.epochs):
        steps += train(student, index, normalize, epochs=1, batch_size=opts.batch_size, lr=opts.lr,
                       momentum=opts.momentum, weight_decay=opts.weight_decay, seed=seed * 1009 + epoch,
                       loss_fn=loss_fn, **compute).steps
        if steps < opts.swa_start:
            continue
        state = get_state(student)
        swa = state if swa is None else {k: v if not np.issubdtype(v.dtype, np.floating)
                                         else ((swa[k] * snapshots + v) / (snapshots + 1)).astype(v.dtype)
                                         for k, v in state.items()}
        snapshots += 1
    if swa is not None:
        set_state(student, swa)
    return student


@dataclass
class FedBERound:
    """One round of FedBE's server step: the distilled `student`, the ensemble's `members` (FedAvg mean, client
    models, Gaussian samples, in that order) and the pseudo-labels `targets` (N, C) they gave the unlabeled set."""

    student: nn.Module
    members: list[nn.Module]
    targets: torch.Tensor


def server_inputs(cfg: dict, p) -> tuple[ArrayData, DistillOptions]:
    """FedBE's server set (the held-out train images; the strategy gets only their `x`) and distillation settings
    (`p`: :class:`~hetfl.baselines.params.FedBEParams`)."""
    from hetfl.data.load import load_server_set
    from hetfl.data.spec import DataSpec

    held = load_server_set(DataSpec.from_config(cfg, 1), cfg["cache-dir"])
    return held, DistillOptions(p.epochs, p.batch_size, p.lr, p.momentum, p.weight_decay, p.swa_start)


def fedbe_round(make_model: Callable[[], nn.Module], mean: State, clients: Sequence[State], weights: Sequence[float],
                unlabeled_x: np.ndarray, normalize: Normalizer, samples: int, opts: DistillOptions, seed: int,
                server_round: int, **compute) -> FedBERound:
    """FedBE's server step after FedAvg (Sec. 4): ensemble {mean, clients, S samples}, label, distill into the mean.

    `mean` is the round's FedAvg model, `clients` the returned models in client-id order with data sizes
    `weights`. Seeded by (`seed`, `server_round`), so a round can be replayed from its inputs.
    """
    rng = np.random.default_rng([seed, server_round, 0xBE])
    members = []
    for state in (mean, *clients, *gaussian_samples(clients, weights, samples, rng)):
        model = make_model()
        set_state(model, state)
        members.append(model)
    targets = soft_labels(members, unlabeled_x, normalize, **compute)
    student = make_model()
    set_state(student, mean)
    distill(student, unlabeled_x, targets, normalize, opts, seed=seed * 7919 + server_round, **compute)
    return FedBERound(student, members, targets)
