"""The one results writer: results/<run-id>/metrics.json and PNG plots, updated every round.

metrics.json holds the validated config, one record per round (centralized accuracy and
loss, any extra metrics such as per-member accuracies, bytes down/up of that round and
cumulative, wall time of the round and since start), the convergence round for the
threshold, totals, and the machine it ran on (`machines`: one entry for the start of the
run and one more for every resume, each with the first round it ran), so that wall times
from different sessions can be compared. It is rewritten after every round, so a crashed or
interrupted run still leaves its history.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import re
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("hetfl")


def convergence_round(accuracies: list[tuple[int, float]], threshold: float) -> int | None:
    """First round whose accuracy reaches `threshold` (SHEFL Fig. 3 'convergence round'); None if never."""
    for rnd, acc in accuracies:
        if rnd > 0 and acc is not None and not math.isnan(acc) and acc >= threshold:
            return rnd
    return None


def default_run_name(cfg: dict[str, Any]) -> str:
    """method-dataset-partitioner-seed-timestamp."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    part = cfg["partitioner"] + (f"{cfg['dirichlet-alpha']:g}" if cfg["partitioner"] == "dirichlet" else "")
    dataset = re.sub(r"[^A-Za-z0-9_.-]+", "-", cfg["dataset"].rstrip("/").rsplit("/", 1)[-1])  # dir:/a/b -> b, hub:o/n -> n
    return f"{cfg['method']}-{dataset}-{part}-s{cfg['seed']}-{stamp}-{os.getpid()}"


