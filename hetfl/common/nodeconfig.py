"""Node-config schema: the keys a SuperNode declares with ``--node-config`` (docs/deployment.md).

A node config describes one device: which client it is (``partition-id`` of ``num-partitions``, the client id
every method samples by), where its data is, and its device profile (SHEFL's ``device-class``, AdaptiveFL's
``capacity``). Flower's Simulation Engine sets only ``partition-id`` and ``num-partitions``; a real device
declares the rest. The common keys are declared here; method packages declare their profile keys in their
:class:`~hetfl.common.registry.MethodSpec` (``node_keys``) and :mod:`hetfl.methods` composes the
:class:`NodeSchema` of all of them (``hetfl.methods.NODE_SCHEMA``).

Every check raises :class:`NodeConfigError` with one line naming the key, the value and what is allowed. The
ClientApp checks the whole node config when a node is discovered (the reason reaches the server's log), and
``python -m hetfl.cluster`` checks it before any SuperNode starts. This module imports no method package.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


class NodeConfigError(ValueError):
    """A node-config key is unknown, or its value has the wrong type or is out of range."""


@dataclass(frozen=True)
class NodeKey:
    """One node-config key: what it means, what is allowed (in words) and the check of a value."""

    name: str
    doc: str
    allowed: str
    ok: Callable[[Any], bool]

    def check(self, value: Any) -> Any:
        """Return `value`, or raise NodeConfigError naming the key, the value and what is allowed."""
        try:
            good = self.ok(value)
        except (TypeError, ValueError):
            good = False
        if not good:
            raise NodeConfigError(f"node config key '{self.name}' = {value!r} is not allowed; expected {self.allowed}")
        return value


def is_int(value: Any, lo: int) -> bool:
    """An int (not a bool) of at least `lo`."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= lo


def is_positive_number(value: Any) -> bool:
    """A finite number > 0, as an int, a float or a numeric string (``"2e5"``)."""
    if isinstance(value, bool):
        return False
    v = float(value) if isinstance(value, (int, float, str)) else math.nan
    return math.isfinite(v) and v > 0


def choice(*values: str) -> Callable[[Any], bool]:
    """A check that accepts exactly these strings."""
    return lambda v: isinstance(v, str) and v in values


def quoted(values: tuple[str, ...]) -> str:
    """'a', 'b' or 'c' (for `allowed`)."""
    return ", ".join(repr(v) for v in values)


COMMON_NODE_KEYS: tuple[NodeKey, ...] = (
    NodeKey("partition-id", "this node's client id: the partition it trains on and the id methods sample by",
            "an int >= 0 (and < num-partitions)", lambda v: is_int(v, 0)),
    NodeKey("num-partitions", "how many partitions the training split is divided into (the federation's size)",
            "an int >= 1", lambda v: is_int(v, 1)),
    NodeKey("data-path", "a directory with this node's own data (written by python -m hetfl.export; docs/node-data.md)",
            "a non-empty string (a directory)", lambda v: isinstance(v, str) and v.strip() != ""),
    NodeKey("client-id", "this node's client id when it holds data of its own (default: partition-id, else one "
            "derived from its data-path's content; docs/node-data.md)", "an int >= 0", lambda v: is_int(v, 0)),
)
"""The node keys of every method; a method's device-profile keys are declared in its package."""


class NodeSchema(Mapping[str, NodeKey]):
    """The node-config keys of one build of the app (``hetfl.methods.NODE_SCHEMA``): name -> :class:`NodeKey`."""

    def __init__(self, keys: tuple[NodeKey, ...]) -> None:
        self._keys: dict[str, NodeKey] = {}
        for k in keys:
            if self._keys.get(k.name, k) != k:
                raise RuntimeError(f"node config key '{k.name}' declared twice differently")
            self._keys[k.name] = k

    def __getitem__(self, name: str) -> NodeKey:
        return self._keys[name]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def validate(self, node_config: Mapping[str, Any]) -> dict[str, Any]:
        """Check every key of a node config (unknown keys included) and partition-id < num-partitions.

        Returns the node config as a dict; raises :class:`NodeConfigError` (one line) on the first problem.
        """
        nc = dict(node_config)
        for name, value in nc.items():
            if name not in self._keys:
                raise NodeConfigError(f"node config key {name!r} = {value!r} is not known; expected one of "
                                      f"{quoted(tuple(sorted(self._keys)))}")
            self._keys[name].check(value)
        if "partition-id" in nc and "num-partitions" in nc and nc["partition-id"] >= nc["num-partitions"]:
            raise NodeConfigError(f"node config key 'partition-id' = {nc['partition-id']!r} is not allowed; expected "
                                  f"an int in [0, {nc['num-partitions']}) (num-partitions = {nc['num-partitions']})")
        return nc


@dataclass(frozen=True)
class NodeProfile:
    """What a SuperNode says of itself in its ``--node-config``: data of its own (``data-path``) or a partition of
    the run's dataset, and its device profile (the methods' node keys: SHEFL's ``device-class``, AdaptiveFL's
    ``capacity``). docs/deployment.md#device-profile, docs/node-data.md"""

    node_config: Mapping[str, Any]

    @property
    def data_path(self) -> str | None:
        """The directory of the node's own data, or None for a node that serves partitions of the run's dataset."""
        value = self.node_config.get("data-path")
        return None if value is None else str(value)

    @property
    def own_data(self) -> bool:
        """Whether the node holds data of its own (a real device), as opposed to a partition (simulation)."""
        return "data-path" in self.node_config

    def device(self, key: NodeKey) -> Any:
        """The node's declared device-profile value of `key` (checked), or None when it declares none."""
        value = self.node_config.get(key.name)
        return None if value is None else key.check(value)


def parse_node_config(text: str) -> dict[str, Any]:
    """A ``--node-config`` string parsed as ``flower-supernode`` parses it (TOML values; or a .toml file).

    A string value must be quoted (``device-class="hpc"``); a value TOML cannot read raises NodeConfigError.
    """
    import click
    from flwr.common.config import parse_config_args

    try:
        return parse_config_args([text])
    except (click.ClickException, ValueError) as err:
        bad = [p for p in text.split() if "=" in p and not _toml_value(p.split("=", 1)[1])]
        what = f"{bad[0]!r}" if bad else repr(text)
        raise NodeConfigError(f"--node-config {what} is not key=value with a TOML value; expected e.g. "
                              f"partition-id=0 num-partitions=3 device-class=\"hpc\" (strings in double quotes)") from err
    except OSError as err:
        raise NodeConfigError(f"--node-config {text!r}: cannot read the file ({err.strerror})") from None


def _toml_value(v: str) -> bool:
    import tomllib

    try:
        tomllib.loads(f"x = {v}")
        return True
    except tomllib.TOMLDecodeError:
        return False
