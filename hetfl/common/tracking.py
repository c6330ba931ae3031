"""Experiment tracking beside metrics.json: metrics.csv, TensorBoard event files, and optionally W&B and MLflow.

The results writer (:class:`hetfl.common.results.RunRecorder`) hands every round's row and the run's
summary to the trackers that the run-config key ``tracking`` names (a comma list):

- ``tensorboard`` (default): ``<run-dir>/tensorboard/events.out.tfevents.*``, written by the small
  dependency-free writer below (TensorBoard's record format: length, masked CRC-32C, ``Event``
  protobuf), so every run has them without installing TensorBoard; view them with
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
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .config import ConfigError, Key, register_keys

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


register_keys(
    Key("tracking", str, "tensorboard", "experiment trackers beside metrics.json/metrics.csv: comma list of "
        "'tensorboard', 'wandb' (offline), 'mlflow' (local files), or 'none' (docs/tracking.md)"),
    Key("tracking-project", str, "hetfl", "W&B project / MLflow experiment name of the run"),
    Key("progress-interval", float, 10.0, "seconds between 'still running' lines of a long phase (local training, "
        "evaluation, FENS phase 1)", min=0.0, min_inclusive=False),
    cross_check=_check,
)


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


# --- TensorBoard event files without TensorBoard --------------------------------------------------

def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), as TFRecord files use."""
    c = 0xFFFFFFFF
    for b in data:
        c = _CRC_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64 two's complement, as protobuf encodes negative int64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    key = _varint(number << 3 | wire)
    return key + (_varint(len(payload)) + payload if wire == 2 else payload)


def event_bytes(wall_time: float, step: int = 0, values: dict[str, float] | None = None,
                file_version: str | None = None) -> bytes:
    """One serialized ``tensorflow.Event``: wall_time (1), step (2), file_version (3) or summary (5) of simple values."""
    out = _field(1, 1, struct.pack("<d", wall_time)) + _field(2, 0, _varint(step))
    if file_version is not None:
        out += _field(3, 2, file_version.encode())
    if values:
        summary = b"".join(_field(1, 2, _field(1, 2, t.encode()) + _field(2, 5, struct.pack("<f", v)))
                           for t, v in values.items())
        out += _field(5, 2, summary)
    return out


def record_bytes(data: bytes) -> bytes:
    """A TFRecord: uint64 length, masked CRC of the length, data, masked CRC of the data."""
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))


def read_records(path: Path) -> Iterable[bytes]:
    """The records of a TFRecord file; ValueError on a bad checksum (what TensorBoard checks)."""
    raw = Path(path).read_bytes()
    pos = 0
    while pos < len(raw):
        header = raw[pos:pos + 8]
        (n,) = struct.unpack("<Q", header)
        if struct.unpack("<I", raw[pos + 8:pos + 12])[0] != masked_crc(header):
            raise ValueError(f"{path}: bad length checksum at byte {pos}")
        data = raw[pos + 12:pos + 12 + n]
        if struct.unpack("<I", raw[pos + 12 + n:pos + 16 + n])[0] != masked_crc(data):
            raise ValueError(f"{path}: bad data checksum at byte {pos}")
        yield data
        pos += 16 + n


class TensorBoardWriter:
    """Appends scalar events to ``<dir>/events.out.tfevents.<time>.<host>.<pid>.hetfl`` (one file per process)."""

    def __init__(self, logdir: Path) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        self.path = logdir / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}.hetfl"
        self._append(event_bytes(time.time(), 0, file_version="brain.Event:2"))

    def _append(self, event: bytes) -> None:
        with open(self.path, "ab") as f:  # opened per event: a crashed run keeps every round written so far
            f.write(record_bytes(event))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if values:
            self._append(event_bytes(time.time(), step, values))


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
    name = "tensorboard"

    def __init__(self, run_dir: Path, cfg: dict[str, Any]) -> None:
        self.writer = TensorBoardWriter(run_dir / "tensorboard")

    def log_round(self, row: dict[str, Any]) -> None:
        self.writer.scalars(int(row["round"]), {tag(k): v for k, v in scalars(row).items()})

    def log_summary(self, summary: dict[str, Any], step: int) -> None:
        self.writer.scalars(step, _summary_scalars(summary))


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
