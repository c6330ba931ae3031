"""Experiment tracking beside metrics.json: metrics.csv, TensorBoard event files, and optionally W&B and MLflow.

The results writer (:class:`hetfl.common.results.RunRecorder`) hands every round's row and the run's
summary to the trackers that the run-config key ``tracking`` names (a comma list):

- ``tensorboard`` (default): ``<run-dir>/tensorboard/events.out.tfevents.*``, written by tensorboardX (a
  dependency: numpy and protobuf only), so every run has them without installing TensorBoard; view them with
  ``pip install tensorboard; tensorboard --logdir results/``.
- ``wandb``: Weights & Biases in offline mode, its files under ``<run-dir>/wandb`` (``pip install
  'hetfl[wandb]'``; ``wandb sync <run-dir>/wandb/offline-run-*`` uploads them later).
- ``mlflow``: MLflow with a local file store, ``<run-dir>/mlruns`` (``pip install 'hetfl[mlflow]'``;
  ``mlflow ui --backend-store-uri <run-dir>/mlruns``).
- ``none``: none of them. ``metrics.csv`` is written for every run, whatever ``tracking`` says.

Every numeric column of a row is logged with the round as its step, grouped by kind (``accuracy/``,
``loss/``, ``bytes/``, ``time/``, ``metrics/``). docs/tracking.md
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import logging
import math
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .config import ConfigError, Key

log = logging.getLogger("hetfl")

TRACKERS = ("tensorboard", "wandb", "mlflow")
_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow"}  # tracker -> the module it needs (TensorBoard needs none)


def parse_tracking(value: str) -> list[str]:
    """The trackers named by run-config ``tracking`` (comma list; 'none' = none); ConfigError on an unknown name."""
    names = [n.strip().lower() for n in value.split(",") if n.strip()]
    bad = [n for n in names if n not in (*TRACKERS, "none")]
    if bad or ("none" in names and len(names) > 1):
        raise ConfigError(f"run-config key 'tracking' = {value!r} is not allowed; expected a comma list of "
                          f"{', '.join(repr(t) for t in TRACKERS)}, or 'none'")
    return [n for n in dict.fromkeys(names) if n != "none"]


def _check(cfg: dict[str, Any]) -> None:
    for name in parse_tracking(cfg["tracking"]):
        module = _PACKAGES.get(name)
        if module and importlib.util.find_spec(module) is None:
            raise ConfigError(f"run-config key 'tracking' = {cfg['tracking']!r} needs the {module} package, which is "
                              f"not installed; expected it installed (pip install 'hetfl[{name}]') or {name!r} left out")


KEYS = (  # part of the schema hetfl.methods composes, with the method packages' keys
    Key("tracking", str, "tensorboard", "experiment trackers beside metrics.json/metrics.csv: comma list of "
        "'tensorboard', 'wandb' (offline), 'mlflow' (local files), or 'none' (docs/tracking.md)"),
    Key("tracking-project", str, "hetfl", "W&B project / MLflow experiment name of the run"),
    Key("progress-interval", float, 10.0, "seconds between 'still running' lines of a long phase (local training, "
        "evaluation, FENS phase 1)", min=0.0, min_inclusive=False),
)
check = _check  # the cross-check of KEYS


# --- the columns of a row ------------------------------------------------------------------------


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numeric columns of a row (bools and lists left out), except `round`."""
    return {k: float(v) for k, v in row.items()
            if k != "round" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def tag(column: str) -> str:
    """The TensorBoard / W&B / MLflow name of a column: grouped by kind."""
    if column == "accuracy" or column.startswith("acc_") or column.endswith("_accuracy"):
        return f"accuracy/{column}"
    if column == "loss" or column.endswith("_loss"):
        return f"loss/{column}"
    if "bytes" in column:
        return f"bytes/{column}"
    if column.endswith("_s"):
        return f"time/{column}"
    return f"metrics/{column}"


def write_csv(path: Path, rows: list[dict[str, Any]]) -> Path:
    """Rewrite ``metrics.csv`` atomically: one line per round, the union of the rows' columns in order of appearance.

    A list (the sampled ``clients``) is written as space-separated values, a dict as JSON, None as empty.
    """
    columns = list(dict.fromkeys(k for r in rows for k in r))
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(columns)
    for r in rows:
        w.writerow([_cell(r.get(k)) for k in columns])
    tmp = path.with_suffix(".csv.tmp")
    tmp.write_text(buf.getvalue())
    os.replace(tmp, path)
    return path


class CsvLog:
    """``metrics.csv`` kept in step with a run's growing rows at a cost per round that does not grow with the run.

    :meth:`update` appends the newest row as one line when it is the only row added since the last call and adds
    no column; otherwise (the first call, a new column, a history replaced on resume) it rewrites the file whole
    with :func:`write_csv`. Either way the file is byte for byte what :func:`write_csv` writes for the same rows.
    """

    def __init__(self, path: Path, plain: Callable[[Any], Any] = lambda rows: rows) -> None:
        self.path, self.plain = path, plain  # plain: rows -> JSON-ready rows (numpy scalars to floats, ...)
        self.columns: list[str] | None = None  # the header of the file on disk
        self.written = 0  # rows in it

    def update(self, rows: list[dict[str, Any]]) -> Path:
        """Bring the file up to `rows`."""
        if (self.columns is not None and len(rows) == self.written + 1 and rows[-1].keys() <= set(self.columns)
                and self.path.exists()):
            last = self.plain(rows[-1:])[0]
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerow([_cell(last.get(k)) for k in self.columns])
            with self.path.open("a") as f:  # one write: a process killed around it leaves whole lines
                f.write(buf.getvalue())
        else:
            write_csv(self.path, self.plain(rows))
            self.columns = list(dict.fromkeys(k for r in rows for k in r))
        self.written = len(rows)
        return self.path

    def reset(self) -> None:
        """Forget what was written (the rows were replaced): the next :meth:`update` rewrites the file."""
        self.columns, self.written = None, 0


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, (list, tuple)):
        return " ".join(str(x) for x in v)
    if isinstance(v, dict):
        return json.dumps(v, sort_keys=True)
    if isinstance(v, float):
        return repr(v)
    return str(v)


