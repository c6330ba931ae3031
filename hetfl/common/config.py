"""Run-config schema and validation: one place that knows every key, its default and range.

Flower passes the run config as a flat dict of TOML scalars (``context.run_config``).
Every key the apps read is declared once with its type, default and allowed values: the common keys here
(:data:`COMMON`), a method's keys in the fields of its frozen parameter object (:func:`keys_of`).
:mod:`hetfl.methods` composes the app's :class:`Schema` from them (``hetfl.methods.SCHEMA``), as a value: nothing
here is filled in by importing something else. ``pyproject.toml``'s config block (Flower requires the defaults
there) is generated from it (``python -m hetfl.keys --write-pyproject``) and a test fails when the two differ.
:meth:`Schema.validate` runs before any training starts and raises :class:`ConfigError` naming the key and the
allowed range. This module imports no method package.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

# The dataset table and the model registry are the single sources of the `dataset` and `model` names; a run may
# also bring its own dataset (a hub:/dir: reference) and model (an import path): docs/bring-your-own.md.
from hetfl.data.byo import is_byo
from hetfl.data.catalog import DATASETS, DatasetInfo

from .models import IMPORT_PATH, MODELS, model_spec


class ConfigError(ValueError):
    """A run-config value is missing, of the wrong type or out of range."""


@dataclass(frozen=True)
class Key:
    """One run-config key: type, default, allowed values and a one-line doc."""

    name: str
    type: type
    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    max: float | None = None
    min_inclusive: bool = True
    max_inclusive: bool = True
    pattern: str | None = None  # a str key: values matching this regex are allowed besides `choices`
    pattern_doc: str = ""  # how `allowed()` describes `pattern`
    methods: tuple[str, ...] = ()  # the `method`s that read this key (empty = every method); others reject a set value

    def allowed(self) -> str:
        """Human-readable allowed range."""
        if self.choices is not None:
            names = "one of " + ", ".join(repr(c) for c in self.choices)
            return f"{names}, or {self.pattern_doc}" if self.pattern else names
        if self.type in (str, bool):
            return f"a {self.type.__name__}"  # str, bool
        lo = "-inf" if self.min is None else repr(self.min)
        hi = "inf" if self.max is None else repr(self.max)
        lb = "[" if (self.min is not None and self.min_inclusive) else "("
        rb = "]" if (self.max is not None and self.max_inclusive) else ")"
        article = "an" if self.type is int else "a"
        return f"{article} {self.type.__name__} in {lb}{lo}, {hi}{rb}"

    def check(self, value: Any) -> Any:
        """Return the value coerced to the key's type, or raise ConfigError."""
        v = value
        if self.type is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if self.type is int and isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, self.type) or (self.type is not bool and isinstance(v, bool)):
            raise ConfigError(
                f"run-config key '{self.name}' = {value!r} has type "
                f"{type(value).__name__}; expected {self.allowed()}"
            )
        if self.choices is not None and v not in self.choices and not (self.pattern and re.fullmatch(self.pattern, v)):
            raise ConfigError(
                f"run-config key '{self.name}' = {value!r} is not allowed; "
                f"expected {self.allowed()}"
            )
        if self.type in (int, float):
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(
                    f"run-config key '{self.name}' = {value!r} is not finite; "
                    f"expected {self.allowed()}"
                )
            bad_lo = self.min is not None and (
                v < self.min or (v == self.min and not self.min_inclusive)
            )
            bad_hi = self.max is not None and (
                v > self.max or (v == self.max and not self.max_inclusive)
            )
            if bad_lo or bad_hi:
                raise ConfigError(
                    f"run-config key '{self.name}' = {value!r} is out of range; "
                    f"expected {self.allowed()}"
                )
        return v


DATASET_REFERENCE = r"hub:[^:\s]+(:[^:\s]+)?|dir:.+"  # run-config `dataset` values besides the names of DATASETS

