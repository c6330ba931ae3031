"""The one results writer: results/<run-name>/metrics.json and PNG plots, updated every round.

metrics.json holds the validated config, one record per round (centralized accuracy and
loss, any extra metrics such as per-member accuracies, bytes down/up of that round and
cumulative, wall time of the round and since start), the convergence round for the
threshold, totals, and the machine it ran on (`machines`: one entry for the start of the
run and one more for every resume, each with the first round it ran), so that wall times
from different sessions can be compared. Every round appends its row to metrics.csv and rewrites
metrics.json, except where rewriting a long run's file every round would cost more than a twentieth
of its time (:meth:`RunRecorder.sync`), so a crashed or interrupted run still leaves its history; every
row also goes to the run's trackers (TensorBoard by default; :mod:`hetfl.common.tracking`, docs/tracking.md).

A method says what its figures mean with :meth:`RunRecorder.describe` (what ``accuracy`` is, reference
accuracies beside it, extra plot panels); :func:`plot_run` and :func:`summary_lines` use only
metrics.json. :meth:`RunRecorder.finish` also saves the final model (docs/inference.md).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import platform
import re
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NoReturn

from .config import Schema
from .progress import round_line
from .rundata import dataset_threshold
from .tracking import CsvLog, Trackers

log = logging.getLogger("hetfl")


REPO = Path(__file__).resolve().parents[2]  # the checkout: committed files name paths relative to it


def relative_paths(obj: Any, root: Path = REPO) -> Any:
    """`obj` (a metrics.json, summary.json or run config) with every string that names a path under `root` made
    relative to it, so that a file recorded in one checkout reads the same in another."""
    prefix = str(root) + "/"
    if isinstance(obj, str):
        return obj.replace(prefix, "")
    if isinstance(obj, list):
        return [relative_paths(v, root) for v in obj]
    if isinstance(obj, dict):
        return {k: relative_paths(v, root) for k, v in obj.items()}
    return obj


def stored_path(value: str | Path) -> Path:
    """A path as a committed file names it: absolute as it is; relative, under the checkout where it exists there
    (:func:`relative_paths` wrote it so), else as given."""
    path = Path(value)
    return path if path.is_absolute() or not (REPO / path).exists() else REPO / path


def copy_files(files: list[Path], src: Path, dst: Path) -> list[Path]:
    """Copy each of `files` (paths under `src`) to the same relative path under `dst`, making folders; what a
    reproduction keeps for committing (finished runs' metrics.json, study summaries), a JSON file's paths under the
    checkout made relative (:func:`relative_paths`). Returns the copies."""
    out = []
    for f in files:
        to = dst / Path(f).relative_to(src)
        to.parent.mkdir(parents=True, exist_ok=True)
        if Path(f).suffix == ".json":
            to.write_text(json.dumps(relative_paths(json.loads(Path(f).read_text())), indent=1))
            shutil.copystat(f, to)
        else:
            shutil.copy2(f, to)
        out.append(to)
    return out


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


class NoClientSucceeded(RuntimeError):
    """No sampled client's update was accepted for ``max-idle-rounds`` rounds in a row, or in any round: the run
    stops with its reason recorded (:meth:`RunRecorder.stop`)."""


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
        self._trackers: Trackers | None = None  # opened with the first row
        self._csv = CsvLog(self.run_dir / "metrics.csv", plain=_plain)
        self._json_due = 0.0  # perf_counter time from which metrics.json may be rewritten again
        self._json_stale = False  # rows recorded since metrics.json was last written

    rows: int | None = None  # the last row of a run whose rows are not server rounds (a one-shot server's epochs)

    @property
    def last_round(self) -> int | None:
        """The round the run ends after (num-server-rounds, or ``rows`` where a method set it; stop-after-round if
        earlier; None if not configured)."""
        last = self.rows if self.rows is not None else self.cfg.get("num-server-rounds")
        stop = self.cfg.get("stop-after-round") or 0
        return min(last, stop) if last and stop else last

    def describe(self, accuracy: str, references: dict[str, float] | None = None,
                 panels: dict[str, list[str]] | None = None, same_as: str | None = None,
                 before: str = "before round 1") -> None:
        """What the method's figures are, for the plot and the summary (kept in metrics.json as ``report``).

        Parameters
        ----------
        accuracy : str
            What the ``accuracy`` column measures ("global model", "ensemble", "L1 (full model)", ...).
        references : dict, optional
            Label -> test accuracy of comparison points computed once (FENS: FedENS, voting, one-shot FedAvg).
        panels : dict, optional
            Title -> row columns drawn in a plot panel of their own and reported in the summary
            (AdaptiveFL: the waste rate).
        same_as : str, optional
            A member/level column that is the ``accuracy`` column itself (AdaptiveFL: ``acc_L1``): drawn once.
        before : str
            What the traffic before round 1 (the round-0 row's bytes) is, in the plot (FENS: phases 1-2).
        """
        self.extra["report"] = {"accuracy": accuracy, "references": dict(references or {}), "panels": dict(panels or {}),
                                "same_as": same_as, "before": before}

    def federation(self, clients: int, nodes: int) -> None:
        """The federation's size (clients, SuperNodes), for titles and the summary."""
        self.extra["federation"] = {"clients": int(clients), "nodes": int(nodes)}

    def stage(self, **metrics: Any) -> None:
        """Metrics known before the round ends (e.g. the sampled clients); the next :meth:`record` adds them."""
        self._staged.update(metrics)

    def record(self, rnd: int, accuracy: float, loss: float, bytes_down: int = 0, bytes_up: int = 0,
               **metrics: Any) -> dict[str, Any]:
        """Add round `rnd` (0 = initial model, before any training): append it to metrics.csv and rewrite
        metrics.json, or leave that to a later row when rewriting it every round would take more than
        ``JSON_SHARE`` of the run's time (:meth:`sync`)."""
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
        trained = [r["round_s"] for r in self.rounds if r["round"] > 0]
        log.info("%s", round_line(rnd, self.last_round, accuracy, loss, bytes_down / 1e6, bytes_up / 1e6,
                                  sum(trained) / len(trained) if trained else None, row["elapsed_s"]))
        self.sync()
        if self._trackers is None:
            self._trackers = Trackers(self.run_dir, self.cfg)
        self._trackers.log_round(row)
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
        self._csv.reset()

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
            # the method's own figures: member / level accuracies of the last round, its reference points and panels
            "final_members": {k[4:]: v for k, v in (self.rounds[-1] if self.rounds else {}).items() if k.startswith("acc_")},
            "references": dict(self.extra.get("report", {}).get("references", {})),
            "final_panels": {c: (self.rounds[-1] if self.rounds else {}).get(c)
                             for cols in self.extra.get("report", {}).get("panels", {}).values() for c in cols},
        }

    # At most this share of a run's wall time goes to rewriting metrics.json: a file of n rows costs time in
    # proportion to n, so rewriting it after every one of a long run's cheap rounds would cost time in proportion
    # to n squared (2,000 rows of FENS's aggregator: 0.47 s a rewrite against 0.13 s of training a round).
    JSON_SHARE = 0.05

    def sync(self) -> Path:
        """Append the newest row to metrics.csv; rewrite metrics.json unless it was rewritten so recently that doing
        it again now would spend more than ``JSON_SHARE`` of the time since on rewrites (then it is left stale
        until a later row, :meth:`flush`, :meth:`finish` or :meth:`stop`). A run's rows are all in metrics.csv and
        its checkpoint after every round; metrics.json lags them by at most about 20 times its last rewrite."""
        self._csv.update(self.rounds)
        self._json_stale = True
        if time.perf_counter() >= self._json_due:
            self._write_json()
        return self.run_dir / "metrics.json"

    def flush(self) -> None:
        """Rewrite metrics.json now if rows were recorded since its last rewrite (a run that stops early)."""
        if self._json_stale:
            self._write_json()

    @contextlib.contextmanager
    def flushing(self) -> Iterator[RunRecorder]:
        """Around a run's rounds: on Ctrl-C, SIGTERM or an error, metrics.json gets the rows that :meth:`sync` put
        off before the exception goes on."""
        try:
            yield self
        except BaseException:
            self.flush()
            raise

    def write(self) -> Path:
        """Rewrite metrics.json and metrics.csv whole, now (:meth:`sync` is the per-round update)."""
        self._csv.reset()
        self._csv.update(self.rounds)
        return self._write_json()

    def _write_json(self) -> Path:
        """Rewrite metrics.json atomically; paths under the checkout are stored relative to it (``relative_paths``),
        so a run's file reads the same here, committed, or in another clone, even when the run is killed before
        it ends."""
        t0 = time.perf_counter()
        out = {"config": self.cfg, "rounds": self.rounds, "summary": self.summary(), **self.extra}
        path = self.run_dir / "metrics.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(metrics_text(relative_paths(_plain(out))))
        os.replace(tmp, path)
        t1 = time.perf_counter()
        self._json_due = t1 + (t1 - t0) * (1 - self.JSON_SHARE) / self.JSON_SHARE
        self._json_stale = False
        return path

    def finish(self, tensors: dict[str, Any] | None = None, builder: str = "hetfl.common.final_model:single_model",
               **model_meta: Any) -> dict[str, Any]:
        """Write metrics.json, metrics.csv and the plot, save the final model, close the trackers; log the summary.

        `tensors` ({name: array}, or an ArrayRecord) are the final global arrays, saved as
        ``final_model.safetensors`` with `builder` (the ``hetfl.*`` function that rebuilds them) and
        `model_meta` in its metadata (:mod:`hetfl.common.final_model`). Returns the summary.
        """
        path = self.write()
        plot_run(path)
        s = self.summary()
        last = self.rounds[-1]["round"] if self.rounds else 0
        if tensors is not None:
            from .final_model import save_final_model

            arrays = {k: (v.numpy() if hasattr(v, "numpy") else v) for k, v in tensors.items()}
            model = save_final_model(self.run_dir, arrays, self.cfg, last, builder, **model_meta)
            self.extra["final_model"] = model.name
            path = self.write()
        for line in summary_lines(json.loads(path.read_text()), self.run_dir):
            log.info("%s", line)
        trackers = self._trackers or Trackers(self.run_dir, self.cfg)
        trackers.log_summary(s, last)
        trackers.close()
        self._trackers = None
        return s

    def stop(self, rnd: int, reason: str) -> NoReturn:
        """End a run that cannot go on (no update accepted): record why as the run's outcome (``stopped``, kept with
        its rows: not an interrupted run), write metrics.json and the plot, close the trackers, and raise
        :class:`NoClientSucceeded` with the reason."""
        self.extra["stopped"] = {"round": rnd, "reason": reason}
        plot_run(self.write())
        if self._trackers is not None:
            self._trackers.close()
            self._trackers = None
        raise NoClientSucceeded(f"{reason}; the server log names each client's error")


def load_metrics(path: Path | str, schema: Schema) -> dict[str, Any]:
    """A run's metrics.json, its config under today's names of the keys `schema` knows (runs made before a rename
    still read): ``hetfl.methods.SCHEMA`` for every key, :data:`~hetfl.common.config.COMMON` for the common ones."""
    data = json.loads(Path(path).read_text())
    if isinstance(data.get("config"), dict):
        data["config"] = schema.upgrade(data["config"])
    return data


def _pct(x: Any) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.2f}%"


