"""The math of FENS's iterative baselines FedNova, Scaffold and FedAvg-STC, as pure functions on NumPy arrays.

FedNova (Wang et al. 2020, Sec. 4), Scaffold (Karimireddy et al. 2020, Alg. 1, option II) and the STC-style
upload of FedAvg-STC (FENS Sec. B.2) as the FENS authors run them (`distoptim/FedNova.py`,
`distoptim/Scaffold.py`); where their code differs from the papers: docs/readings.md#fens-iterative.
A model state is a dict name -> array; only the names in `keys` (the trainable parameters) get the
method's update, the other entries (buffers) the clients' weighted mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hetfl.common.comm import densify, encode_sparse
from hetfl.common.compression import topk_sparsify

State = Mapping[str, np.ndarray]

# record names of the messages, and node-state names (per client: hetfl.common.task.state_key)
CONTROL = "control"  # Scaffold: c in a train message, Delta c_i in a reply
CONTROL_OWN = "control-own"  # Scaffold: the client's c_i, sent when its node may not hold it
SCAFFOLD = "scaffold"  # Scaffold: {"ci-round": round the client's c_i last changed, 0 = never}
CI_STATE, CI_ROUND_STATE = "scaffold-ci", "scaffold-ci-round"  # Scaffold node state: c_i and its round
STC_UPDATE, STC_PREFIX = "update", "delta"  # FedAvg-STC reply: the sparse update under update/delta.{val,pos,hdr}
STC_RESIDUAL = "stc-residual"  # FedAvg-STC node state with stc-error-feedback: what was not uploaded


def data_weights(num_examples: Sequence[float]) -> np.ndarray:
    """p_i = n_i / sum_j n_j over the round's accepted clients (the authors' ``weights = data_based``)."""
    n = np.asarray(num_examples, dtype=np.float64)
    total = n.sum()
    if total <= 0:
        raise ValueError("no client has data: the weights are undefined")
    return n / total


def weighted_mean(ys: Sequence[State], p: np.ndarray, key: str) -> np.ndarray:
    """sum_i p_i y_i[key] in float64."""
    return sum(float(w) * np.asarray(y[key], np.float64) for w, y in zip(p, ys, strict=True))


# --- FedNova ------------------------------------------------------------------------------------


def fednova_normalizer(steps: int, momentum: float = 0.0) -> float:
    """FedNova's ||a_i||_1 for `steps` local SGD steps with momentum rho (authors' ``local_normalizing_vec``).

    Plain SGD: tau_i. With momentum: sum_{k=1..tau} (1 - rho^k) / (1 - rho), accumulated step by step as the
    authors' ``FedNova.step`` does (counter = rho * counter + 1; a += counter). docs/readings.md#fens-fednova
    """
    if steps < 0:
        raise ValueError(f"steps = {steps}; expected >= 0")
    if momentum == 0.0:
        return float(steps)
    a = counter = 0.0
    for _ in range(steps):
        counter = counter * momentum + 1.0
        a += counter
    return a


def fednova_direction(x: State, ys: Sequence[State], p: np.ndarray, a: Sequence[float], keys: Sequence[str]
                      ) -> tuple[dict[str, np.ndarray], float]:
    """(d, tau_eff): d = sum_i p_i (tau_eff / a_i) (x - y_i), tau_eff = sum_i p_i a_i (FedNova Eq. 7; authors' ``average``).

    x - y_i is the client's accumulated local change (the authors' ``cum_grad``).
    """
    a = np.asarray(a, dtype=np.float64)
    if np.any(a <= 0):
        raise ValueError(f"FedNova normalizers must be > 0, got {a.tolist()}")
    tau_eff = float(np.dot(p, a))
    scale = p * tau_eff / a
    d = {k: sum(float(s) * (np.asarray(x[k], np.float64) - np.asarray(y[k], np.float64))
                for s, y in zip(scale, ys, strict=True)) for k in keys}
    return d, tau_eff


def fednova_step(x: State, d: Mapping[str, np.ndarray], lr: float, gmf: float,
                 buf: Mapping[str, np.ndarray] | None) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray] | None]:
    """The server's move along d (authors' ``FedNova.average``): x - d, or with global momentum gmf > 0
    buf = d / lr (first round) else gmf * buf + d / lr, and x - lr * buf. Returns (new x on d's keys, buf)."""
    if gmf == 0.0:
        return {k: np.asarray(x[k], np.float64) - d[k] for k in d}, None
    new_buf = {k: d[k] / lr if buf is None else gmf * np.asarray(buf[k], np.float64) + d[k] / lr for k in d}
    return {k: np.asarray(x[k], np.float64) - lr * new_buf[k] for k in d}, new_buf


# --- Scaffold -----------------------------------------------------------------------------------


def scaffold_correction(c: State, c_i: State) -> dict[str, np.ndarray]:
    """c - c_i: what every local gradient gets added, y <- y - lr (g - c_i + c) (Scaffold Alg. 1 line 10)."""
    return {k: (np.asarray(c[k], np.float32) - np.asarray(c_i[k], np.float32)) for k in c}


def scaffold_control_delta(x: State, y: State, c: State, steps: int, lr: float) -> dict[str, np.ndarray]:
    """Delta c_i = c_i^+ - c_i = (x - y) / (K lr) - c (option II, Alg. 1 line 12; authors' ``average``), float32.

    A client that took no step (no data) keeps its control variate: Delta c_i = 0.
    """
    if steps <= 0:
        return {k: np.zeros_like(np.asarray(c[k], np.float32)) for k in c}
    return {k: ((np.asarray(x[k], np.float64) - np.asarray(y[k], np.float64)) / (steps * lr)
                - np.asarray(c[k], np.float64)).astype(np.float32) for k in c}


def apply_delta(c_i: State, delta: State) -> dict[str, np.ndarray]:
    """c_i + Delta c_i in float32: the client's new control variate, computed alike on the node and in the server's
    copy so the two stay bit-identical."""
    return {k: (np.asarray(c_i[k], np.float32) + np.asarray(delta[k], np.float32)).astype(np.float32) for k in delta}


def scaffold_server_control(c: State, deltas: Sequence[State], num_clients: int) -> dict[str, np.ndarray]:
    """c + (1 / N) sum_{i in S} Delta c_i (Alg. 1 line 17 with |S|/N * mean = sum / N), float32."""
    if num_clients <= 0:
        raise ValueError(f"num_clients = {num_clients}; expected > 0")
    return {k: (np.asarray(v, np.float64) + sum(np.asarray(dl[k], np.float64) for dl in deltas) / num_clients
                ).astype(np.float32) for k, v in c.items()}


def scaffold_model(x: State, ys: Sequence[State], p: np.ndarray, keys: Sequence[str], server_lr: float
                   ) -> dict[str, np.ndarray]:
    """x + eta_g sum_i p_i (y_i - x) on `keys` (authors: data-size weights p_i; the paper averages uniformly)."""
    return {k: np.asarray(x[k], np.float64) + server_lr * (weighted_mean(ys, p, k) - np.asarray(x[k], np.float64))
            for k in keys}


# --- FedAvg-STC ---------------------------------------------------------------------------------

STC_VALUE_DTYPE = np.float16


def stc_encode(delta: np.ndarray, density: float, segments: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The upload of FedAvg-STC: the top `density` share of |delta| (:func:`topk_sparsify`; per segment if given),
    values in 16 bits, positions as :func:`~hetfl.common.comm.encode_sparse` stores them (a bitmap at 50%).
    docs/readings.md#fens-stc"""
    idx, val = topk_sparsify(delta, density, segments)
    enc = encode_sparse(idx, val, int(np.size(delta)))
    enc["val"] = enc["val"].astype(STC_VALUE_DTYPE)
    return enc


def stc_decode(enc: Mapping[str, np.ndarray]) -> np.ndarray:
    """Dense float32 update from :func:`stc_encode`'s arrays; ValueError if the values are not 16-bit floats."""
    if np.asarray(enc["val"]).dtype != STC_VALUE_DTYPE:
        raise ValueError(f"STC values of dtype {np.asarray(enc['val']).dtype}, expected {np.dtype(STC_VALUE_DTYPE)}")
    return densify(dict(enc))