def keys_of(params: Mapping[str, type], methods: tuple[str, ...] | None = None) -> tuple[Key, ...]:
    """The run-config keys that parameter objects declare (method name -> its class; a class may serve several).

    Each field declared with a doc (:func:`hetfl.common.params.key`) is one :class:`Key`, read by the methods whose
    object holds a field of that key (declared there or not) unless the declaration names its methods; in field order. Nested parameter objects declare
    their keys where they are defined (e.g. :mod:`hetfl.common.fedopt`).
    """
    import dataclasses

    found: dict[str, dict[str, Any]] = {}
    readers: dict[str, list[str]] = {}
    for method, cls in params.items():
        for f in dataclasses.fields(cls):
            name = f.metadata.get("key")
            if not name:
                continue
            if f.metadata.get("declare") is not None:
                found.setdefault(name, f.metadata["declare"])
            if method not in readers.setdefault(name, []):
                readers[name].append(method)
    return tuple(Key(name, d["type"], d["default"], d["doc"], methods=d["methods"] or tuple(readers[name]), **d["rules"])
                 for name, d in found.items())


COMMON_KEYS: tuple[Key, ...] = (
    Key("method", str, "fedavg", "which method/baseline the ServerApp runs", choices=()),  # the registry's names: Schema.compose
    Key("seed", int, 0, "seed for sampling, initialisation and local shuffling", min=0),
    Key("num-server-rounds", int, 3, "number of federated rounds", min=1),
    Key("fraction-train", float, 0.1, "fraction of connected clients sampled per round", min=0.0, max=1.0, min_inclusive=False),
    Key("min-available-nodes", int, 2, "wait for at least this many nodes before round 1, and up to round-timeout before each later round", min=1),
    Key("num-clients", int, 0, "clients of the federation (0 = one per SuperNode); > 0: each SuperNode hosts several, round robin", min=0),
    Key("round-timeout", float, 3600.0, "seconds to wait for replies in a round", min=0.0, min_inclusive=False),
    Key("max-idle-rounds", int, 3, "stop the run with an error after this many rounds in a row without one accepted client update (0 = never)", min=0),
    # data
    Key("dataset", str, "fashion_mnist", "dataset name (docs/bring-your-own.md for your own)",
        choices=tuple(DATASETS), pattern=DATASET_REFERENCE, pattern_doc="'hub:<id>[:<subset>]' or 'dir:<directory>' (docs/bring-your-own.md)"),
    Key("input-column", str, "", "column of the images or texts ('' = the named dataset's; hub:/dir: datasets: the first of image, img, text)"),
    Key("label-column", str, "", "column of the integer class ids ('' = the named dataset's; hub:/dir: datasets: label)"),
    Key("num-classes", int, 0, "number of classes (0 = the named dataset's, or the label column's ClassLabel)", min=0),
    Key("server-data-path", str, "", "server's evaluation set: a directory on the server host (an image folder, a save_to_disk directory, or Parquet/CSV/JSON files), split 'test' or its only split ('' = the dataset's test split; docs/node-data.md)"),
    Key("data-source", str, "auto", "auto: local files if present else the Hugging Face hub", choices=("auto", "local", "hub")),
    Key("data-dir", str, "", "directory with local dataset files ('' = the standard locations)"),
    Key("cache-dir", str, "", "directory for cached partitions ('' = ~/.cache/hetfl)"),
    Key("partitioner", str, "dirichlet", "how the train split is divided among clients", choices=("iid", "dirichlet", "shards")),
    Key("dirichlet-alpha", float, 0.6, "Dirichlet concentration (smaller = more label skew)", min=0.0, min_inclusive=False),
    Key("dirichlet-min-size", int, 10, "minimum samples per Dirichlet partition", min=0),
    Key("dirichlet-balance", bool, False, "Dirichlet: stop giving a client more classes once it holds N/clients samples (FENS authors)"),
    Key("dirichlet-max-draws", int, 11, "Dirichlet: redraw up to this many times until every client has dirichlet-min-size (11 = flwr-datasets)", min=1),
    Key("shards-per-client", int, 4, "pathological split: shards per client (400 shards for 100 clients)", min=1),
    Key("server-holdout", int, 0, "train samples held out of every partition for the server (FedBE's unlabeled set; 0 = none)", min=0),
    Key("train-fraction", float, 1.0, "the share of the train split the clients partition, the first of its seeded shuffle after any server holdout (FENS Sec. 3.3.1's data volume at a fixed number of clients; 1.0 = all)", min=0.0, max=1.0, min_inclusive=False),
    Key("partition-seed", int, 42, "seed of the dataset shuffle and the partitioner", min=0),
    Key("max-test-samples", int, 0, "evaluate on the first N test samples (0 = all)", min=0),
    Key("eval-split", str, "all", "report accuracy on the whole test split, or on its second half (first half = validation, FENS)",
        choices=("all", "test-half")),
    # model
    Key("model", str, "cnn", "model architecture, or 'package.module:function' building one (docs/bring-your-own.md)", choices=tuple(MODELS),
        pattern=IMPORT_PATH, pattern_doc="'package.module:function' (a builder fn(num_classes, input_shape) -> torch.nn.Module)"),
    Key("width", float, 1.0, "width multiplier of the model", min=0.0, max=4.0, min_inclusive=False),
    Key("text-model", str, "huawei-noah/TinyBERT_General_4L_312D", "model = 'text': hub id, local directory, or 'minilm-local'"),
    Key("text-max-length", int, 64, "model = 'text': tokens per example", min=8, max=512),
    # local training
    Key("local-steps", int, 10, "local SGD steps per round (0 = use local-epochs)", min=0),
    Key("local-epochs", int, 1, "local epochs per round when local-steps = 0", min=0),
    Key("batch-size", int, 16, "local batch size", min=1),
    Key("optimizer", str, "sgd", "local optimizer", choices=("sgd", "adam")),
    Key("lr", float, 0.01, "local learning rate", min=0.0, min_inclusive=False),
    Key("momentum", float, 0.0, "SGD momentum", min=0.0, max=1.0, max_inclusive=False),
    Key("weight-decay", float, 0.0, "L2 weight decay", min=0.0),
    Key("lr-decay", float, 1.0, "multiply the local lr by this every lr-decay-every rounds", min=0.0, max=1.0, min_inclusive=False),
    Key("lr-decay-every", int, 10, "rounds between lr decays", min=1),
    Key("lr-schedule", str, "constant", "lr schedule inside one local run: cosine per step, or per epoch (FENS authors)", choices=("constant", "cosine", "cosine-epoch")),
    Key("lr-min", float, 0.0, "end point (floor) of the cosine lr schedules (FENS authors: 1e-3)", min=0.0),
    Key("drop-last", bool, False, "drop each epoch's incomplete last local batch (AdaptiveFL authors)"),
    Key("augment", str, "none", "random crop (zero pad 4) and/or horizontal flip of local image batches", choices=("none", "crop", "flip", "crop-flip")),
    Key("client-threads", int, 1, "torch threads per ClientApp process", min=1),
    Key("server-threads", int, 0, "torch threads of the ServerApp process (0 = every CPU it may run on); set once, so "
        "that its evaluation gives the same numbers in every engine", min=0),
    # simulated devices (docs/fleets.md)
    Key("fleet", str, "", "a fleet file (fleets/*.toml): each simulated client gets a tier's device profile and availability; "
        "rows add the round's simulated wall clock ('' = none)"),
    Key("measure-devices", bool, False, "each node times training steps of the run's model on its data when it answers "
        "discovery and reports samples/s, FLOP/s and memory (metrics.json 'measured_devices'); in deployment SHEFL's device "
        "class and AdaptiveFL's capacity follow from it where a node declares none (docs/fleets.md#measured)"),
    Key("measure-seconds", float, 2.0, "measure-devices: seconds of timed training steps after 3 warm-up steps "
        "(2 s: 20 CFS periods, sustained rather than burst speed)", min=0.5, max=60.0),
    # devices and precision (docs/training.md)
    Key("torch-device", str, "auto", "torch device of local training and client logits: auto (CUDA if available), cpu, cuda, cuda:N"),
    Key("server-torch-device", str, "", "torch device of server-side evaluation ('' = torch-device)"),
    Key("precision", str, "fp32", "fp32, or bf16 autocast for local training, logits and evaluation", choices=("fp32", "bf16")),
    # evaluation and results
    Key("eval-batch-size", int, 256, "batch size of centralized evaluation", min=1),
    Key("convergence-threshold", float, 0.0, "accuracy in (0,1] for the convergence round (0 = dataset default)", min=0.0, max=1.0),
    Key("results-dir", str, "results", "where results/<run-name>/ is written (relative = to the current directory)"),
    Key("run-name", str, "", "name of the results folder ('' = method-dataset-partitioner-seed-timestamp)"),
    # fault tolerance
    Key("checkpoint", bool, True, "write results/<run-name>/checkpoint.json (+ the safetensors file it names) after every round"),
    Key("resume", bool, False, "continue run-name from its checkpoint (same config) instead of round 1"),
    Key("stop-after-round", int, 0, "end the run after this round, keeping its checkpoint (0 = run all rounds)", min=0),
)