def machine_info() -> dict[str, Any]:
    """The machine this process runs on: CPU model, the instruction set PyTorch dispatches to, cores, versions.

    In the Simulation Engine the clients train on the same machine; under the Deployment Engine
    this describes the ServerApp's machine only. `bf16_instructions` says whether the CPU has
    native bf16 (x86 AVX-512 BF16 or AMX, Arm BF16): without it bf16 autocast is emulated and
    slower than fp32 (docs/results/bf16-parity-quickstart.md). The clients' threads are the run
    config's `client-threads`.
    """
    fields: dict[str, str] = {}
    try:  # Linux; elsewhere the CPU model falls back to platform.processor()
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first core's entries
    except OSError:
        pass
    flags = set((fields.get("flags") or fields.get("Features", "")).split())  # x86 | aarch64
    info: dict[str, Any] = {
        "cpu": fields.get("model name") or platform.processor() or platform.machine(),
        "cpu_id": " ".join(f"{k} {fields[k]}" for k in ("cpu family", "model", "stepping") if k in fields),
        "bf16_instructions": bool(flags & {"avx512_bf16", "amx_bf16", "bf16"}),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
    try:
        import torch

        info.update(torch=str(torch.__version__), torch_cpu_capability=torch.backends.cpu.get_cpu_capability(),
                    cuda_devices=torch.cuda.device_count())  # a count only: a name would start a CUDA context
    except ImportError:  # pragma: no cover - torch is a dependency of the package
        pass
    try:
        from importlib.metadata import version

        info["flwr"] = version("flwr")
    except Exception:  # pragma: no cover - not installed as a distribution
        pass
    return info


@dataclass
class RunRecorder:
    """Collects per-round records and writes metrics.json + plots under results_dir/run_name."""

    cfg: dict[str, Any]
    threshold: float
    run_dir: Path = field(init=False)
    rounds: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        name = self.cfg.get("run-name") or default_run_name(self.cfg)
        self.run_dir = Path(self.cfg.get("results-dir") or "results").expanduser().resolve() / name
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._t_start = time.perf_counter()
        self._t_last = self._t_start
        self._cum_down = 0
        self._cum_up = 0
        self._staged: dict[str, Any] = {}
        self._machine = machine_info()
        self.extra["machines"] = [{**self._machine, "from_round": 0}]

    def stage(self, **metrics: Any) -> None:
        """Metrics known before the round ends (e.g. the sampled clients); the next :meth:`record` adds them."""
        self._staged.update(metrics)

    def record(self, rnd: int, accuracy: float, loss: float, bytes_down: int = 0, bytes_up: int = 0,
               **metrics: Any) -> dict[str, Any]:
        """Add round `rnd` (0 = initial model, before any training) and rewrite metrics.json."""
        now = time.perf_counter()
        self._cum_down += int(bytes_down)
        self._cum_up += int(bytes_up)
        row = {
            "round": rnd,
            "accuracy": accuracy,
            "loss": loss,
            "bytes_down": int(bytes_down),
            "bytes_up": int(bytes_up),
            "cum_bytes_down": self._cum_down,
            "cum_bytes_up": self._cum_up,
            "round_s": now - self._t_last,
            "elapsed_s": now - self._t_start,
            **self._staged,
            **metrics,
        }
        self._staged = {}
        self._t_last = now
        self.rounds.append(row)
        log.info(
            "round %3d | acc %.4f | loss %.4f | down %.2f MB up %.2f MB | %.2fs",
            rnd, accuracy, loss, bytes_down / 1e6, bytes_up / 1e6, row["round_s"],
        )
        self.write()
        return row

    def state_dict(self) -> dict[str, Any]:
        """History and counters (for checkpoints)."""
        return {"rounds": list(self.rounds), "extra": dict(self.extra), "cum_down": self._cum_down, "cum_up": self._cum_up,
                "elapsed": time.perf_counter() - self._t_start}

    def load_state_dict(self, st: dict[str, Any]) -> None:
        """Continue a checkpointed history (wall time keeps counting from the saved elapsed time).

        `machines` keeps the checkpoint's entries (or one saying "not recorded" for a checkpoint made
        before they were) and adds this machine from the first round the resumed run plays.
        """
        first = st["rounds"][-1]["round"] + 1 if st["rounds"] else 0
        before = st["extra"].get("machines") or [{"cpu": None, "from_round": 0}]
        here = {**self._machine, "from_round": first}
        self.rounds, self.extra = list(st["rounds"]), {**st["extra"], **self.extra, "machines": [*before, here]}
        self._cum_down, self._cum_up = st["cum_down"], st["cum_up"]
        self._t_start = time.perf_counter() - st["elapsed"]
        self._t_last = time.perf_counter()

    def summary(self) -> dict[str, Any]:
        """Final/best accuracy, convergence round, total bytes and time."""
        accs = [(r["round"], r["accuracy"]) for r in self.rounds]
        trained = [r for r in self.rounds if r["round"] > 0]
        return {
            "final_accuracy": self.rounds[-1]["accuracy"] if self.rounds else None,
            "best_accuracy": max((a for _, a in accs if a is not None and not math.isnan(a)), default=None),
            "convergence_threshold": self.threshold,
            "convergence_round": convergence_round(accs, self.threshold),
            "total_bytes_down": self._cum_down,
            "total_bytes_up": self._cum_up,
            "wall_time_s": time.perf_counter() - self._t_start,
            "mean_round_s": (sum(r["round_s"] for r in trained) / len(trained)) if trained else None,
            "rounds_completed": len(trained),
        }

    def write(self) -> Path:
        """Rewrite metrics.json atomically."""
        out = {"config": self.cfg, "rounds": self.rounds, "summary": self.summary(), **self.extra}
        path = self.run_dir / "metrics.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(out, indent=2, default=_json_default))
        os.replace(tmp, path)
        return path

    def finish(self) -> dict[str, Any]:
        """Write metrics.json and the plots; log where they are. Returns the summary."""
        self.write()
        plot_run(self.run_dir / "metrics.json")
        s = self.summary()
        log.info(
            "finished: final accuracy %.4f, convergence round (>= %.2f) %s, %.1f MB down, %.1f MB up, %.1fs",
            s["final_accuracy"] or float("nan"), self.threshold, s["convergence_round"],
            s["total_bytes_down"] / 1e6, s["total_bytes_up"] / 1e6, s["wall_time_s"],
        )
        log.info("results: %s (metrics.json, accuracy.png)", self.run_dir)
        return s


def load_metrics(path: Path | str) -> dict[str, Any]:
    """A run's metrics.json, its config under today's key names (runs made before a rename still read)."""
    from .config import upgrade_config

    data = json.loads(Path(path).read_text())
    if isinstance(data.get("config"), dict):
        data["config"] = upgrade_config(data["config"])
    return data


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def plot_run(metrics_path: Path | str, out: Path | str | None = None) -> Path:
    """accuracy.png: accuracy vs round and accuracy vs cumulative bytes (down + up)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    data = load_metrics(metrics_path)
    rows = data["rounds"]
    rounds = [r["round"] for r in rows]
    acc = [100 * r["accuracy"] for r in rows]
    mb = [(r["cum_bytes_down"] + r["cum_bytes_up"]) / 1e6 for r in rows]
    member_keys = sorted(k for k in rows[-1] if k.startswith("acc_")) if rows else []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    axes[0].plot(rounds, acc, marker="o", ms=3, label="global")
    for k in member_keys:
        axes[0].plot(rounds, [100 * r.get(k, float("nan")) for r in rows], lw=0.8, alpha=0.7, label=k[4:])
    thr = data["summary"].get("convergence_threshold")
    for ax in axes:
        if thr:
            ax.axhline(100 * thr, color="grey", ls="--", lw=0.8)
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("round")
    axes[1].plot(mb, acc, marker="o", ms=3)
    axes[1].set_xlabel("cumulative communication (MB, down + up)")
    if member_keys:
        axes[0].legend(fontsize=7)
    cfg = data["config"]
    fig.suptitle(f"{cfg.get('method')} on {cfg.get('dataset')} ({cfg.get('partitioner')})")
    fig.tight_layout()
    out = Path(out) if out else metrics_path.with_name("accuracy.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
