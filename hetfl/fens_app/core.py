"""FENS data handling as pure functions: the 90/10 split and the ensemble's logits."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from torch import nn

from hetfl.common.data import ArrayData
from hetfl.common.train import Normalizer, member_logits


def split_indices(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Seeded random split of range(n) into (first `fraction`, rest): FENS 90% local / 10% aggregator."""
    perm = np.random.default_rng([seed, 0xFE45]).permutation(n)
    cut = int(round(fraction * n))
    return np.sort(perm[:cut]), np.sort(perm[cut:])


def subset(data: ArrayData, idx: np.ndarray) -> ArrayData:
    return ArrayData(data.x[idx], data.y[idx])


def ensemble_logits(models: Sequence[nn.Module], data: ArrayData, normalize: Normalizer, batch_size: int = 256) -> np.ndarray:
    """Logits of every member on every sample as float32 (N, M, C): the aggregator's input."""
    return member_logits(models, data, normalize, batch_size).permute(1, 0, 2).numpy()
