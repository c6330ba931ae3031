"""The one local training loop and the one evaluation loop (single model and ensemble).

Data are :class:`~hetfl.data.arrays.ArrayData` (uint8 images); batches are normalised on
the fly, which keeps partitions small in memory and avoids DataLoader worker overhead
(the loops run inside Ray actors with one thread each). Devices, bf16 autocast, data
augmentation, learning-rate schedules and drop-last are explained in docs/training.md.
"""

from __future__ import annotations

import contextlib
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hetfl.data.arrays import ArrayData
from hetfl.data.catalog import DatasetInfo
from hetfl.data.info import info_by_name

from .config import DEVICE_PATTERN, ConfigError
from .costs import step_flops

AUGMENT_PAD = 4  # random crop: zero padding on each side, then a crop back to the input size (docs/training.md)


_denormals = threading.local()  # how deep this thread is in no_denormals blocks


@contextlib.contextmanager
def no_denormals() -> Iterator[None]:
    """Flush subnormal floats to zero on the CPU (x86 FTZ/DAZ, ``torch.set_flush_denormal``) in this thread for the
    block, and turn it off again when the outermost block ends; blocks nest. Every training and evaluation loop here
    runs inside one (also as a decorator).

    Local training on one or two classes (Dir(0.01) partitions) drives the absent classes' softmax outputs below
    float32's smallest normal number, and arithmetic on such subnormals takes microcode assists: a FedAdam client's
    round ran 18x slower (docs/training.md#denormals). Values below 1.2e-38 become 0.
    """
    depth = getattr(_denormals, "depth", 0)
    if depth == 0:
        torch.set_flush_denormal(True)
    _denormals.depth = depth + 1
    try:
        yield
    finally:
        _denormals.depth = depth
        if depth == 0:
            torch.set_flush_denormal(False)


