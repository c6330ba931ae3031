"""SHEFL's math as pure functions: roles, cluster sampling, permutation schedule, densities, weights.

Sources: SHEFL full paper (Algorithm 1, Eq. 2) and ICASSP version (Eq. 1-2); where they
are ambiguous, the reading the code follows is explained in docs/readings.md#shefl.
"""

from __future__ import annotations

from functools import lru_cache

from dataclasses import dataclass

import numpy as np


def measured_classes(speeds: dict[int, float], hpc_fraction: float, hpc_speed: float = 0.0) -> dict[int, str]:
    """HPC or LPC from measured training speed (Sec. 3: clients are grouped into HPCs and LPCs beforehand by their
    computing power): at or above `hpc_speed` samples/s, or with `hpc_speed` 0 the fastest
    round(n x `hpc_fraction`) of the n devices (ties by client id). Client id -> "hpc" | "lpc"."""
    if hpc_speed > 0:
        return {c: "hpc" if v >= hpc_speed else "lpc" for c, v in speeds.items()}
    ranked = sorted(speeds, key=lambda c: (-float(speeds[c]), c))
    fast = set(ranked[: int(round(len(ranked) * hpc_fraction))])
    return {c: "hpc" if c in fast else "lpc" for c in speeds}


@lru_cache(maxsize=8)
def hpc_partitions(num_partitions: int, hpc_fraction: float, seed: int) -> frozenset[int]:
    """Partition ids that are high-power clients in simulation: a seeded subset of round(N * fraction).

    Deployment nodes declare their class instead (docs/readings.md#shefl-roles).
    """
    n_hpc = int(round(num_partitions * hpc_fraction))
    rng = np.random.default_rng([seed, 0x5EF1])
    return frozenset(rng.choice(num_partitions, n_hpc, replace=False).tolist())


def make_clusters(node_ids: list[int], num_clusters: int, seed: int) -> list[list[int]]:
    """Split nodes into `num_clusters` near-equal clusters at random (Alg. 1 line 3, cluster-based sampling).

    The split depends on the order of `node_ids` (the server passes them ordered by client id).
    HPCs and LPCs are clustered separately (docs/readings.md#shefl-sampling)."""
    if num_clusters == 0:
        return []
    if len(node_ids) < num_clusters:
        raise ValueError(f"{len(node_ids)} nodes cannot form {num_clusters} clusters")
    rng = np.random.default_rng([seed, 0xC1])
    ids = [int(n) for n in node_ids]  # in the caller's order; uint64 ids: permute positions, never the values
    order = rng.permutation(len(ids))
    return [[ids[i] for i in sorted(chunk)] for chunk in np.array_split(order, num_clusters)]


def sample_from_clusters(clusters: list[list[int]], rng: np.random.Generator,
                         available: set[int] | None = None) -> list[int]:
    """One client drawn uniformly from each cluster (Alg. 1 line 6, RandSelect(S_c)), among its `available` clients
    (default: all). A cluster with none available keeps a draw from all its clients, whose slot then stays empty;
    one draw per cluster either way, so the RNG stream does not depend on who is available."""
    out = []
    for c in clusters:
        pool = c if available is None else [m for m in c if m in available] or c
        out.append(int(pool[rng.integers(len(pool))]))
    return out


