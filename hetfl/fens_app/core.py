"""FENS data handling as pure functions: the 90/10 split and the ensemble's logits.

How the code reads the FENS paper and the authors' code: docs/readings.md#fens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from hetfl.common.compression import dequantize_state
from hetfl.common.data import ArrayData
from hetfl.common.models import set_state
from hetfl.common.task import make_model
from hetfl.common.train import Normalizer, member_logits


def split_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random split of range(n) into (first `fraction`, rest): FENS 90% local / 10% aggregator.

    docs/readings.md#fens-split
    """
    perm = np.random.default_rng([seed, 0xFE45]).permutation(n)
    cut = int(round(fraction * n))
    return np.sort(perm[:cut]), np.sort(perm[cut:])


def subset(data: ArrayData, idx: np.ndarray) -> ArrayData:
    return ArrayData(data.x[idx], data.y[idx])


def build_members(cfg: dict, states: Sequence[dict[str, np.ndarray]], quantized: bool) -> list[nn.Module]:
    """The ensemble's models from their (INT8-quantized or FP32) states (docs/readings.md#fens-quantization)."""
    members = []
    for st in states:
        m = make_model(cfg)
        set_state(m, dequantize_state(st) if quantized else st)
        members.append(m)
    return members


def ensemble_logits(models: Sequence[nn.Module], data: ArrayData, normalize: Normalizer, batch_size: int = 256,
                    device: str | torch.device = "cpu", precision: str = "fp32") -> np.ndarray:
    """Logits of every member on every sample as float32 (N, M, C): the aggregator's input (docs/training.md: device).

    Clients compute them once and cache them (docs/readings.md#fens-logit-cache).
    """
    return member_logits(models, data, normalize, batch_size, device, precision).permute(1, 0, 2).numpy()