def resolve_device(name: str, key: str = "torch-device") -> torch.device:
    """Run-config device name -> torch.device: 'auto' = CUDA when available else CPU; 'cpu', 'cuda', 'cuda:N'.

    Asking for CUDA where it is not available fails with a one-line error naming `key` (docs/training.md).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not re.fullmatch(DEVICE_PATTERN, name):
        raise ConfigError(f"run-config key '{key}' = {name!r} is not allowed; expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    dev = torch.device(name)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"run-config key '{key}' = {name!r} but CUDA is not available on this machine "
                              "(torch.cuda.is_available() is False); use 'auto' or 'cpu'")
        if (dev.index or 0) >= torch.cuda.device_count():
            raise ConfigError(f"run-config key '{key}' = {name!r} but this machine has {torch.cuda.device_count()} "
                              "CUDA device(s)")
    return dev


def autocast(device: str | torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on the device's type for precision 'bf16'; a no-op for 'fp32' (docs/training.md)."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision != "bf16":
        raise ValueError(f"unknown precision {precision!r}; expected 'fp32' or 'bf16'")
    return torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16)


class Normalizer:
    """uint8 NCHW -> float32 normalised tensors for one dataset (token ids of text pass through; a table's float
    features are standardised per feature).

    `dataset` is a run-config ``dataset`` value (a named dataset, or a reference this process has described) or its
    :class:`~hetfl.data.catalog.DatasetInfo`.
    """

    def __init__(self, dataset: str | DatasetInfo) -> None:
        info = info_by_name(dataset) if isinstance(dataset, str) else dataset
        self.text = info.kind == "text"
        c = max(1, len(info.mean))
        if info.kind == "tabular":  # float features (N, F): standardised by the server's per-feature statistics
            self.mean = torch.tensor(info.mean, dtype=torch.float32).view(1, c)
            self.std = torch.tensor(info.std, dtype=torch.float32).view(1, c)
        else:
            self.mean = torch.tensor(info.mean or (0.0,), dtype=torch.float32).view(1, c, 1, 1) * 255.0
            self.std = torch.tensor(info.std or (1.0,), dtype=torch.float32).view(1, c, 1, 1) * 255.0
        self._on: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: np.ndarray | torch.Tensor) -> torch.Tensor:
        if self.text:
            return torch.as_tensor(x)
        t = torch.as_tensor(x)
        if t.device.type == "cpu":
            mean, std = self.mean, self.std
        else:  # the statistics follow the batch to its device (copied once per device)
            if t.device not in self._on:
                self._on[t.device] = (self.mean.to(t.device), self.std.to(t.device))
            mean, std = self._on[t.device]
        return (t.float() - mean) / std


def prepare_model(model: nn.Module, device: str | torch.device, image: bool) -> nn.Module:
    """Move to device; image models use channels-last memory (1.4x faster training, 3x faster inference on CPU)."""
    model.to(device)
    return model.to(memory_format=torch.channels_last) if image else model


def prepare_batch(x: torch.Tensor, normalize: Normalizer, device: str | torch.device) -> torch.Tensor:
    """Move the raw (uint8) batch to `device`, then normalise there."""
    xb = normalize(torch.as_tensor(x).to(device, non_blocking=True))
    return xb.contiguous(memory_format=torch.channels_last) if xb.dim() == 4 else xb


def crop_flip(x: torch.Tensor, dy: torch.Tensor | None, dx: torch.Tensor | None, flip: torch.Tensor | None,
              pad: int = AUGMENT_PAD) -> torch.Tensor:
    """Per-sample random crop with zero padding and horizontal flip, vectorised over the batch.

    x: (N, C, H, W); dy, dx: (N,) crop offsets in [0, 2 pad] into the zero-padded image (pad = no
    shift; None = no crop); flip: (N,) bool (None = no flip). Output pixel (i, j) of sample n is
    padded[n, :, dy + i, dx + j'] with j' = W - 1 - j where flipped (crop, then mirror), i.e. the
    image moves by (pad - dy, pad - dx) and uncovered pixels are 0 (torchvision RandomCrop(padding)
    + RandomHorizontalFlip on the raw image). docs/training.md
    """
    n, c, h, w = x.shape
    if dy is None:
        xp, rows, cols = x, torch.arange(h, device=x.device).expand(n, h), torch.arange(w, device=x.device).expand(n, w)
    else:
        xp = F.pad(x, (pad, pad, pad, pad))
        rows = dy.to(x.device)[:, None] + torch.arange(h, device=x.device)
        cols = dx.to(x.device)[:, None] + torch.arange(w, device=x.device)
    if flip is not None:
        cols = torch.where(flip.to(x.device)[:, None], cols.flip(1), cols)
    ni = torch.arange(n, device=x.device)[:, None, None, None]
    ci = torch.arange(c, device=x.device)[None, :, None, None]
    return xp[ni, ci, rows[:, None, :, None], cols[:, None, None, :]]


def augment_batch(x: torch.Tensor, mode: str, gen: torch.Generator, pad: int = AUGMENT_PAD) -> torch.Tensor:
    """Augment a raw image batch: mode 'none' | 'crop' | 'flip' | 'crop-flip' (docs/training.md).

    Draws from `gen` (CPU), in this order: offsets (2, N) uniform in [0, 2 pad] when cropping, then
    flips (N,) with probability 1/2 when flipping; 'none' draws nothing.
    """
    if mode == "none":
        return x
    n = x.shape[0]
    dy = dx = flip = None
    if "crop" in mode:
        dy, dx = torch.randint(0, 2 * pad + 1, (2, n), generator=gen)
    if "flip" in mode:
        flip = torch.randint(0, 2, (n,), generator=gen).bool()
    if dy is None and flip is None:
        raise ValueError(f"unknown augment {mode!r}")
    return crop_flip(x, dy, dx, flip, pad)


@dataclass
class TrainResult:
    """What one local training run did."""

    loss: float  # mean training loss over all steps
    steps: int
    num_examples: int  # size of the local dataset (FedAvg weight)
    seconds: float
    flops: int = 0  # floating-point operations of the steps taken (hetfl.common.costs.step_flops per batch size)


def steps_per_epoch(n: int, batch_size: int, drop_last: bool = False) -> int:
    """Batches in one epoch; drop-last drops the incomplete last batch unless it is the only one."""
    return n // batch_size if drop_last and n >= batch_size else math.ceil(n / batch_size)


def _batches(n: int, batch_size: int, steps: int, epochs: int, gen: torch.Generator,
             drop_last: bool = False, first_epoch: int = 0,
             boundary: Callable[[int], None] | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """Yield (epoch, index tensor): `steps` batches (cycling through reshuffled epochs) or `epochs` full epochs.

    With drop_last an epoch ends before its incomplete last batch, except when the partition is
    smaller than one batch: then its one batch is all of it (docs/training.md). With `epochs`, the epochs run from
    `first_epoch` (a resume, :class:`TrainCursor`) and `boundary(e)` is called before epoch e draws anything from
    `gen`, and with ``epochs`` after the last one: where a resume at epoch e must find the state.
    """
    end = batch_size * (n // batch_size) if drop_last and n >= batch_size else n  # last start position + 1
    if steps > 0:
        done, epoch, perm, pos = 0, 0, torch.randperm(n, generator=gen), 0
        while done < steps:
            if pos >= end:
                epoch, perm, pos = epoch + 1, torch.randperm(n, generator=gen), 0
            idx = perm[pos : pos + batch_size]
            pos += batch_size
            done += 1
            yield epoch, idx
    else:
        for epoch in range(first_epoch, epochs):
            if boundary is not None:
                boundary(epoch)
            perm = torch.randperm(n, generator=gen)
            for pos in range(0, end, batch_size):
                yield epoch, perm[pos : pos + batch_size]
        if boundary is not None:
            boundary(epochs)


def num_steps(n: int, batch_size: int, steps: int, epochs: int, drop_last: bool = False) -> int:
    """How many optimiser steps `train` takes."""
    return steps if steps > 0 else epochs * steps_per_epoch(n, batch_size, drop_last)


def num_epochs(n: int, batch_size: int, steps: int, epochs: int, drop_last: bool = False) -> int:
    """How many epochs (passes started) `train` runs: `epochs`, or the epochs that `steps` batches touch."""
    return math.ceil(steps / steps_per_epoch(n, batch_size, drop_last)) if steps > 0 else epochs


def cosine_epoch_lr(lr: float, lr_min: float, epoch: int, total_epochs: int) -> float:
    """lr of epoch e (0-based) of E: lr_min + (lr - lr_min) (1 + cos(pi e / E)) / 2 (FENS authors; docs/training.md)."""
    return lr_min + (lr - lr_min) * (1.0 + math.cos(math.pi * epoch / total_epochs)) / 2.0


def make_optimizer(params, name: str, lr: float, momentum: float, weight_decay: float) -> torch.optim.Optimizer:
    """SGD (with momentum/weight decay) or Adam."""
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    raise ValueError(f"unknown optimizer {name!r}")


def _tree(x, leaf: Callable):
    """`x` with every leaf that `leaf` maps (it returns None for the others) replaced; dicts, lists, tuples kept."""
    if isinstance(x, dict):
        return {k: _tree(v, leaf) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_tree(v, leaf) for v in x)
    out = leaf(x)
    return x if out is None else out


@dataclass
class TrainCursor:
    """Where an epoch-based :func:`train` stands at an epoch boundary, to go on later as if it had never stopped (a
    server distillation's checkpoint, docs/checkpoints.md#server-epochs): the next epoch, the optimiser's and the
    per-step scheduler's state, the batch generator's and torch's RNG states there.

    ``train(..., cursor=c)`` starts at ``c.epoch`` from that state (``c.epoch`` 0: from the start) and keeps `c` at
    the latest boundary: read it in ``epoch_end`` (the boundary after that epoch) or after ``train`` returns.
    """

    epoch: int = 0
    optimizer: dict | None = None
    scheduler: dict | None = None
    generator: torch.Tensor | None = None
    torch_rng: torch.Tensor | None = None
    cuda_rng: torch.Tensor | None = None

    def mark(self, epoch: int, opt: torch.optim.Optimizer, sched, gen: torch.Generator, device: torch.device) -> None:
        """Record the boundary before `epoch` (copies: the training goes on changing the originals)."""
        self.epoch = epoch
        self.optimizer = _tree(opt.state_dict(), lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else None)
        self.scheduler = sched.state_dict() if sched is not None else None
        self.generator, self.torch_rng = gen.get_state(), torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None

    def restore(self, opt: torch.optim.Optimizer, sched, gen: torch.Generator, device: torch.device) -> None:
        """Put the optimiser, scheduler and RNGs back as :meth:`mark` found them."""
        opt.load_state_dict(self.optimizer)
        if sched is not None:
            sched.load_state_dict(self.scheduler)
        gen.set_state(self.generator)
        torch.set_rng_state(self.torch_rng)
        if device.type == "cuda" and self.cuda_rng is not None:
            torch.cuda.set_rng_state(self.cuda_rng, device)

    def state_dict(self) -> dict:
        """Plain data for a checkpoint (:mod:`hetfl.common.checkpoint`): tensors as NumPy arrays."""
        to_np = lambda v: v.cpu().numpy().copy() if isinstance(v, torch.Tensor) else None  # noqa: E731
        return {k: _tree(getattr(self, k), to_np) for k in
                ("epoch", "optimizer", "scheduler", "generator", "torch_rng", "cuda_rng")}

    @classmethod
    def from_state_dict(cls, state: dict) -> TrainCursor:
        """Inverse of :meth:`state_dict`."""
        to_torch = lambda v: torch.from_numpy(np.array(v)) if isinstance(v, (np.ndarray, np.generic)) else None  # noqa: E731
        return cls(**{k: _tree(v, to_torch) for k, v in state.items()})


LR_SCHEDULES = ("constant", "cosine", "cosine-epoch")
AUGMENTS = ("none", "crop", "flip", "crop-flip")


# Over 60 lines only by its signature and docstring: the keyword arguments are local training's one interface.
@no_denormals()
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
    lr_min: float = 0.0,
    proximal_mu: float = 0.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    precision: str = "fp32",
    augment: str = "none",
    drop_last: bool = False,
    loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    epoch_end: Callable[[int], bool | None] | None = None,
    cursor: TrainCursor | None = None,
) -> TrainResult:
    """Train `model` in place on `data` (Sec. 'local training' of every method; FedProx adds mu/2 ||w - w_g||^2).

    Parameters
    ----------
    lr_schedule : 'constant'; 'cosine' = cosine annealing per optimiser step from lr to lr_min;
        'cosine-epoch' = :func:`cosine_epoch_lr` set at the start of every epoch (FENS authors).
    device, precision : where to train, and 'bf16' to run forward passes under bf16 autocast
        (weights, optimiser state and the loss stay float32).
    augment : :func:`augment_batch` mode applied to every raw image batch, drawn from the seeded generator.
    drop_last : drop each epoch's incomplete last batch (a partition smaller than one batch still trains).
    loss_fn : ``loss_fn(model, x, y) -> loss`` in place of cross-entropy of ``model(x)`` (e.g. ScaleFL's
        weighted early-exit loss); it runs under the same autocast.
    epoch_end : called with the 0-based epoch after its last step (e.g. to evaluate a server distillation after
        every epoch without restarting the optimizer); the model is put back in training mode after it. A true
        return value ends training there (FENS's members trained to completion stop early on validation).
    cursor : a :class:`TrainCursor` (``steps`` 0 only): start at its epoch, from its state, and keep it at each epoch
        boundary; stopped after any epoch and continued from it, the run ends as the uninterrupted one, bit for bit.

    All of it in docs/training.md. Same arguments and seed, same result.
    """
    t0 = time.perf_counter()
    n = len(data)
    if n == 0:
        return TrainResult(float("nan"), 0, 0, 0.0)
    _check_options(lr_schedule, augment)
    device = torch.device(device)
    prepare_model(model, device, np.ndim(data.x) == 4).train()
    total = num_steps(n, batch_size, steps, epochs, drop_last)
    opt = make_optimizer(model.parameters(), optimizer, lr, momentum, weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total, eta_min=lr_min) if lr_schedule == "cosine" else None
    n_epochs = num_epochs(n, batch_size, steps, epochs, drop_last)
    global_params = [p.detach().clone() for p in model.parameters()] if proximal_mu > 0 else None
    gen = torch.Generator().manual_seed(seed)
    first, boundary = 0, None
    if cursor is not None:
        if steps > 0:
            raise ValueError(f"train: a cursor needs epoch-based training; got steps={steps}")
        if cursor.epoch > 0:
            cursor.restore(opt, sched, gen, device)
        first, boundary = cursor.epoch, lambda e: cursor.mark(e, opt, sched, gen, device)
    x_all, y_all = _partition_tensors(data, device)
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    done, current_epoch, stopped = 0, -1, False
    batches: dict[int, int] = {}  # batch size -> steps taken at it (the FLOPs are counted once per size, at the end)
    for epoch, idx in _batches(n, batch_size, steps, epochs, gen, drop_last, first, boundary):
        if epoch_end is not None and epoch != current_epoch >= 0:
            if epoch_end(current_epoch):  # True: stop here (early stopping on a validation carve-out)
                stopped = True
                break
            model.train()
        if lr_schedule == "cosine-epoch" and epoch != current_epoch:
            for group in opt.param_groups:
                group["lr"] = cosine_epoch_lr(lr, lr_min, epoch, n_epochs)
        current_epoch = epoch
        idx = idx.to(device, non_blocking=True)
        x = prepare_batch(augment_batch(x_all[idx], augment, gen), normalize, device)
        loss = _step(model, opt, x, y_all[idx], loss_fn, device, precision, global_params, proximal_mu)
        if sched is not None:
            sched.step()
        loss_sum += loss.detach().double()  # on the device: no host sync per step
        done += 1
        batches[len(idx)] = batches.get(len(idx), 0) + 1
    if epoch_end is not None and current_epoch >= 0 and not stopped:
        epoch_end(current_epoch)
    seconds = time.perf_counter() - t0
    flops = sum(count * step_flops(model, tuple(x.shape[1:]), size, dtype=x.dtype, loss_fn=loss_fn)
                for size, count in batches.items())  # x: the last batch as the model took it
    return TrainResult(float(loss_sum) / max(done, 1), done, n, seconds, flops)


def _check_options(lr_schedule: str, augment: str) -> None:
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"unknown lr_schedule {lr_schedule!r}; expected one of {LR_SCHEDULES}")
    if augment not in AUGMENTS:
        raise ValueError(f"unknown augment {augment!r}; expected one of {AUGMENTS}")


def _partition_tensors(data: ArrayData, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The partition as tensors; off the CPU the whole (uint8) partition moves once and batches are gathered there."""
    x_all = torch.from_numpy(np.ascontiguousarray(data.x))
    y_all = torch.from_numpy(np.ascontiguousarray(data.y))
    if device.type != "cpu":
        x_all, y_all = x_all.to(device), y_all.to(device)
    return x_all, y_all


def _step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
          loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None, device: torch.device,
          precision: str, global_params: list[torch.Tensor] | None, proximal_mu: float) -> torch.Tensor:
    """One optimiser step on batch (x, y); returns the step's loss (with FedProx's term where mu > 0)."""
    opt.zero_grad(set_to_none=True)
    with autocast(device, precision):
        out = model(x) if loss_fn is None else loss_fn(model, x, y)
    loss = F.cross_entropy(out.float(), y) if loss_fn is None else out.float()
    loss.backward()
    if global_params is not None:
        loss = loss + proximal_step(list(model.parameters()), global_params, proximal_mu)
    opt.step()
    return loss


@torch.no_grad()
def proximal_step(params: list[torch.Tensor], global_params: list[torch.Tensor], mu: float) -> torch.Tensor:
    """FedProx's proximal term (Li et al. 2020, Eq. 2), mu/2 ||w - w_g||^2: adds its gradient mu (w - w_g) to each
    parameter's gradient and returns the term's value (for the reported loss).

    The same gradient as back-propagating the term through autograd, in two fused passes over the parameters
    instead of an autograd graph of 1.7 M squared differences per step (which made a FedProx round of the FMNIST CNN
    at batch 16 take 1.75x a FedAvg round; docs/training.md#fedprox).
    """
    diff = torch._foreach_sub(params, global_params)
    for p in params:
        if p.grad is None:  # a parameter the loss did not reach: the term alone pulls it
            p.grad = torch.zeros_like(p)
    torch._foreach_add_([p.grad for p in params], diff, alpha=mu)
    return 0.5 * mu * torch.stack(torch._foreach_norm(diff)).double().square().sum().float()


@torch.no_grad()
@no_denormals()
def member_logits(models: Sequence[nn.Module], data: ArrayData, normalize: Normalizer, batch_size: int = 256,
                  device: str | torch.device = "cpu", precision: str = "fp32") -> torch.Tensor:
    """Logits of each model on each sample: float32 CPU tensor (num_models, N, C) (bf16 autocast if asked)."""
    device = torch.device(device)
    for m in models:
        prepare_model(m, device, np.ndim(data.x) == 4).eval()
    x_all = torch.from_numpy(np.ascontiguousarray(data.x))
    if device.type != "cpu":
        x_all = x_all.to(device)
    outs = []
    with autocast(device, precision):
        for pos in range(0, max(len(data), 1), batch_size):  # an empty split still yields shape (M, 0, C)
            x = prepare_batch(x_all[pos : pos + batch_size], normalize, device)
            outs.append(torch.stack([m(x).float() for m in models]))
    return torch.cat(outs, dim=1)[:, : len(data)].cpu()


def predict_proba(models: Sequence[nn.Module], data: ArrayData, normalize: Normalizer, batch_size: int = 256,
                  device: str | torch.device = "cpu", precision: str = "fp32") -> torch.Tensor:
    """Softmax outputs (float32) of each model: tensor (num_models, N, C)."""
    return F.softmax(member_logits(models, data, normalize, batch_size, device, precision), dim=-1)


def evaluate(model: nn.Module, data: ArrayData, normalize: Normalizer, batch_size: int = 256,
             device: str | torch.device = "cpu", precision: str = "fp32") -> tuple[float, float]:
    """Cross-entropy loss and accuracy of one model."""
    return evaluate_ensemble([model], data, normalize, batch_size, device, precision)


def ensemble_metrics(probs: torch.Tensor, y: np.ndarray) -> tuple[float, float, list[float]]:
    """From member softmax outputs (M, N, C): ensemble loss (NLL of the mean), ensemble accuracy, member accuracies."""
    labels = torch.from_numpy(np.asarray(y))
    mean = probs.mean(dim=0)
    loss = F.nll_loss(torch.log(mean.clamp_min(1e-12)), labels).item()
    acc = (mean.argmax(dim=1) == labels).float().mean().item()
    members = [(p.argmax(dim=1) == labels).float().mean().item() for p in probs]
    return loss, acc, members


def member_disagreement(probs: torch.Tensor) -> float | None:
    """Pairwise disagreement of an ensemble's members (M, N, C) (docs/readings.md#shefl-diversity).

    The fraction of samples on which two members predict different labels, averaged over the
    M(M-1)/2 pairs (the disagreement measure of Kuncheva & Whitaker, 2003); None for fewer than
    two members or no samples. It does not look at the true labels: two members that err
    differently disagree.
    """
    labels = probs.argmax(dim=-1)
    M = labels.shape[0]
    if M < 2 or labels.shape[1] == 0:
        return None
    pairs = [(labels[i] != labels[j]).float().mean().item() for i in range(M) for j in range(i + 1, M)]
    return sum(pairs) / len(pairs)


@no_denormals()
def evaluate_ensemble(models: Sequence[nn.Module], data: ArrayData, normalize: Normalizer, batch_size: int = 256,
                      device: str | torch.device = "cpu", precision: str = "fp32") -> tuple[float, float]:
    """Loss (NLL of the mean softmax) and accuracy of the ensemble prediction = mean of the members' softmax."""
    if len(data) == 0:
        return float("nan"), float("nan")
    loss, acc, _ = ensemble_metrics(predict_proba(models, data, normalize, batch_size, device, precision), data.y)
    return loss, acc
