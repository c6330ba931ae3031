"""What a round costs a device, measured rather than assumed: FLOPs counted by PyTorch, and a simulated wall clock.

* :func:`step_flops` counts the floating-point operations of one training step (forward, loss, backward) or of one
  inference batch with :class:`torch.utils.flop_counter.FlopCounterMode`, PyTorch's own counter (matmuls and
  convolutions, forward and backward as the autograd graph runs them), cached per architecture, input shape and batch.
* :func:`client_seconds` and :func:`round_seconds` are the simulated clock of FedScale's system model (Lai et al.,
  ICML 2022): a client's round lasts its download at its downlink bandwidth, its training FLOPs at its compute speed
  and its upload at its uplink bandwidth; a synchronous round lasts as long as its slowest sampled client.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

_CACHE: dict[tuple, int] = {}


def _signature(model: nn.Module) -> tuple:
    return type(model).__module__, type(model).__qualname__, tuple((k, tuple(v.shape)) for k, v in model.state_dict().items())


def step_flops(model: nn.Module, input_shape: tuple[int, ...], batch_size: int, train: bool = True,
               *, dtype: torch.dtype = torch.float32,
               loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> int:
    """FLOPs of one step on a batch of `batch_size` inputs of `input_shape` (without the batch dimension).

    ``train``: forward, loss and backward (the weights' gradients and the inputs' gradients of every layer but the
    first, as autograd computes them); else one forward pass. ``dtype``: the inputs' (token ids are integers);
    ``loss_fn(model, x, y)`` in place of cross-entropy of ``model(x)`` (a multi-exit model's loss). The model's state
    and gradients are left as they were (it runs on a copy, on the model's device). Cached per (architecture and
    tensor shapes, input shape and dtype, batch, train, loss).
    """
    key = (_signature(model), tuple(input_shape), str(dtype), int(batch_size), bool(train),
           getattr(loss_fn, "__qualname__", None))
    if key in _CACHE:
        return _CACHE[key]
    probe = copy.deepcopy(model)  # the model's weights, buffers (BatchNorm statistics) and gradients stay as they are
    device = next((p.device for p in probe.parameters()), torch.device("cpu"))
    x = torch.zeros((batch_size, *input_shape), dtype=dtype, device=device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), \
            FlopCounterMode(display=False) as counter:  # dropout draws leave the RNG as it was
        if train:
            probe.train()
            y = torch.zeros(batch_size, dtype=torch.long, device=device)
            loss = nn.functional.cross_entropy(probe(x).float(), y) if loss_fn is None else loss_fn(probe, x, y)
            loss.float().backward()
        else:
            probe.eval()
            with torch.no_grad():
                probe(x)
    _CACHE[key] = int(counter.get_total_flops())
    return _CACHE[key]


@dataclass(frozen=True)
class ClientCost:
    """One client's work in one round: bytes it downloads and uploads, and the FLOPs it computes."""

    bytes_down: int
    bytes_up: int
    flops: int


@dataclass(frozen=True)
class DeviceSpeed:
    """How fast a device computes and communicates: FLOP/s, downlink and uplink bandwidth in bit/s."""

    flops_per_s: float
    down_bps: float
    up_bps: float


def client_seconds(cost: ClientCost, speed: DeviceSpeed) -> float:
    """Download, training and upload of one client, one after the other (FedScale's system model)."""
    return 8.0 * cost.bytes_down / speed.down_bps + cost.flops / speed.flops_per_s + 8.0 * cost.bytes_up / speed.up_bps


def round_seconds(clients: Iterable[tuple[ClientCost, DeviceSpeed]]) -> float:
    """A synchronous round: its slowest sampled client (0 for a round that sampled nobody)."""
    return max((client_seconds(c, s) for c, s in clients), default=0.0)
