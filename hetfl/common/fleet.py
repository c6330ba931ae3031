"""A fleet: tiers of devices, each with a share of the clients, a speed, a budget and an availability.

A fleet file (TOML) describes the devices a comparison runs on::

    name = "aiot-boards"
    source = "where the numbers come from (a paper's table, a trace)"

    [[tier]]
    name = "weak"                 # also AdaptiveFL's capacity tier ("weak" | "medium" | "strong") unless `capacity`
    share = 4                     # relative share of the clients
    device-class = "lpc"          # SHEFL's class of these devices ("hpc" | "lpc")
    flops-per-s = 1.0e10          # sustained training speed
    down-mbps = 20.0              # downlink and uplink bandwidth
    up-mbps = 5.0
    availability = 1.0            # share of the time a device can be sampled, in (0, 1]

A tier's profile is the node config a real device of that tier declares (``device-class``, ``capacity``;
docs/deployment.md#device-profile), so a simulated fleet and a deployed one run the same code paths.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .costs import DeviceSpeed


class FleetError(ValueError):
    """A fleet file that cannot be used: one line naming the file, the key, the value and what is allowed."""


DEVICE_CLASSES = ("hpc", "lpc")
CAPACITY_TIERS = ("weak", "medium", "strong")
_NUMBERS = {"share": (0.0, False), "flops-per-s": (0.0, False), "down-mbps": (0.0, False), "up-mbps": (0.0, False)}


@dataclass(frozen=True)
class Tier:
    """One kind of device in a fleet."""

    name: str
    share: float
    device_class: str
    capacity: str | float
    speed: DeviceSpeed
    availability: float = 1.0

    def node_config(self) -> dict[str, Any]:
        """The device profile a real device of this tier declares in its ``--node-config``."""
        return {"device-class": self.device_class, "capacity": self.capacity}


@dataclass(frozen=True)
class Fleet:
    """Tiers of devices (:func:`load_fleet`)."""

    name: str
    tiers: tuple[Tier, ...]
    source: str = ""

    def counts(self, num_clients: int) -> list[int]:
        """Clients per tier: the shares scaled to `num_clients`, rounded by largest remainder (ties: earlier tier)."""
        total = sum(t.share for t in self.tiers)
        exact = [num_clients * t.share / total for t in self.tiers]
        counts = [math.floor(e) for e in exact]
        order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - counts[i]), i))
        for i in order[: num_clients - sum(counts)]:
            counts[i] += 1
        return counts

    def profiles(self) -> tuple[tuple[float, str, str | float, float], ...]:
        """What decides a run's training on this fleet, tier by tier: share, device class, capacity, availability.
        Two fleets with the same profiles train the same runs; their speeds and bandwidths change only the
        simulated clock (:func:`simulated_round_seconds`), which a finished run's per-client rows recompute."""
        return tuple((t.share, t.device_class, t.capacity, t.availability) for t in self.tiers)

    def assign(self, num_clients: int, seed: int) -> list[Tier]:
        """The tier of each client id 0..num_clients-1: :meth:`counts` of each, placed by a permutation seeded by
        `seed` (the same clients get the same tiers at any number of nodes)."""
        slots = [t for t, n in zip(self.tiers, self.counts(num_clients), strict=True) for _ in range(n)]
        perm = np.random.default_rng([seed, 0xF1EE7]).permutation(num_clients)
        out: list[Tier | None] = [None] * num_clients
        for slot, client in zip(slots, perm, strict=True):
            out[int(client)] = slot
        return out  # type: ignore[return-value]


def _number(where: str, tier: dict, key: str, low: float, inclusive: bool) -> float:
    value = tier.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or \
            (value < low if inclusive else value <= low):
        raise FleetError(f"{where}: key '{key}' = {value!r}; expected a number {'>=' if inclusive else '>'} {low:g}")
    return float(value)