def summary_lines(data: dict[str, Any], run_dir: Path | str | None = None) -> list[str]:
    """The end-of-run summary from a metrics.json: accuracy, convergence ("not reached" if never), bytes, time, and
    the method's own figures (members/levels, reference accuracies, panel columns), and where the files are."""
    s, report = data["summary"], data.get("report", {})
    what = report.get("accuracy", "global model")
    conv = s.get("convergence_round")
    thr = s.get("convergence_threshold") or 0.0
    lines = [f"final accuracy ({what}): {_pct(s.get('final_accuracy'))} (best {_pct(s.get('best_accuracy'))}); "
             f"convergence round at {100 * thr:.0f}%: {conv if conv is not None else 'not reached'}"]
    mean = s.get("mean_round_s")
    lines.append(f"communication: {s['total_bytes_down'] / 1e6:.1f} MB down, {s['total_bytes_up'] / 1e6:.1f} MB up; "
                 f"{f'{mean:.2f} s/round, ' if mean is not None else ''}{s['wall_time_s']:.1f} s total, "
                 f"{s['rounds_completed']} rounds")
    if data.get("stopped"):
        lines.append(f"  stopped in round {data['stopped']['round']}: {data['stopped']['reason']}")
    members = s.get("final_members") or {}
    if members:
        lines.append("  last round, per member/level: " + ", ".join(f"{k} {_pct(v)}" for k, v in members.items()))
    refs = s.get("references") or {}
    if refs:
        lines.append(f"  beside the {what}: " + ", ".join(f"{k} {_pct(v)}" for k, v in refs.items()))
    for title, cols in report.get("panels", {}).items():
        vals = [(c, (s.get("final_panels") or {}).get(c)) for c in cols]
        lines.append(f"  {title}, last round: " + ", ".join(f"{c} {_pct(v) if isinstance(v, (int, float)) else 'n/a'}"
                                                            for c, v in vals))
    if run_dir is not None:
        run_dir = Path(run_dir)
        files = ["metrics.json", "metrics.csv", "accuracy.png"]
        files += ["tensorboard/"] if (run_dir / "tensorboard").is_dir() else []
        files += [data["final_model"]] if data.get("final_model") else []
        lines.append(f"results: {run_dir} ({', '.join(files)})")
    return lines


