"""AdaptiveFL's math as pure functions: submodel pool, slicing, client-side pruning, Alg. 2, RL selection.

Reading of the paper (each point explained in docs/readings.md#adaptivefl):

* Pool R = [S_p..S_1, M_p..M_1, L_1] (pool index 0 .. 2p): level ratio r_w, start layer I;
  layers k <= I keep full width, layers k > I keep floor(d_k * r_w) channels (floor reproduces
  Table 1's VGG16 counts to within 0.01M). Index j = 1 has the largest start layer (largest model).
* Client-side pruning (Sec. 3.2, argmax size s.t. size <= Gamma, I >= tau) picks among pool
  members that are *contained* in the received model (every layer no wider), because a device
  can only keep parameters it received; e.g. M3 (I=4) can shrink to S3 but not to S1 (I=8).
* RL tables (Alg. 1 lines 12-26), rewards and selection (Sec. 3.3) as the authors' code runs
  them (the extracted text is garbled; docs/readings.md#adaptivefl-tables); a device that
  cannot fit even the smallest contained model returns nothing (an extension: the paper assumes
  the smallest model always fits); its resource scores are all penalised.
* Devices (Sec. 4.1, uncertain environments): a capacity drawn at every request from a clipped
  Gaussian per tier, the authors' VGG16 numbers scaled to the pool (docs/readings.md#adaptivefl-devices).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from hetfl.common.models import build_model, count_parameters, hidden_widths, pruned_widths

from .keys import TIERS  # weak, medium, strong (declared with the node-config key capacity)

TYPES = ("S", "M", "L")
DEFAULT_STARTS = {"cnn": (2, 1), "mlp": (2, 1), "resnet8": (2, 1), "resnet18": (6, 4, 2), "resnet34": (10, 6, 2), "vgg16": (8, 6, 4),
                  "resnet18-afl": (7, 5, 3)}  # the authors' stage-level starts 4, 3, 2 (stem + stages kept whole)


@dataclass(frozen=True)
class PoolEntry:
    """One submodel of the pool: name (e.g. 'M2'), type (S/M/L), ratio r_w, start layer I, widths, #params, and
    for ScaleFL the number of early exits it runs (depth; 0 = the plain model)."""

    name: str
    type: str
    ratio: float
    start: int
    widths: tuple[int, ...]
    size: int
    depth: int = 0

    def contains(self, other: PoolEntry) -> bool:
        """True when `other` is a slice of this model (no layer wider, no deeper)."""
        deeper = (other.depth or math.inf) > (self.depth or math.inf)
        return not deeper and all(o <= s for o, s in zip(other.widths, self.widths, strict=True))


class SubmodelPool:
    """Sec. 3.2 / Table 1: the model pool R = {S_p..S_1, M_p..M_1, L_1}, ordered by strictly increasing size.

    Rounding, default start layers and why the CNN has p = 2: docs/readings.md#adaptivefl-pool.
    """

    def __init__(self, model: str | Callable[[tuple[int, ...]], torch.nn.Module], num_classes: int = 0,
                 in_shape: tuple[int, ...] = (), ratios: Sequence[float] = (0.66, 0.40), starts: Sequence[int] | None = None,
                 tau: int = 1, batch_stats: bool = False, *, widths: Sequence[int] | None = None) -> None:
        """`model`: a name of hetfl's prunable zoo (with `num_classes` and `in_shape`), or a model of one's own as a
        width-prunable builder: ``model(widths) -> nn.Module`` whose hidden layer k has ``widths[k]`` outputs, with
        `widths` its full model's, each state tensor of a narrower model a leading slice of the full one's (an MLP,
        a CNN whose channels are cut from the end). Default start layers: the zoo model's, else the two deepest that
        leave the output layer pruned, I = n-1 and n-2 of n hidden layers, never below `tau` (docs/api.md#adaptivefl)."""
        self.model, self.num_classes, self.in_shape = model, num_classes, tuple(in_shape)
        self.batch_stats = batch_stats  # BatchNorm without running statistics (docs/readings.md#adaptivefl-batchnorm)
        if callable(model):
            if not widths:
                raise ValueError("SubmodelPool: a model builder needs its full model's hidden widths: "
                                 "SubmodelPool(build, widths=(...)), build(widths) -> nn.Module")
            self.full = tuple(int(w) for w in widths)
            default = tuple(range(len(self.full) - 1, max(tau - 1, len(self.full) - 3), -1))  # the two deepest I
        else:
            self.full = hidden_widths(model, self.in_shape)
            default = DEFAULT_STARTS[model]
        starts = tuple(default if not starts else starts)
        if len(ratios) != 2 or not 1.0 > ratios[0] > ratios[1] > 0.0:
            raise ValueError(f"adaptivefl-ratios = {tuple(ratios)}: expected two ratios 1 > r_M > r_S > 0")
        if not starts or list(starts) != sorted(set(starts), reverse=True):
            raise ValueError(f"adaptivefl-starts = {starts}: expected distinct start layers in decreasing order")
        if min(starts) < tau or max(starts) >= len(self.full):
            raise ValueError(f"adaptivefl-starts = {starts}: each start layer I must satisfy tau = {tau} <= I < "
                             f"{len(self.full)} (the {getattr(model, '__name__', model)} has {len(self.full)} hidden "
                             "layers)")
        self.p, self.tau, self.ratios, self.starts = len(starts), tau, tuple(ratios), starts
        entries = []
        for t, r in (("S", ratios[1]), ("M", ratios[0])):
            for j in range(self.p, 0, -1):  # S_p .. S_1
                w = pruned_widths(self.full, r, starts[j - 1])
                entries.append(PoolEntry(f"{t}{j}", t, r, starts[j - 1], w, self.size_of(w)))
        entries.append(PoolEntry("L1", "L", 1.0, len(self.full), self.full, self.size_of(self.full)))
        sizes = [e.size for e in entries]
        if any(a >= b for a, b in zip(sizes, sizes[1:])):
            raise ValueError("submodel sizes are not strictly increasing along the pool: "
                             + ", ".join(f"{e.name}={e.size}" for e in entries) + "; change adaptivefl-starts/-ratios")
        self.entries: list[PoolEntry] = entries

    def size_of(self, widths: tuple[int, ...]) -> int:
        """#parameters of this architecture with the given hidden widths (built on the meta device)."""
        with torch.device("meta"):
            return count_parameters(self._build(widths))

    def _build(self, widths: tuple[int, ...]) -> torch.nn.Module:
        if callable(self.model):
            return self.model(tuple(widths))
        return build_model(self.model, self.num_classes, self.in_shape, widths=widths, batch_stats=self.batch_stats)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> PoolEntry:
        return self.entries[i]

    @property
    def largest(self) -> int:
        return len(self.entries) - 1

    def index(self, name: str) -> int:
        return [e.name for e in self.entries].index(name)

    def type_index(self, i: int) -> int:
        """0, 1, 2 for S, M, L."""
        return TYPES.index(self.entries[i].type)

    def build(self, i: int) -> torch.nn.Module:
        """A real (smaller) nn.Module for pool member i."""
        return self._build(self.entries[i].widths)

    def shapes(self, i: int) -> dict[str, tuple[int, ...]]:
        """State-dict shapes of pool member i (parameters and buffers)."""
        with torch.device("meta"):
            return {k: tuple(v.shape) for k, v in self.build(i).state_dict().items()}

    def tier_capacity(self, tier: str) -> int:
        """Sec. 4.1 device classes: weak = size(S_1), medium = size(M_1), strong = size(L_1)."""
        return self.entries[self.index({"weak": "S1", "medium": "M1", "strong": "L1"}[tier])].size

    def fit(self, received: int, capacity: float) -> int | None:
        """Sec. 3.2 resource-aware pruning: the largest pool member inside `received` with size <= capacity.

        docs/readings.md#adaptivefl-pruning
        """
        best = None
        for i, e in enumerate(self.entries):
            if e.size <= capacity and self.entries[received].contains(e) and e.start >= self.tau:
                best = i if best is None or e.size > self.entries[best].size else best
        return best

    def table(self) -> str:
        """Per-level parameter counts (compare with Table 1)."""
        full = self.entries[-1].size
        rows = [f"{e.name:>3}  r_w={e.ratio:.2f}  I={e.start if e.type != 'L' else 'N/A':>3}  "
                f"{e.size / 1e6:7.2f}M  ratio {e.size / full:.2f}" for e in reversed(self.entries)]
        return "\n".join(rows)


def uniform_ratio(size_of: Callable[[tuple[int, ...]], int], full: tuple[int, ...], capacity: float,
                  top: int = 99) -> float:
    """Largest width ratio r in hundredths (1 .. top) with every hidden layer of `full` scaled by r and
    size_of(widths) <= capacity: HeteroFL's and ScaleFL's levels sized to the device tiers
    (docs/readings.md#adaptivefl-baselines)."""
    lo, hi = 1, top
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if size_of(pruned_widths(full, mid / 100, 0)) <= capacity:
            lo = mid
        else:
            hi = mid - 1
    return lo / 100


def slice_state(state: dict[str, np.ndarray], shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Sec. 3.2: W[:d*r][:n*r] - the leading slice of every tensor (copies; docs/readings.md#adaptivefl-slicing)."""
    return {k: np.array(state[k][tuple(slice(0, s) for s in shape)]) for k, shape in shapes.items()}


def aggregate_submodels(global_state: dict[str, np.ndarray], states: Sequence[dict[str, np.ndarray]],
                        weights: Sequence[float]) -> dict[str, np.ndarray]:
    """Algorithm 2: per element, the weighted mean over the submodels covering it; uncovered elements keep their value.

    BN running statistics are averaged the same way (docs/readings.md#adaptivefl-aggregation).
    """
    out = {}
    for k, g in global_state.items():
        acc = np.zeros(g.shape, np.float64)
        w = np.zeros(g.shape, np.float64)
        for st, n in zip(states, weights, strict=True):
            if k not in st:
                continue
            sl = tuple(slice(0, s) for s in st[k].shape)
            acc[sl] += np.asarray(st[k], np.float64) * n
            w[sl] += n
        new = np.where(w > 0, acc / np.maximum(w, 1e-300), g)
        out[k] = np.rint(new).astype(g.dtype) if np.issubdtype(g.dtype, np.integer) else new.astype(g.dtype)
    return out


def waste_rate(sent_sizes: Sequence[int], back_sizes: Sequence[int]) -> float:
    """Sec. 4 communication waste: 1 - sum(size returned) / sum(size sent) (0 when nothing was sent).

    docs/readings.md#adaptivefl-evaluation
    """
    total = float(sum(sent_sizes))
    return 1.0 - float(sum(back_sizes)) / total if total else 0.0


# --- RL-based client selection (Alg. 1 lines 1-2 and 12-26, Sec. 3.3) ---------------------------


def init_tables(num_clients: int, p: int) -> tuple[np.ndarray, np.ndarray]:
    """Alg. 1 lines 1-2: Tc (3 x |C|) and Tr ((2p+1) x |C|), all ones."""
    return np.ones((3, num_clients)), np.ones((2 * p + 1, num_clients))


def update_tables(Tc: np.ndarray, Tr: np.ndarray, c: int, sent: int, back: int | None, p: int,
                  type_of: Sequence[int]) -> None:
    """Alg. 1 lines 12-26 (in place) as the authors' code runs it, for client column c after sending `sent`, getting `back`.

    Accepted (back = sent): Tr[t] += 1 for t = sent..L1, and Tr[L1] += p more only when sent = L1.
    Pruned (back < sent): Tr[back] += p, then Tr[t] = max(Tr[t] - penalty, 0) for t = back+1..L1 with
    the penalty 1, 2, 3, .. Tc[type(sent)] and Tc[type(back)] rise by 1 (docs/readings.md#adaptivefl-tables).
    ``type_of[i]`` is the type (0 S, 1 M, 2 L) of pool index i; the largest index is L1.
    ``back = None`` (nothing fit, an extension: docs/readings.md#adaptivefl-nothing-fits) counts the
    curiosity of the sent type once and penalises every resource score with the growing penalty
    from the smallest model up.
    """
    top = Tr.shape[0] - 1
    Tc[type_of[sent], c] += 1
    if back is None:
        for k, t in enumerate(range(0, top + 1)):
            Tr[t, c] = max(Tr[t, c] - (k + 1), 0.0)
        return
    Tc[type_of[back], c] += 1
    if back == sent:  # trained as sent
        Tr[sent:, c] += 1
        if sent == top:
            Tr[top, c] += p
    else:  # pruned to `back`
        Tr[back, c] += p
        for k, t in enumerate(range(back + 1, top + 1)):
            Tr[t, c] = max(Tr[t, c] - (k + 1), 0.0)


def resource_reward(Tr: np.ndarray, m: int, type_of: Sequence[int]) -> np.ndarray:
    """Sec. 3.3 R_s(m, c) for all clients: mean over the pool indices k of type(m) of sum_{t >= k} Tr[t] / sum_t Tr[t].

    With p = 3: R_s(S) = (sum Tr[0:] + sum Tr[1:] + sum Tr[2:]) / (3 total), R_s(L) = Tr[L1] / total
    (the authors' code; docs/readings.md#adaptivefl-rewards). 0 for a client whose scores are all 0.
    """
    ks = [k for k in range(Tr.shape[0]) if type_of[k] == type_of[m]]
    num = sum(Tr[k:].sum(axis=0) for k in ks)
    den = len(ks) * Tr.sum(axis=0)
    return np.divide(num, den, out=np.zeros(Tr.shape[1]), where=den > 0)


def curiosity_reward(Tc: np.ndarray, m: int, type_of: Sequence[int]) -> np.ndarray:
    """Sec. 3.3 R_c(m, c) = 1 / sqrt(Tc[type(m)][c]) (MBIE-EB)."""
    return 1.0 / np.sqrt(Tc[type_of[m]])


REWARD_MODES = ("rl", "curiosity", "resource")


def rewards(Tc: np.ndarray, Tr: np.ndarray, m: int, type_of: Sequence[int], mode: str = "rl") -> np.ndarray:
    """R(m, c) = min(R_s, 0.5) * R_c ('rl'); Table 4 ablations +C = R_c alone ('curiosity'), +S = R_s uncapped ('resource').

    docs/readings.md#adaptivefl-rewards
    """
    if mode == "curiosity":
        return curiosity_reward(Tc, m, type_of)
    rs = resource_reward(Tr, m, type_of)
    if mode == "resource":
        return rs
    if mode != "rl":
        raise ValueError(f"reward mode {mode!r}; expected one of {REWARD_MODES}")
    return np.minimum(rs, 0.5) * curiosity_reward(Tc, m, type_of)


def selection_probabilities(R: np.ndarray, excluded: Sequence[int] = ()) -> np.ndarray | None:
    """P(m, c) = R(m, c) / sum_j R(m, j) over clients not yet chosen; None when every reward is 0."""
    R = np.array(R, dtype=np.float64)
    R[list(excluded)] = 0.0
    total = R.sum()
    return R / total if total > 0 else None


class ClientSelector:
    """Alg. 1 ClientSel + table updates over node ids (columns are added as nodes appear).

    docs/readings.md#adaptivefl-selection
    """

    MODES = ("rl", "curiosity", "resource", "random")

    def __init__(self, pool: SubmodelPool, mode: str = "rl", seed: int = 0) -> None:
        if mode not in self.MODES:
            raise ValueError(f"selector mode {mode!r}; expected one of {self.MODES}")
        self.pool, self.mode, self.p = pool, mode, pool.p
        self.type_of = [pool.type_index(i) for i in range(len(pool))]
        self.nodes: list[int] = []
        self._col: dict[int, int] = {}  # client id -> its column (the order in which clients first appeared)
        self.Tc, self.Tr = init_tables(0, self.p)
        self.rng = np.random.default_rng([seed, 0xADA])

    def _columns(self, nodes: Sequence[int]) -> list[int]:
        """The table columns of `nodes`; clients not seen before get new columns, in order, with one resize."""
        new = [n for n in dict.fromkeys(int(n) for n in nodes) if n not in self._col]
        if new:
            for n in new:
                self._col[n] = len(self.nodes)
                self.nodes.append(n)
            tc, tr = init_tables(len(new), self.p)
            self.Tc, self.Tr = np.hstack([self.Tc, tc]), np.hstack([self.Tr, tr])
        return [self._col[int(n)] for n in nodes]

    def _column(self, node: int) -> int:
        return self._columns([node])[0]

    def select(self, m: int, candidates: Sequence[int], chosen: Sequence[int] = ()) -> int | None:
        """One client for pool index m among `candidates`, never one in `chosen` or with zero reward."""
        cols = self._columns(candidates)
        taken = set(chosen)
        excluded = [i for i, n in enumerate(candidates) if n in taken]
        if self.mode == "random":
            R = np.ones(len(cols))
        else:
            R = rewards(self.Tc, self.Tr, m, self.type_of, self.mode)[cols]
        P = selection_probabilities(R, excluded)
        if P is None:
            return None
        return int(candidates[int(self.rng.choice(len(cols), p=P))])

    def update(self, node: int, sent: int, back: int | None) -> None:
        """Record that `node` returned pool index `back` (None: nothing) for `sent`."""
        c = self._column(node)  # may grow the tables: look them up afterwards
        update_tables(self.Tc, self.Tr, c, sent, back, self.p, self.type_of)

    def state(self) -> dict[str, np.ndarray]:
        """Tables and node ids (for checkpoints)."""
        return {"Tc": self.Tc.copy(), "Tr": self.Tr.copy(), "nodes": np.array([str(n) for n in self.nodes])}

    def load(self, st: dict[str, np.ndarray]) -> None:
        self.Tc, self.Tr = np.array(st["Tc"]), np.array(st["Tr"])
        self.nodes = [int(n) for n in st["nodes"]]
        self._col = {n: i for i, n in enumerate(self.nodes)}


def planning_rng(seed: int) -> np.random.Generator:
    """The server's planning stream (RandomSel draws and the baselines' samplers), one per run seed."""
    return np.random.default_rng([seed, 0xAF])


def plan_round(pool: SubmodelPool, selector: ClientSelector, rng: np.random.Generator, candidates: Sequence[int],
               k: int, dispatch: str = "random") -> list[tuple[int, int]]:
    """Alg. 1 lines 6-8 for one round: (client, pool index) jobs; docs/readings.md#adaptivefl-selection.

    Parameters
    ----------
    selector : ClientSel; its tables are not updated here (the caller does so once replies are in).
    rng : draws RandomSel(R): one uniform pool index per slot, then, should no remaining client have a
        positive reward for it, the other members in a random order (the authors redraw).
    candidates : client ids that may be chosen; at most one job per client.
    k : slots this round (at most ``len(candidates)`` are filled; fewer if no client can take any member).
    dispatch : "random" (RandomSel) or "largest" (always L1: the +Greed ablation, Sec. 4.4).
    """
    if dispatch not in ("random", "largest"):
        raise ValueError(f"dispatch {dispatch!r}; expected 'random' or 'largest'")
    out: list[tuple[int, int]] = []
    chosen: list[int] = []
    for _ in range(min(k, len(candidates))):
        if dispatch == "largest":
            order = [pool.largest]
        else:
            first = int(rng.integers(len(pool)))
            order = [first] + [int(i) for i in rng.permutation(len(pool)) if i != first]
        for m in order:
            c = selector.select(m, candidates, chosen)
            if c is not None:
                out.append((c, m))
                chosen.append(c)
                break
    return out


def assign_tiers(num_partitions: int, proportions: Sequence[float], seed: int) -> list[str]:
    """Sec. 4.1 device heterogeneity: tiers weak/medium/strong in the given proportions (default 4:3:3), shuffled.

    docs/readings.md#adaptivefl-devices
    """
    props = np.asarray(proportions, np.float64)
    counts = np.floor(props / props.sum() * num_partitions).astype(int)
    for i in np.argsort(-(props / props.sum() * num_partitions - counts))[: num_partitions - counts.sum()]:
        counts[i] += 1
    tiers = [t for t, n in zip(TIERS, counts, strict=True) for _ in range(n)]
    order = np.random.default_rng([seed, 0x7E]).permutation(num_partitions)
    return [tiers[i] for i in order]


# The authors' device model (VGG16, millions of parameters): per tier loc, scale, low, high of a clipped
# Gaussian, and the VGG16 pool member (Table 1 size) it is measured against.
AUTHORS_DEVICES = {"weak": (8.0, 1.0, 6.0, 11.0, "S1", 8.39), "medium": (16.0, 1.0, 13.0, 19.0, "M1", 16.81),
                   "strong": (35.0, 2.0, 25.0, 40.0, "L1", 33.65)}


@dataclass(frozen=True)
class Capacity:
    """One tier's capacity in parameters: clip(N(loc, scale), low, high) drawn at every request (scale 0: fixed)."""

    loc: float
    scale: float
    low: float
    high: float

    def draw(self, rng: np.random.Generator) -> float:
        if self.scale == 0:
            return self.loc
        return float(np.clip(rng.normal(self.loc, self.scale), self.low, self.high))

    def p_fits(self, size: float) -> float:
        """P(a request's capacity >= size): the normal's upper tail, 1 below `low`, 0 above `high`."""
        if self.scale == 0:
            return float(self.loc >= size)
        if size <= self.low:
            return 1.0
        if size > self.high:
            return 0.0
        return 0.5 * math.erfc((size - self.loc) / (self.scale * math.sqrt(2)))


def largest_affordable(capacity: Capacity, sizes: Sequence[float]) -> float:
    """Expected size of the largest of `sizes` that one request affords (0 if none fits).

    The most any selector can get back from a device of this tier per request: the bound that the
    comparison with All-Large (which ignores capacities) is read against (docs/results/adaptivefl-fmnist-r30.md).
    """
    s = sorted(sizes)
    fits = [capacity.p_fits(x) for x in s] + [0.0]
    return sum(x * (fits[i] - fits[i + 1]) for i, x in enumerate(s))


def tier_capacities(pool: SubmodelPool, mode: str = "gaussian") -> dict[str, Capacity]:
    """Sec. 4.1 devices: per tier, the authors' clipped Gaussian scaled to this pool, or the fixed S1/M1/L1 size.

    Each tier's numbers are the authors' VGG16 ones times size(ref) / size_VGG16(ref), ref = S1, M1, L1.
    A weak device's upper limit is kept below the smallest medium model and a medium device's below
    L1, so no fluctuation lets a tier train a larger type (docs/readings.md#adaptivefl-devices).
    """
    if mode == "fixed":
        return {t: Capacity(float(pool.tier_capacity(t)), 0.0, 0.0, 0.0) for t in TIERS}
    if mode != "gaussian":
        raise ValueError(f"adaptivefl-tier-capacity = {mode!r}; expected 'gaussian' or 'fixed'")
    smallest = {ty: min(e.size for e in pool.entries if e.type == ty) for ty in TYPES}
    ceiling = {"weak": smallest["M"] - 1, "medium": smallest["L"] - 1, "strong": math.inf}
    out = {}
    for tier, (loc, scale, low, high, ref, ref_size) in AUTHORS_DEVICES.items():
        k = pool[pool.index(ref)].size / ref_size
        out[tier] = Capacity(loc * k, scale * k, low * k, min(high * k, ceiling[tier]))
    return out


def budget_capacity(sizes: Sequence[float], seconds: Sequence[float], budget_s: float) -> float:
    """A measured device's capacity under a time budget (Sec. 3.2: devices prune to their available resources):
    the size of the largest pool member whose predicted local training time (`seconds`, aligned with `sizes`, the
    pool in increasing size) fits `budget_s`; the smallest member's size where none fits."""
    fits = [size for size, t in zip(sizes, seconds, strict=True) if t <= budget_s]
    return float(max(fits) if fits else min(sizes))


def request_capacity(capacity: Capacity, seed: int, server_round: int, pid: int, request: int = 0) -> float:
    """This request's capacity of device `pid` (deterministic per seed, round, device and request)."""
    return capacity.draw(np.random.default_rng([seed, server_round, pid, request, 0xF1]))