DEVICE_PATTERN = r"auto|cpu|cuda(:[0-9]+)?"  # values of `torch-device` / `server-torch-device` (docs/training.md)


def _cross_check_common(cfg: dict[str, Any]) -> None:
    if cfg["local-steps"] == 0 and cfg["local-epochs"] == 0:
        raise ConfigError(
            "run-config keys 'local-steps' and 'local-epochs' are both 0; "
            "set local-steps >= 1 or local-epochs >= 1"
        )
    for key in ("torch-device", "server-torch-device"):
        if not (re.fullmatch(DEVICE_PATTERN, cfg[key]) or (key == "server-torch-device" and cfg[key] == "")):
            extra = "'' (= torch-device), " if key == "server-torch-device" else ""
            raise ConfigError(f"run-config key '{key}' = {cfg[key]!r} is not allowed; "
                              f"expected {extra}'auto', 'cpu', 'cuda' or 'cuda:N' (N = GPU index)")
    if cfg["lr-schedule"] in ("cosine", "cosine-epoch") and cfg["lr-min"] > cfg["lr"]:
        raise ConfigError(f"run-config key 'lr-min' = {cfg['lr-min']!r} is above lr = {cfg['lr']!r}; "
                          "expected a float in [0.0, lr] (the end point of the cosine schedule)")
    if not is_byo(cfg["dataset"]):
        info = DATASETS[cfg["dataset"]]
        for key, own in (("input-column", info.image_col), ("label-column", info.label_col), ("num-classes", info.num_classes)):
            if cfg[key] and cfg[key] != own:
                raise ConfigError(f"run-config key {key!r} = {cfg[key]!r} does not fit dataset {cfg['dataset']!r}; expected "
                                  f"{'0' if key == 'num-classes' else repr('')} or {own!r} (the columns and classes of a "
                                  "hub:/dir: dataset are set by these keys)")
        check_dataset_fits(cfg, info)  # a reference is described, and checked, at pre-flight (hetfl.launch.preflight)
    if cfg["fleet"]:
        from .fleet import FleetError, load_fleet

        if cfg["num-clients"] == 0:  # the server and every node must place the same clients in the same tiers
            raise ConfigError(f"run-config key 'fleet' = {cfg['fleet']!r} needs 'num-clients' > 0 (the federation's "
                              "size, over which the fleet's tiers are dealt); set num-clients to the number of clients")

        try:
            load_fleet(cfg["fleet"])
        except FleetError as err:
            raise ConfigError(f"run-config key 'fleet' = {cfg['fleet']!r}: {err}") from None
    if cfg["model"] not in MODELS and cfg["width"] != 1.0:
        raise ConfigError(f"run-config key 'width' = {cfg['width']!r} does not apply to model {cfg['model']!r} (an import "
                          "path: the builder decides the width); expected 1.0")


