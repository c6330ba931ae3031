"""Update compression: top-k sparsification (Stich et al. 2018) over flattened model states."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def topk_count(size: int, density: float) -> int:
    """k = round(density * size), at least 1 for a non-empty vector, at most size."""
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must be in (0, 1], got {density}")
    return 0 if size == 0 else min(size, max(1, int(round(density * size))))


def topk_sparsify(vec: np.ndarray, density: float, segments: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Keep the k = density*d largest-magnitude entries (SHEFL Alg. 1 'TopK'; docs/readings.md#shefl-deltas).

    Returns (indices, values).

    With `segments` (lengths summing to len(vec), e.g. one per tensor) the density is
    applied to each segment separately ("per-tensor" top-k); indices stay global.
    Ties are broken by position, so the result is deterministic.
    """
    vec = np.asarray(vec).reshape(-1)
    if segments is None:
        segments = [len(vec)]
    if sum(segments) != len(vec):
        raise ValueError(f"segments sum to {sum(segments)}, vector has {len(vec)} entries")
    out, start = [], 0
    for n in segments:
        k = topk_count(n, density)
        if k == n:
            out.append(np.arange(start, start + n))
        elif k > 0:
            mag = np.abs(vec[start : start + n])
            # stable: sort by (-|v|, position) among a superset from argpartition
            part = np.argpartition(-mag, k - 1)[:k]
            kth = mag[part].min()
            cand = np.flatnonzero(mag >= kth)
            order = np.lexsort((cand, -mag[cand]))[:k]
            out.append(np.sort(cand[order]) + start)
        start += n
    idx = np.concatenate(out) if out else np.zeros(0, dtype=np.int64)
    return idx.astype(np.int64), vec[idx].astype(np.float32)


@dataclass(frozen=True)
class StateLayout:
    """How a model state (name -> array) maps to one flat float32 vector.

    Floating-point entries (parameters, BN running statistics) are concatenated in key
    order; integer entries (BN `num_batches_tracked`) are not part of the vector
    (docs/readings.md#shefl-deltas).
    """

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, state: Mapping[str, np.ndarray]) -> StateLayout:
        keys = tuple(k for k, v in state.items() if np.issubdtype(np.asarray(v).dtype, np.floating))
        return cls(keys, tuple(tuple(np.shape(state[k])) for k in keys))

    @property
    def segments(self) -> list[int]:
        return [int(np.prod(s)) for s in self.shapes]

    @property
    def size(self) -> int:
        return sum(self.segments)

    def flatten(self, state: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.concatenate([np.asarray(state[k], np.float32).reshape(-1) for k in self.keys]) if self.keys else np.zeros(0, np.float32)

    def unflatten(self, vec: np.ndarray, base: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`base` with its float entries replaced from `vec` (integer entries kept)."""
        out, pos = dict(base), 0
        for k, shape, n in zip(self.keys, self.shapes, self.segments, strict=True):
            out[k] = vec[pos : pos + n].reshape(shape).astype(np.asarray(base[k]).dtype)
            pos += n
        return out


def quantize_int8(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel INT8 post-training quantization (FENS B.3): q = round(w / s), s = max|w| / 127.

    Weight-only, unlike the authors' calibrated static quantization (docs/readings.md#fens-quantization).

    `w` has the output channel first (PyTorch layout); returns (int8 array of w's shape,
    float32 scales of shape (out_channels,)). All-zero channels get scale 1.
    """
    w = np.asarray(w, dtype=np.float32)
    flat = w.reshape(w.shape[0], -1)
    scale = np.abs(flat).max(axis=1) / 127.0
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(flat / scale[:, None]), -127, 127).astype(np.int8)
    return q.reshape(w.shape), scale.astype(np.float32)


def dequantize_int8(q: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Inverse of :func:`quantize_int8` (up to rounding: ``|error| <= scale / 2``)."""
    q = np.asarray(q)
    return (q.reshape(q.shape[0], -1).astype(np.float32) * np.asarray(scale, np.float32)[:, None]).reshape(q.shape)


def quantize_state(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """INT8 for every float tensor with >= 2 dims (conv/linear weights); 1-D tensors (biases, BN) and ints stay as they are.

    Keys: `<name>` holds the int8 or original array, `<name>.__scale` the per-channel scales.
    """
    out: dict[str, np.ndarray] = {}
    for k, v in state.items():
        v = np.asarray(v)
        if np.issubdtype(v.dtype, np.floating) and v.ndim >= 2:
            out[k], out[f"{k}.__scale"] = quantize_int8(v)
        else:
            out[k] = v
    return out


def dequantize_state(qstate: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Inverse of :func:`quantize_state`: float32 weights again."""
    out = {}
    for k, v in qstate.items():
        if k.endswith(".__scale"):
            continue
        scale = qstate.get(f"{k}.__scale")
        out[k] = dequantize_int8(v, scale) if scale is not None else np.asarray(v)
    return out