# --- the trackers ----------------------------------------------------------------------------------


class Tracker:
    """What the results writer calls: one row per round, the summary at the end, then close."""

    name = "none"

    def log_round(self, row: dict[str, Any]) -> None:  # noqa: D102
        pass

    def log_summary(self, summary: dict[str, Any], step: int) -> None:  # noqa: D102
        pass

    def close(self) -> None:  # noqa: D102
        pass


def _summary_scalars(summary: dict[str, Any]) -> dict[str, float]:
    return {f"summary/{k}": float(v) for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}


class TensorBoardTracker(Tracker):
    """Scalars in ``<run-dir>/tensorboard/events.out.tfevents.<time>.<host>.<pid>.hetfl`` as tensorboardX writes
    them (its ``Event`` protobuf, ``summary.scalar`` and record writer), one event per round written and flushed at
    once: a crashed run keeps every round written so far (tensorboardX's ``SummaryWriter`` queues events in a
    thread and its flush does not wait for the queue)."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, cfg: dict[str, Any]) -> None:
        from tensorboardX.record_writer import RecordWriter  # imported here: a ClientApp never writes events

        logdir = run_dir / "tensorboard"
        logdir.mkdir(parents=True, exist_ok=True)
        self.path = logdir / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.hetfl"
        self.file = RecordWriter(str(self.path))
        self._write(0, None)  # the file-version event TensorBoard reads first

    def _write(self, step: int, values: dict[str, float] | None) -> None:
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.proto.summary_pb2 import Summary
        from tensorboardX.summary import scalar

        event = Event(wall_time=time.time(), step=step)
        if values is None:
            event.file_version = "brain.Event:2"
        else:
            event.summary.CopyFrom(Summary(value=[v for k, x in values.items() for v in scalar(k, x).value]))
        self.file.write(event.SerializeToString())
        self.file.flush()

    def log_round(self, row: dict[str, Any]) -> None:
        values = {tag(k): v for k, v in scalars(row).items()}
        if values:
            self._write(int(row["round"]), values)

    def log_summary(self, summary: dict[str, Any], step: int) -> None:
        values = _summary_scalars(summary)
        if values:
            self._write(step, values)

    def close(self) -> None:
        self.file.close()


def _flat_config(cfg: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cfg.items() if isinstance(v, (int, float, str, bool))}


class WandbTracker(Tracker):
    """W&B in offline mode (``WANDB_MODE`` in the environment may say otherwise), files under ``<run-dir>/wandb``."""

    name = "wandb"

    def __init__(self, run_dir: Path, cfg: dict[str, Any]) -> None:
        import wandb

        os.environ.setdefault("WANDB_SILENT", "true")
        self.run = wandb.init(project=cfg.get("tracking-project") or "hetfl", name=run_dir.name, dir=str(run_dir),
                              mode=os.environ.get("WANDB_MODE", "offline"), config=_flat_config(cfg),
                              reinit="finish_previous")
        self.run.define_metric("round")
        self.run.define_metric("*", step_metric="round")

    def log_round(self, row: dict[str, Any]) -> None:
        self.run.log({"round": int(row["round"]), **{tag(k): v for k, v in scalars(row).items()}})

    def log_summary(self, summary: dict[str, Any], step: int) -> None:
        for k, v in _summary_scalars(summary).items():
            self.run.summary[k] = v

    def close(self) -> None:
        import wandb

        self.run.finish()
        wandb.teardown()  # waits until W&B's service has written everything: the ServerApp process may end right after


class MlflowTracker(Tracker):
    """MLflow with a local file store under ``<run-dir>/mlruns`` (no server, no database).

    MLflow 3 keeps the file store "in maintenance mode" and refuses it unless ``MLFLOW_ALLOW_FILE_STORE`` is
    true; it is set here (if unset), since a results folder of plain files is the point.
    """

    name = "mlflow"

    def __init__(self, run_dir: Path, cfg: dict[str, Any]) -> None:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient

        self.uri = (run_dir / "mlruns").as_uri()
        self.client = MlflowClient(tracking_uri=self.uri)
        project = cfg.get("tracking-project") or "hetfl"
        exp = self.client.get_experiment_by_name(project)
        exp_id = exp.experiment_id if exp else self.client.create_experiment(project)
        self.run_id = self.client.create_run(exp_id, run_name=run_dir.name).info.run_id
        from mlflow.entities import Param

        params = [Param(k, str(v)[:6000]) for k, v in _flat_config(cfg).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log_round(self, row: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(tag(k), v, now, int(row["round"])) for k, v in scalars(row).items() if math.isfinite(v)]
        self.client.log_batch(self.run_id, metrics=metrics)

    def log_summary(self, summary: dict[str, Any], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in _summary_scalars(summary).items()])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


_CLASSES = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


class Trackers(Tracker):
    """The run's trackers; one that fails is logged once and dropped (tracking never stops a run)."""

    def __init__(self, run_dir: Path, cfg: dict[str, Any]) -> None:
        self.active: list[Tracker] = []
        for name in parse_tracking(str(cfg.get("tracking", "tensorboard"))):
            try:
                self.active.append(_CLASSES[name](run_dir, cfg))
            except Exception as err:  # noqa: BLE001 - a tracker is an extra: the run goes on without it
                log.warning("tracking: %s is off for this run: %s: %s", name, type(err).__name__, err)

    def _each(self, method: str, *args: Any) -> None:
        for t in list(self.active):
            try:
                getattr(t, method)(*args)
            except Exception as err:  # noqa: BLE001
                log.warning("tracking: %s is off for the rest of the run: %s: %s", t.name, type(err).__name__, err)
                self.active.remove(t)

    def log_round(self, row: dict[str, Any]) -> None:
        self._each("log_round", row)

    def log_summary(self, summary: dict[str, Any], step: int) -> None:
        self._each("log_summary", summary, step)

    def close(self) -> None:
        self._each("close")
        self.active = []