def metrics_text(data: dict[str, Any]) -> str:
    """metrics.json's text: JSON indented by 2, except that each row of ``rounds`` is one line (a 2,000-round FENS
    aggregator run: 4.0 MB where indenting the rows too gives 6.4 MB, most of it the per-client columns' lines)."""
    parts = []
    for key, value in data.items():
        if key == "rounds" and isinstance(value, list) and value:
            rows = ",\n".join("    " + json.dumps(row) for row in value)
            parts.append(f'  "rounds": [\n{rows}\n  ]')
        else:
            parts.append(f"  {json.dumps(key)}: " + json.dumps(value, indent=2).replace("\n", "\n  "))
    return "{\n" + ",\n".join(parts) + "\n}" if parts else "{}"


def _plain(obj: Any) -> Any:
    """`obj` as JSON would read it back (numpy scalars and arrays, paths and sets made plain)."""
    return json.loads(json.dumps(obj, default=_json_default))


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):  # NumPy arrays and scalars, torch tensors
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _member_label(key: str) -> str:
    name = key[4:]
    if name == "avg":
        return "mean of levels"
    return f"member {name[1:]}" if re.fullmatch(r"m\d+", name) else name


def plot_title(data: dict[str, Any]) -> str:
    """method on dataset (partitioner, alpha), model, seed, clients on nodes."""
    cfg = data["config"]
    part = cfg.get("partitioner")
    if part == "dirichlet" and cfg.get("dirichlet-alpha") is not None:
        part = f"Dirichlet \u03b1={cfg['dirichlet-alpha']:g}"
    fed = data.get("federation")
    who = f", {fed['clients']} clients on {fed['nodes']} nodes" if fed else ""
    stop = f" (stopped in round {data['stopped']['round']})" if data.get("stopped") else ""
    return f"{cfg.get('method')} on {cfg.get('dataset')} ({part}), {cfg.get('model')}, seed {cfg.get('seed')}{who}{stop}"


