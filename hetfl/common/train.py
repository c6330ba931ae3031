"""The one local training loop and the one evaluation loop (single model and ensemble).

Data are :class:`~hetfl.common.data.ArrayData` (uint8 images); batches are normalised on
the fly, which keeps partitions small in memory and avoids DataLoader worker overhead
(the loops run inside Ray actors with one thread each).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .data import DATASETS, ArrayData


class Normalizer:
    """uint8 NCHW -> float32 normalised tensors for one dataset (token ids of text pass through)."""

    def __init__(self, dataset: str) -> None:
        info = DATASETS[dataset]
        self.text = info.kind == "text"
        c = max(1, len(info.mean))
        self.mean = torch.tensor(info.mean or (0.0,), dtype=torch.float32).view(1, c, 1, 1) * 255.0
        self.std = torch.tensor(info.std or (1.0,), dtype=torch.float32).view(1, c, 1, 1) * 255.0

    def __call__(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        if self.text:
            return torch.as_tensor(x)
        t = torch.as_tensor(x).float()
        return (t - self.mean) / self.std


def prepare_model(model: nn.Module, device: str | torch.device, image: bool) -> nn.Module:
    """Move to device; image models use channels-last memory (1.4x faster training, 3x faster inference on CPU)."""
    model.to(device)
    return model.to(memory_format=torch.channels_last) if image else model


def prepare_batch(x: torch.Tensor, normalize: Normalizer, device: str | torch.device) -> torch.Tensor:
    xb = normalize(x).to(device)
    return xb.contiguous(memory_format=torch.channels_last) if xb.dim() == 4 else xb


@dataclass
class TrainResult:
    """What one local training run did."""

    loss: float  # mean training loss over all steps
    steps: int
    num_examples: int  # size of the local dataset (FedAvg weight)
    seconds: float


def _batches(n: int, batch_size: int, steps: int, epochs: int, gen: torch.Generator):
    """Yield index tensors: `steps` batches (cycling through reshuffled epochs) or `epochs` full epochs."""
    if steps > 0:
        done, perm, pos = 0, torch.randperm(n, generator=gen), 0
        while done < steps:
            if pos >= n:
                perm, pos = torch.randperm(n, generator=gen), 0
            idx = perm[pos : pos + batch_size]
            pos += batch_size
            done += 1
            yield idx
    else:
        for _ in range(epochs):
            perm = torch.randperm(n, generator=gen)
            for pos in range(0, n, batch_size):
                yield perm[pos : pos + batch_size]


def num_steps(n: int, batch_size: int, steps: int, epochs: int) -> int:
    """How many optimiser steps `train` takes."""
    return steps if steps > 0 else epochs * math.ceil(n / batch_size)


def make_optimizer(params, name: str, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    """SGD (with momentum/weight decay) or Adam."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")


def train(
    model: nn.Module,
    data: ArrayData,
    normalize: Normalizer,
    *,
    steps: int = 0,
    epochs: int = 1,
    batch_size: int = 32,
    lr: float = 0.01,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    optimizer: str = "sgd",
    lr_schedule: str = "constant",
    proximal_mu: float = 0.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> TrainResult:
    """Train `model` in place on `data` (Sec. 'local training' of every method; FedProx adds mu/2 ||w - w_g||^2)."""
    t0 = time.perf_counter()
    n = len(data)
    if n == 0:
        return TrainResult(float("nan"), 0, 0, 0.0)
    prepare_model(model, device, np.ndim(data.x) == 4).train()
    total = num_steps(n, batch_size, steps, epochs)
    opt = make_optimizer(model.parameters(), optimizer, lr, momentum, weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total) if lr_schedule == "cosine" else None
    global_params = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None
    gen = torch.Generator().manual_seed(seed)
    x_all = torch.from_numpy(np.ascontiguousarray(data.x))
    y_all = torch.from_numpy(np.ascontiguousarray(data.y))
    loss_sum, done = 0.0, 0
    for idx in _batches(n, batch_size, steps, epochs, gen):
        x = prepare_batch(x_all[idx], normalize, device)
        y = y_all[idx].to(device)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        if global_params is not None:
            prox = sum(((p - g) ** 2).sum() for p, g in zip(model.parameters(), global_params, strict=True))
            loss = loss + 0.5 * proximal_mu * prox
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        loss_sum += float(loss.detach())
        done += 1
    return TrainResult(loss_sum / max(done, 1), done, n, time.perf_counter() - t0)


@torch.no_grad()
def member_logits(models: Sequence[nn.Module], data: ArrayData, normalize: Normalizer, batch_size: int = 256,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """Logits of each model on each sample: tensor (num_models, N, C)."""
    for m in models:
        prepare_model(m, device, np.ndim(data.x) == 4).eval()
    x_all = torch.from_numpy(np.ascontiguousarray(data.x))
    outs = [torch.stack([m(prepare_batch(x_all[pos : pos + batch_size], normalize, device)) for m in models]).cpu()
            for pos in range(0, max(len(data), 1), batch_size)]  # an empty split still yields shape (M, 0, C)
    return torch.cat(outs, dim=1)[:, : len(data)]


def predict_proba(models: Sequence[nn.Module], data: ArrayData, normalize: Normalizer, batch_size: int = 256,
                  device: str | torch.device = "cpu") -> torch.Tensor:
    """Softmax outputs of each model: tensor (num_models, N, C)."""
    return F.softmax(member_logits(models, data, normalize, batch_size, device), dim=-1)


def evaluate(model: nn.Module, data: ArrayData, normalize: Normalizer, batch_size: int = 256,
             device: str | torch.device = "cpu") -> tuple[float, float]:
    """Cross-entropy loss and accuracy of one model."""
    return evaluate_ensemble([model], data, normalize, batch_size, device)


def ensemble_metrics(probs: torch.Tensor, y: np.ndarray) -> tuple[float, float, list[float]]:
    """From member softmax outputs (M, N, C): ensemble loss (NLL of the mean), ensemble accuracy, member accuracies."""
    labels = torch.from_numpy(np.asarray(y))
    mean = probs.mean(dim=0)
    loss = F.nll_loss(torch.log(mean.clamp_min(1e-12)), labels).item()
    acc = (mean.argmax(dim=1) == labels).float().mean().item()
    members = [(p.argmax(dim=1) == labels).float().mean().item() for p in probs]
    return loss, acc, members


def evaluate_ensemble(models: Sequence[nn.Module], data: ArrayData, normalize: Normalizer, batch_size: int = 256,
                      device: str | torch.device = "cpu") -> tuple[float, float]:
    """Loss (NLL of the mean softmax) and accuracy of the ensemble prediction = mean of the members' softmax."""
    if len(data) == 0:
        return float("nan"), float("nan")
    loss, acc, _ = ensemble_metrics(predict_proba(models, data, normalize, batch_size, device), data.y)
    return loss, acc
