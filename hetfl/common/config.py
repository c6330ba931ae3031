"""Run-config schema and validation: one place that knows every key, its default and range.

Flower passes the run config as a flat dict of TOML scalars (``context.run_config``).
Every key the apps read is declared here with its type, default and allowed values;
``pyproject.toml`` repeats the defaults (Flower requires them there) and a test keeps
the two in sync. ``validate`` runs in the ServerApp before any training starts and
raises :class:`ConfigError` naming the key and the allowed range.

Method packages extend the schema with :func:`register_keys` so that each method's
keys live next to the method.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


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

    def allowed(self) -> str:
        """Human-readable allowed range."""
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.type in (str, bool):
            return f"a {self.type.__name__}"
        lo = "-inf" if self.min is None else repr(self.min)
        hi = "inf" if self.max is None else repr(self.max)
        lb = "[" if (self.min is not None and self.min_inclusive) else "("
        rb = "]" if (self.max is not None and self.max_inclusive) else ")"
        return f"a {self.type.__name__} in {lb}{lo}, {hi}{rb}"

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
        if self.choices is not None and v not in self.choices:
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


SCHEMA: dict[str, Key] = {}
_CROSS_CHECKS: list[Callable[[dict[str, Any]], None]] = []


def register_keys(*keys: Key, cross_check: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Add keys (and optionally a whole-config check) to the schema."""
    for k in keys:
        if k.name in SCHEMA and SCHEMA[k.name] != k:
            raise RuntimeError(f"run-config key '{k.name}' declared twice differently")
        SCHEMA[k.name] = k
    if cross_check is not None:
        _CROSS_CHECKS.append(cross_check)


def extend_choices(name: str, *values: Any) -> None:
    """Allow more values for a choice key (used by method packages to add `method`s)."""
    key = SCHEMA[name]
    assert key.choices is not None
    new = tuple(dict.fromkeys(key.choices + values))
    SCHEMA[name] = Key(**{**key.__dict__, "choices": new})


DATASETS = ("fashion_mnist", "mnist", "cifar10", "cifar100", "svhn", "ag_news", "digits")
IMAGE_MODELS = ("cnn", "resnet8", "resnet18", "resnet34", "vgg16", "mobilenetv2")
MODELS = IMAGE_MODELS + ("text",)

register_keys(
    Key("method", str, "fedavg", "which method/baseline the ServerApp runs", choices=("fedavg", "fedprox", "fedadam")),
    Key("seed", int, 0, "seed for sampling, initialisation and local shuffling", min=0),
    Key("num-server-rounds", int, 3, "number of federated rounds", min=1),
    Key("fraction-train", float, 0.1, "fraction of connected nodes sampled per round", min=0.0, max=1.0, min_inclusive=False),
    Key("min-available-nodes", int, 2, "wait for at least this many nodes before round 1", min=1),
    Key("round-timeout", float, 3600.0, "seconds to wait for replies in a round", min=0.0, min_inclusive=False),
    # data
    Key("dataset", str, "fashion_mnist", "dataset name", choices=DATASETS),
    Key("data-source", str, "auto", "auto: local files if present else the Hugging Face hub", choices=("auto", "local", "hub")),
    Key("data-dir", str, "", "directory with local dataset files ('' = the standard locations)"),
    Key("cache-dir", str, "", "directory for cached partitions ('' = ~/.cache/hetfl)"),
    Key("partitioner", str, "dirichlet", "how the train split is divided among clients", choices=("iid", "dirichlet", "shards")),
    Key("dirichlet-alpha", float, 0.6, "Dirichlet concentration (smaller = more label skew)", min=0.0, min_inclusive=False),
    Key("dirichlet-min-size", int, 10, "minimum samples per Dirichlet partition", min=0),
    Key("shards-per-client", int, 4, "pathological split: shards per client (400 shards for 100 clients)", min=1),
    Key("partition-seed", int, 42, "seed of the dataset shuffle and the partitioner", min=0),
    Key("max-test-samples", int, 0, "evaluate on the first N test samples (0 = all)", min=0),
    # model
    Key("model", str, "cnn", "model architecture", choices=MODELS),
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
    Key("lr-schedule", str, "constant", "lr schedule inside one local run", choices=("constant", "cosine")),
    Key("proximal-mu", float, 0.01, "FedProx proximal coefficient (method = fedprox)", min=0.0),
    Key("server-lr", float, 0.01, "FedAdam server learning rate eta (method = fedadam)", min=0.0, min_inclusive=False),
    Key("client-threads", int, 1, "torch threads per ClientApp process", min=1),
    # evaluation and results
    Key("eval-batch-size", int, 256, "batch size of centralized evaluation", min=1),
    Key("convergence-threshold", float, 0.0, "accuracy in (0,1] for the convergence round (0 = dataset default)", min=0.0, max=1.0),
    Key("results-dir", str, "results", "where results/<run-id>/ is written (relative = to the current directory)"),
    Key("run-name", str, "", "name of the results folder ('' = method-dataset-partitioner-seed-timestamp)"),
    # fault tolerance
    Key("checkpoint", bool, True, "write results/<run-name>/checkpoint.pkl after every round"),
    Key("resume", bool, False, "continue run-name from its checkpoint (same config) instead of round 1"),
    Key("stop-after-round", int, 0, "end the run after this round, keeping its checkpoint (0 = run all rounds)", min=0),
)


def _cross_check_common(cfg: dict[str, Any]) -> None:
    if cfg["local-steps"] == 0 and cfg["local-epochs"] == 0:
        raise ConfigError(
            "run-config keys 'local-steps' and 'local-epochs' are both 0; "
            "set local-steps >= 1 or local-epochs >= 1"
        )
    is_text = cfg["dataset"] == "ag_news"
    if is_text != (cfg["model"] == "text"):
        raise ConfigError(
            f"run-config key 'model' = {cfg['model']!r} does not fit dataset {cfg['dataset']!r}: "
            f"text datasets need model = 'text', image datasets one of {IMAGE_MODELS}"
        )


register_keys(cross_check=_cross_check_common)


def validate(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """Check every known key, fill defaults, reject unknown keys; return the clean dict."""
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown:
        raise ConfigError(
            f"unknown run-config key(s) {unknown}; known keys: {sorted(SCHEMA)}"
        )
    cfg = {name: key.check(run_config.get(name, key.default)) for name, key in SCHEMA.items()}
    for check in _CROSS_CHECKS:
        check(cfg)
    return cfg


# Method packages declare their own keys next to their code; importing them here makes
# the schema complete wherever the config is validated (ServerApp, ClientApp, launcher).
import hetfl.fens_app.keys  # noqa: E402,F401
import hetfl.shefl_app.keys  # noqa: E402,F401
import hetfl.adaptivefl_app.keys  # noqa: E402,F401