class PermutationSchedule:
    """LPC slot i trains model P[i, t mod M]; P regenerated every M rounds (Fed-Ensemble's permutation matrix).

    Every row of P is a permutation of the M models (a slot trains each model once per
    M-round block) and every column is balanced (per round each model gets C_l/M slots,
    counts differ by at most one). Construction: the cyclic Latin rectangle
    P0[i, j] = (i + j) mod M with rows, columns and model labels permuted at random,
    seeded by (seed, block). Rounds are 1-based; block b covers rounds bM+1 .. (b+1)M
    (the paper's "t mod M = 0" regeneration, aligned so that each block has M rounds).
    Why a Latin rectangle rather than independent row shuffles: docs/readings.md#shefl-schedule.
    """

    def __init__(self, num_models: int, num_slots: int, seed: int = 0) -> None:
        if num_models < 1 or num_slots < 0:
            raise ValueError("need num_models >= 1 and num_slots >= 0")
        self.M, self.slots, self.seed = num_models, num_slots, seed

    def matrix(self, block: int) -> np.ndarray:
        """P for one block of M rounds: shape (num_slots, M)."""
        rng = np.random.default_rng([self.seed, block, 0x9E])
        rows = rng.permutation(self.slots)
        cols = rng.permutation(self.M)
        labels = rng.permutation(self.M)
        base = (rows[:, None] + cols[None, :]) % self.M
        return labels[base]

    def models_for_round(self, server_round: int) -> np.ndarray:
        """Model index of each LPC slot in a (1-based) round."""
        t = server_round - 1
        return self.matrix(t // self.M)[:, t % self.M]


def topk_densities(k: float, ratio: float, num_models: int) -> tuple[float, float]:
    """(k_l, k_h): LPC density k; an HPC's budget is r times an LPC's, spread over M models -> min(1, k r / M).

    docs/readings.md#shefl-densities
    """
    return k, min(1.0, k * ratio / num_models)


COEFFICIENTS = ("balanced", "paper-full", "paper-icassp", "uniform")


def workload_weights(H: int, L: int, mode: str = "balanced", M: int = 5, C_h: int = 5, C_l: int = 5) -> tuple[float, float]:
    """(a_h, a_l) for w_t^m = w_{t-1}^m + 1/(H+L) * sum_i a_i delta_i (SHEFL Eq. 2).

    - balanced (default; docs/readings.md#shefl-coefficients): from the actual counts H, L of HPC/LPC replies
      for model m, a_h = (H+L)/(2H), a_l = (H+L)/(2L): the HPC mean and the LPC mean each
      get weight 1/2. If one group is empty the other's mean gets weight 1.
    - paper-full: a_h = (M C_h + C_l)/(2 M^2), a_l = (M C_h + C_l)/(2M) (full paper Eq. 2;
      equals balanced when C_h = C_l = M = 5 and no client fails).
    - paper-icassp: a_h = (H+L)/(2M) * L/H, a_l = (H+L)/2 (ICASSP Eq. 2, as printed).
    - uniform: a_h = a_l = 1 (plain mean of deltas; Fed-Ensemble).
    """
    if H < 0 or L < 0:
        raise ValueError("counts must be >= 0")
    if mode == "uniform":
        return 1.0, 1.0
    if mode == "paper-full":
        return (M * C_h + C_l) / (2 * M**2), (M * C_h + C_l) / (2 * M)
    if mode == "paper-icassp":
        return ((H + L) / (2 * M) * L / H if H else 0.0), (H + L) / 2
    if mode == "balanced":
        if H == 0 or L == 0:
            return 1.0, 1.0
        return (H + L) / (2 * H), (H + L) / (2 * L)
    raise ValueError(f"unknown coefficients mode {mode!r}; expected one of {COEFFICIENTS}")


def aggregate_deltas(hpc: list[np.ndarray], lpc: list[np.ndarray], a_h: float, a_l: float) -> np.ndarray | None:
    """1/(H+L) * (a_h * sum HPC deltas + a_l * sum LPC deltas); None when nothing arrived.

    The papers scale each delta on the client; scaling here gives the same top-k entries
    (docs/readings.md#shefl-coefficients).
    """
    H, L = len(hpc), len(lpc)
    if H + L == 0:
        return None
    total = np.zeros_like((hpc or lpc)[0], dtype=np.float64)
    for d in hpc:
        total += a_h * d
    for d in lpc:
        total += a_l * d
    return (total / (H + L)).astype(np.float32)


@dataclass
class RoundPlan:
    """Who trains what in one round."""

    hpc_nodes: list[int]
    lpc_nodes: list[int]
    lpc_models: list[int]  # model of each LPC node (same order)

    def assignments(self, num_models: int) -> dict[int, list[int]]:
        """node -> models it trains (HPCs: all M; LPCs: one)."""
        out = {n: list(range(num_models)) for n in self.hpc_nodes}
        for n, m in zip(self.lpc_nodes, self.lpc_models, strict=True):
            out[n] = [int(m)]
        return out