def _tier(path: Path, i: int, raw: Any) -> Tier:
    where = f"{path}: tier {i + 1}"
    if not isinstance(raw, dict):
        raise FleetError(f"{where}: expected a [[tier]] table, got {raw!r}")
    known = {"name", "share", "device-class", "capacity", "flops-per-s", "down-mbps", "up-mbps", "availability"}
    for key in raw:
        if key not in known:
            raise FleetError(f"{where}: unknown key '{key}'; expected one of {', '.join(sorted(known))}")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise FleetError(f"{where}: key 'name' = {name!r}; expected a non-empty string")
    where = f"{path}: tier '{name}'"
    n = {k: _number(where, raw, k, low, inc) for k, (low, inc) in _NUMBERS.items()}
    cls = raw.get("device-class")
    if cls not in DEVICE_CLASSES:
        raise FleetError(f"{where}: key 'device-class' = {cls!r}; expected one of {DEVICE_CLASSES}")
    capacity = raw.get("capacity", name)
    if not (capacity in CAPACITY_TIERS or (isinstance(capacity, int | float) and not isinstance(capacity, bool)
                                           and capacity > 0)):
        raise FleetError(f"{where}: key 'capacity' = {capacity!r}; expected one of {CAPACITY_TIERS} or a number of "
                         "parameters > 0 (default: the tier's name)")
    availability = _number(where, {"availability": raw.get("availability", 1.0)}, "availability", 0.0, False)
    if availability > 1.0:
        raise FleetError(f"{where}: key 'availability' = {availability!r}; expected a number in (0, 1]")
    speed = DeviceSpeed(n["flops-per-s"], n["down-mbps"] * 1e6, n["up-mbps"] * 1e6)
    return Tier(name, n["share"], cls, capacity, speed, availability)


def load_fleet(path: str | Path) -> Fleet:
    """Read and check a fleet file (module docstring); a bad value is one :class:`FleetError` line."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise FleetError(f"{path}: cannot be read as TOML ({err})") from None
    tiers = raw.get("tier")
    if not isinstance(tiers, list) or not tiers:
        raise FleetError(f"{path}: expected at least one [[tier]] table")
    out = tuple(_tier(path, i, t) for i, t in enumerate(tiers))
    names = [t.name for t in out]
    if len(set(names)) != len(names):
        raise FleetError(f"{path}: tier names {names} repeat; expected each once")
    return Fleet(str(raw.get("name", path.stem)), out, str(raw.get("source", "")))


_FLEETS: dict[str, Fleet] = {}
_TIERS: dict[tuple[str, int, int], list[Tier]] = {}


def fleet_of(cfg: dict[str, Any]) -> Fleet | None:
    """The run's fleet (run-config ``fleet``; read once per process), or None."""
    path = cfg.get("fleet", "")
    if not path:
        return None
    if path not in _FLEETS:
        _FLEETS[path] = load_fleet(path)
    return _FLEETS[path]


def tiers_of(cfg: dict[str, Any]) -> list[Tier] | None:
    """The tier of every client 0..num-clients-1 of the run (:meth:`Fleet.assign` with the run's seed), or None
    without a fleet. The server and every node compute the same list from the config alone (a fleet needs
    ``num-clients`` > 0: the config check says so)."""
    fleet = fleet_of(cfg)
    if fleet is None:
        return None
    key = (cfg["fleet"], int(cfg["num-clients"]), int(cfg["seed"]))
    if key not in _TIERS:
        _TIERS[key] = fleet.assign(int(cfg["num-clients"]), cfg["seed"])
    return _TIERS[key]


def available(tier: Tier, client: int, server_round: int, seed: int) -> bool:
    """Whether `client` can be sampled in `server_round`: a draw seeded by (seed, round, client) below the tier's
    availability (FedScale's availability as a per-round probability; the same at any number of nodes)."""
    if tier.availability >= 1.0:
        return True
    return bool(np.random.default_rng([seed, server_round, client, 0xA7A1]).random() < tier.availability)


def simulated_round_seconds(tiers: list[Tier], bytes_down: dict, bytes_up: dict, flops: dict) -> float:
    """A round's simulated wall clock (:func:`~.costs.round_seconds`): every client with traffic or work in the round
    (keys: client ids, as ints or strings) downloads, computes and uploads at its tier's speed; the slowest ends it.
    Keys outside the federation (a node's discovery traffic) are left out."""
    from .costs import ClientCost, round_seconds

    clients = {int(c) for c in (*bytes_down, *bytes_up, *flops)} & set(range(len(tiers)))
    get = lambda d, c: int(d.get(c, d.get(str(c), 0)))  # noqa: E731
    return round_seconds((ClientCost(get(bytes_down, c), get(bytes_up, c), get(flops, c)), tiers[c].speed)
                         for c in sorted(clients))