def check_dataset_fits(cfg: dict[str, Any], info: DatasetInfo) -> None:
    """ConfigError (one line) if `augment` or a registry `model` does not fit the dataset described by `info`."""
    if cfg["augment"] != "none" and info.kind != "image":
        raise ConfigError(f"run-config key 'augment' = {cfg['augment']!r} does not fit dataset {cfg['dataset']!r} "
                          "(not images); expected 'none'")
    if cfg["model"] not in MODELS:  # an import path: hetfl.launch.preflight builds it and runs one batch
        return
    why = model_spec(cfg["model"]).unsupported(info.kind, info.shape)
    if why:
        fits = [n for n, m in MODELS.items() if m.unsupported(info.kind, info.shape) is None]
        raise ConfigError(
            f"run-config key 'model' = {cfg['model']!r} does not fit dataset {cfg['dataset']!r}: {why}; "
            f"expected one of {tuple(fits)}"
        )


class Schema(Mapping[str, Key]):
    """The run-config keys of one build of the app, composed once (:meth:`compose`) from the common part
    (:data:`COMMON`) and each method package's declarations, by :mod:`hetfl.methods`; immutable, no module state.

    A mapping of key name -> :class:`Key`, with the whole-config checks and the old key names (docs/architecture.md#keys).
    """

    def __init__(self, keys: Iterable[Key] = (), checks: Iterable[Callable[[dict[str, Any]], None]] = (),
                 renamed: Mapping[str, str] | None = None) -> None:
        self._keys: dict[str, Key] = {}
        for k in keys:
            if k.name in self._keys and self._keys[k.name] != k:
                raise RuntimeError(f"run-config key '{k.name}' declared twice differently")
            self._keys[k.name] = k
        self.checks: tuple[Callable[[dict[str, Any]], None], ...] = tuple(checks)
        self.renamed: Mapping[str, str] = MappingProxyType(dict(renamed or {}))
        """Old run-config key -> its new name (or, for a key that is gone, what replaces it: text starting with a space)."""

    def __getitem__(self, name: str) -> Key:
        return self._keys[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    @classmethod
    def compose(cls, *parts: Schema, methods: Iterable[str] = ()) -> Schema:
        """One schema of several parts (a key declared twice must be declared the same; an old name renamed once);
        `methods` are the allowed values of the ``method`` key."""
        keys = [k for part in parts for k in part.values()]
        renamed: dict[str, str] = {}
        for part in parts:
            for old, new in part.renamed.items():
                if renamed.get(old, new) != new:
                    raise RuntimeError(f"run-config key '{old}' renamed twice differently")
                renamed[old] = new
        names = tuple(dict.fromkeys(methods))
        keys = [replace(k, choices=tuple(dict.fromkeys(k.choices + names))) if k.name == "method" else k for k in keys]
        return cls(keys, [c for part in parts for c in part.checks], renamed)

    def defaults(self) -> dict[str, Any]:
        """Every key at its default."""
        return {name: key.default for name, key in self._keys.items()}

    def renamed_message(self, old: str) -> str:
        """One line telling what became of the old key `old`."""
        new = self.renamed[old]
        if new.startswith(" "):
            return f"run-config key '{old}' was removed;{new}"
        return f"run-config key '{old}' was renamed to '{new}'"

    def unknown_key_message(self, name: str) -> str:
        """One line for a key the schema does not know: what it was renamed to, or the closest known keys."""
        if name in self.renamed:
            return self.renamed_message(name)
        close = difflib.get_close_matches(name, list(self._keys), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else "; `python -m hetfl.launch --keys` lists them"
        return f"unknown run-config key '{name}'{hint}"

    def upgrade(self, stored: Mapping[str, Any]) -> dict[str, Any]:
        """A config stored by an older version (a committed metrics.json) under today's key names.

        Renamed keys take their new names; AdaptiveFL's old ``adaptivefl-variant`` becomes the ``method``.
        """
        out = {k if self.renamed.get(k, " ").startswith(" ") else self.renamed[k]: v for k, v in stored.items()}
        variant = out.pop("adaptivefl-variant", None)
        if variant is not None and out.get("method") == "adaptivefl":
            out["method"] = variant
        return out

    def validate(self, run_config: Mapping[str, Any], given: Iterable[str] | None = None) -> dict[str, Any]:
        """Check every known key, fill defaults, reject unknown keys and keys the method does not read.

        Parameters
        ----------
        run_config : mapping
            The run config (Flower's ``context.run_config``: pyproject defaults merged with the run's overrides).
        given : iterable of str, optional
            The keys the user set (a preset and its overrides). A method-specific key in `given` that the run's
            ``method`` does not read is an error; without `given` (the ServerApp, which sees every default), such a
            key is an error only when its value differs from its default.
        """
        unknown = sorted(set(run_config) - set(self._keys))
        if unknown:
            more = f" (and {len(unknown) - 1} more unknown)" if len(unknown) > 1 else ""
            raise ConfigError(self.unknown_key_message(unknown[0]) + more)
        cfg = {name: key.check(run_config.get(name, key.default)) for name, key in self._keys.items()}
        explicit = None if given is None else set(given)
        for name, key in self._keys.items():
            if not key.methods or cfg["method"] in key.methods or name not in run_config:
                continue
            if name not in explicit if explicit is not None else cfg[name] == key.check(key.default):
                continue
            raise ConfigError(f"run-config key '{name}' = {cfg[name]!r} is not read by method '{cfg['method']}'; "
                              f"it applies to method {' / '.join(repr(m) for m in key.methods)} (remove it, or change 'method')")
        for check in self.checks:
            check(cfg)
        return cfg


COMMON = Schema(COMMON_KEYS, checks=(_cross_check_common,),
                renamed={"device": "torch-device", "server-device": "server-torch-device"})  # 'device' also meant a tier
"""The keys every method reads (and their checks); :mod:`hetfl.methods` composes the app's schema from it."""
