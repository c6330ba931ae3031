"""The one-shot ensemble as pure functions: the seeded client split, the members built from their states, their
logits (cached by content), label-count weights, and :class:`Ensemble`, what phase 1 produced (FENS Sec. 3.1).

How the code reads the FENS paper and the authors' code: docs/readings.md#fens.
"""

from __future__ import annotations

import hashlib

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

from hetfl.common.compression import dequantize_state
from hetfl.data.arrays import ArrayData
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


def states_digest(states: Sequence[dict[str, np.ndarray]]) -> str:
    """SHA-1 of an ensemble's states (names, dtypes, shapes and bytes, in order): what its logits depend on."""
    h = hashlib.sha1()
    for st in states:
        for k in sorted(st):
            a = np.ascontiguousarray(st[k])
            h.update(f"{k}|{a.dtype}|{a.shape}|".encode())
            h.update(a.tobytes())
    return h.hexdigest()


def cached_logits(models: Sequence[nn.Module], digest: str, data: ArrayData, normalize: Normalizer, cache_dir: str,
                  batch_size: int = 256, device: str | torch.device = "cpu", precision: str = "fp32") -> ArrayData:
    """:func:`ensemble_logits` of `data` with its labels, cached under `cache_dir` by content: the ensemble's
    `digest` (:func:`states_digest`), the data's bytes, the device and the precision. A study that trains many
    aggregators on one saved ensemble (hetfl.tune with fens-reuse) computes each set of logits once."""
    from hetfl.data.cache import cache_root, cached

    if data.x.dtype == object:  # texts: not content-hashed here
        return ArrayData(ensemble_logits(models, data, normalize, batch_size, device, precision), data.y)
    h = hashlib.sha1(f"{digest}|{torch.device(device)}|{precision}|{data.x.shape}|{data.x.dtype}".encode())
    h.update(np.ascontiguousarray(data.x).tobytes())
    h.update(np.ascontiguousarray(data.y).tobytes())
    path = cache_root(cache_dir) / "fens-logits" / f"{h.hexdigest()[:24]}.npz"
    return cached(path, lambda: ArrayData(ensemble_logits(models, data, normalize, batch_size, device, precision), data.y))


@dataclass
class Ensemble:
    """What phase 1 produced: the FP32 local models in client-id order and what the server knows of them.

    Saved as ``<run-dir>/ensemble.json`` (+ safetensors; :mod:`hetfl.common.oneshot.artifacts`) so that a resumed run, a
    ``fens-reuse`` run or an ``oneshot-reuse`` run continues with the same ensemble instead of training phase 1 again
    (docs/readings.md#fens-artifacts).
    """

    states: list[dict[str, np.ndarray]]
    client_ids: list[int]
    label_counts: np.ndarray  # (M, C) per-class counts of each member's 90% training split
    num_examples: list[int]
    phase1: dict[str, Any] = field(default_factory=dict)  # measured bytes and times of the run that trained it
    settings: dict[str, Any] = field(default_factory=dict)  # what decided the models (artifacts.phase1_settings)

    def to_state(self) -> dict[str, Any]:
        return {"kind": "fens-ensemble", "states": self.states, "client_ids": list(self.client_ids),
                "label_counts": np.asarray(self.label_counts, np.int64), "num_examples": list(self.num_examples),
                "phase1": self.phase1, "settings": self.settings}

    @classmethod
    def from_state(cls, st: Any) -> Ensemble:
        if not isinstance(st, dict) or st.get("kind") != "fens-ensemble":
            raise ValueError("not a FENS ensemble file (expected kind 'fens-ensemble')")
        return cls([dict(s) for s in st["states"]], [int(c) for c in st["client_ids"]], np.asarray(st["label_counts"]),
                   [int(n) for n in st["num_examples"]], dict(st["phase1"]), dict(st.get("settings", {})))


def label_count_weights(counts: np.ndarray) -> np.ndarray:
    """FedKD's weighted averaging: lambda_i^c = n_i^c / sum_j n_j^c (classes nobody holds: 1/M).

    n_i^c counts client i's 90% training split (docs/readings.md#fens-aggregators).
    """
    counts = np.asarray(counts, dtype=np.float64)
    tot = counts.sum(axis=0, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(tot > 0, counts / tot, 1.0 / counts.shape[0])
    return w.astype(np.float32)
