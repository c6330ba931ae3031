"""A device measures itself (issue #77): sustained training speed on the run's model and data, and the memory it may
use, reported when its ClientApp answers discovery (docs/fleets.md#measured).

* **Speed** (:func:`measure_training`): training steps of the run's model on a batch of the node's data, the first
  :data:`WARMUP_STEPS` discarded (allocator, kernel selection, caches), then steps until at least
  :data:`MEASURE_S` seconds of wall time have passed. Two seconds span 20 periods of the Linux CFS scheduler
  (100 ms each): a CPU quota (a cgroup's ``cpu.cfs_quota_us``), a thermally throttled board or a shared core shows
  as its sustained rate, not as the burst of its first period. Reported as samples/s and as achieved FLOP/s (the
  steps' FLOPs counted by PyTorch, :func:`~hetfl.common.costs.step_flops`, over the same wall time).
* **Memory** (:func:`available_memory`): what the process may still allocate, the smaller of the machine's
  available memory (psutil) and its cgroup's limit less its usage (v2 ``memory.max``, v1
  ``memory.limit_in_bytes``), where a limit applies.

A measurement is timing: a simulated run records it but never lets it decide (same seed, same run); in deployment the
strategies assign SHEFL's device class and AdaptiveFL's capacity from it where a node declares none.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

WARMUP_STEPS = 3
MEASURE_S = 2.0  # at least 20 CFS periods of 100 ms: sustained, not burst, speed
MAX_STEPS = 10_000
PROFILE = "hetfl-device-profile"  # the node state's ConfigRecord of its measured profile (one per run)
PROFILE_KEYS = ("samples-per-s", "flops-per-s", "memory-bytes", "measured-on")
"""What a node adds to its discovery answer per client when it measured itself (lists, one value per client)."""


@dataclass(frozen=True)
class DeviceProfile:
    """A device's measured profile (docs/fleets.md#measured).

    Parameters
    ----------
    samples_per_s : float
        Training samples per second, sustained over `seconds`.
    flops_per_s : float
        Achieved FLOP/s of those steps (PyTorch's FLOP counter over the same wall time).
    memory_bytes : int
        Memory the process may still allocate (psutil, and its cgroup's limit where one applies).
    model : str
        What was measured: the run's model name, its batch size and input shape.
    steps : int
        Timed steps (after the warm-up).
    seconds : float
        Their wall time.
    """

    samples_per_s: float
    flops_per_s: float
    memory_bytes: int
    model: str
    steps: int
    seconds: float

    def answer(self) -> dict[str, Any]:
        """The discovery answer's fields: ``samples-per-s``, ``flops-per-s``, ``memory-bytes``, ``measured-on``."""
        return {"samples-per-s": float(self.samples_per_s), "flops-per-s": float(self.flops_per_s),
                "memory-bytes": int(self.memory_bytes), "measured-on": self.model}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _cgroup_paths(proc: Path = Path("/proc/self/cgroup")) -> list[tuple[str, str]]:
    """(controllers, path) of a process's cgroups (``/proc/<pid>/cgroup``)."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return []
    return [(parts[1], parts[2]) for parts in (ln.split(":", 2) for ln in lines) if len(parts) == 3]


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def cgroup_memory_left(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes the cgroup of a process (`proc`: its ``/proc/<pid>/cgroup``) may still use, its limit less its usage
    (cgroup v2 under `root`, or v1's memory controller under `root`/memory); None without a limit."""
    for controllers, rel in _cgroup_paths(proc):
        if controllers == "":  # v2: one unified hierarchy
            base = root / rel.lstrip("/")
            limit, used = _read_int(base / "memory.max"), _read_int(base / "memory.current")
        elif "memory" in controllers.split(","):  # v1
            base = root / "memory" / rel.lstrip("/")
            limit, used = _read_int(base / "memory.limit_in_bytes"), _read_int(base / "memory.usage_in_bytes")
        else:
            continue
        if limit is not None and limit < 1 << 60:  # v1 writes "no limit" as a huge number
            return max(0, limit - (used or 0))
    return None


def available_memory() -> int:
    """Bytes this process may still allocate: the machine's available memory, or less under a cgroup limit."""
    import psutil

    free = int(psutil.virtual_memory().available)
    left = cgroup_memory_left()
    return free if left is None else min(free, left)


def measure_training(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, label: str = "",
                     seconds: float = MEASURE_S, warmup: int = WARMUP_STEPS, lr: float = 0.01,
                     loss_fn: Any = None) -> DeviceProfile:
    """Time SGD steps of `model` on the batch (`x`, `y`): `warmup` steps discarded, then steps until `seconds` of
    wall time have passed. The model is trained on a copy (its own weights are left as they were)."""
    import copy

    from .costs import step_flops

    probe = copy.deepcopy(model).train()
    opt = torch.optim.SGD(probe.parameters(), lr=lr)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        out = probe(x) if loss_fn is None else None
        loss = nn.functional.cross_entropy(out.float(), y) if loss_fn is None else loss_fn(probe, x, y)
        loss.backward()
        opt.step()

    with torch.random.fork_rng(devices=[]):  # dropout draws leave the run's RNG as it was
        for _ in range(warmup):
            step()
        steps, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < seconds and steps < MAX_STEPS:
            step()
            steps += 1
    elapsed = time.perf_counter() - t0
    flops = step_flops(model, tuple(x.shape[1:]), len(x), dtype=x.dtype, loss_fn=loss_fn) * steps
    return DeviceProfile(samples_per_s=len(x) * steps / elapsed, flops_per_s=flops / elapsed,
                         memory_bytes=available_memory(), model=label, steps=steps, seconds=elapsed)


def measure_run(cfg: dict[str, Any], data: Any) -> DeviceProfile:
    """A node's profile for a hetfl run: the run's model (``model``, ``width``) on a batch of ``batch-size`` rows
    of this node's data (fewer if it holds fewer), normalised as training normalises it."""
    from .rundata import dataset_info
    from .task import make_model
    from .train import Normalizer

    model = make_model(cfg)
    n = max(1, min(int(cfg["batch-size"]), len(data)))
    norm = Normalizer(dataset_info(cfg))
    x = norm(torch.as_tensor(np.ascontiguousarray(data.x[:n])))
    y = torch.as_tensor(np.asarray(data.y[:n], dtype=np.int64))
    label = f"{cfg['model']} (width {cfg['width']}), batch {n}, input {tuple(x.shape[1:])}"
    return measure_training(model, x, y, label=label, seconds=float(cfg["measure-seconds"]))