def plot_run(metrics_path: Path | str, out: Path | str | None = None) -> Path:
    """accuracy.png: accuracy vs round, accuracy vs cumulative bytes (down + up, from 0: what round 0 carries, e.g.
    FENS's phase 1, included), and one panel per :meth:`RunRecorder.describe` panel (AdaptiveFL: waste rate).

    The accuracy curve is labelled by what it measures (``report.accuracy``), member/level curves by their
    column (``acc_<name>``; ``report.same_as``, the accuracy column itself, is not drawn twice), reference accuracies
    are dotted lines (and points at the bytes of round 0), and the convergence threshold is labelled.
    """
    import matplotlib.pyplot as plt

    metrics_path = Path(metrics_path)
    fig = plot_figure(json.loads(metrics_path.read_text()))  # rows only: no key names to upgrade
    out = Path(out) if out else metrics_path.with_name("accuracy.png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_figure(data: dict[str, Any]) -> Any:
    """The matplotlib Figure of :func:`plot_run` for a metrics.json's content."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = data["rounds"]
    report = data.get("report", {})
    what = report.get("accuracy", "global model")
    panels = report.get("panels", {})
    refs = report.get("references", {})
    rounds = [r["round"] for r in rows]
    acc = [100 * _num(r["accuracy"]) for r in rows]
    mb = [(r["cum_bytes_down"] + r["cum_bytes_up"]) / 1e6 for r in rows]
    member_keys = [k for k in dict.fromkeys(k for r in rows for k in r if k.startswith("acc_"))
                   if k != report.get("same_as")]  # AdaptiveFL's acc_L1 is the accuracy itself
    fig, axes = plt.subplots(1, 2 + len(panels), figsize=(5.5 * (2 + len(panels)), 4.2), squeeze=False)
    axes = axes[0]
    axes[0].plot(rounds, acc, marker="o", ms=3, lw=1.8, label=what)
    for k in member_keys:
        axes[0].plot(rounds, [100 * _num(r.get(k)) for r in rows], lw=0.8, alpha=0.7, label=_member_label(k))
    axes[1].plot(mb, acc, marker="o", ms=3, lw=1.8, label=what)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, value) in enumerate(refs.items()):
        c = colors[(i + 3) % len(colors)]
        axes[0].axhline(100 * value, color=c, ls=":", lw=1.2, label=f"{name} {100 * value:.1f}%")
        if mb:
            axes[1].plot([mb[0]], [100 * value], marker="s", ls="none", color=c, label=f"{name} {100 * value:.1f}%")
    thr = data["summary"].get("convergence_threshold")
    for ax in axes[:2]:
        if thr:
            ax.axhline(100 * thr, color="grey", ls="--", lw=0.8, label=f"convergence threshold {100 * thr:.0f}%")
        ax.set_ylabel("test accuracy (%)")
        ax.grid(alpha=0.3)
    if mb and mb[0] > 0.01 * mb[-1]:  # traffic before round 1 that shows (FENS: phase 1 and the ensemble download)
        axes[1].axvspan(0, mb[0], color="grey", alpha=0.12, label=f"{report.get('before', 'before round 1')}: {mb[0]:.1f} MB")
    axes[1].set_xlim(left=0)
    axes[0].set_xlabel("round")
    axes[1].set_xlabel("cumulative communication (MB, down + up)")
    for ax, (title, cols) in zip(axes[2:], panels.items(), strict=True):
        vals = {c: [_num(r.get(c)) for r in rows] for c in cols}
        frac = all(0 <= v <= 1 for vs in vals.values() for v in vs if not math.isnan(v))
        for c, vs in vals.items():
            ax.plot(rounds, [100 * v if frac else v for v in vs], marker="o", ms=3, label=c)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("round")
        ax.set_ylabel(f"{title} (%)" if frac else title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in [axes[0], *axes[2:]]:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[:2]:
        ax.legend(fontsize=7)
    fig.suptitle(plot_title(data), fontsize=10)
    fig.tight_layout()
    return fig


def _num(v: Any) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")


def run_recorder(cfg: dict[str, Any]) -> RunRecorder:
    """The run's recorder (metrics.json, plots, trackers), with the config's or the dataset's convergence threshold."""
    return RunRecorder(cfg, dataset_threshold(cfg))
