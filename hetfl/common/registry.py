"""What a method package declares about itself, in one place (see docs/architecture.md).

Each method package (``hetfl/<name>/__init__.py``) defines ``METHOD = MethodSpec(...)``:
its run-config ``method`` names, its run-config keys, its server entry point and its
ClientApp handlers by message type. :mod:`hetfl.methods` lists the packages and is the
only module that reads these declarations; nothing in :mod:`hetfl.common` imports a
method package. Entry points are ``"module:function"`` strings, imported on first use, so
declaring a method costs no import of Flower or PyTorch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .config import Key
from .nodeconfig import NodeKey

NODE_QUERY = "query.node"
"""Message type of the one node-discovery query every ClientApp answers (client id + method extras)."""


def load(path: str) -> Callable[..., Any]:
    """Import ``"package.module:function"`` and return the function."""
    module, _, name = path.partition(":")
    if not name:
        raise ValueError(f"entry point {path!r} is not of the form 'module:function'")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class MethodSpec:
    """A method package's declaration.

    Parameters
    ----------
    names : tuple of str
        Values of the run-config key ``method`` this package serves (e.g. ``("fedavg", "fedprox", "fedadam")``).
    server : str
        ``"module:function"`` of ``run(grid, context, cfg) -> summary`` (the ServerApp calls it with a
        :class:`~hetfl.common.comm.MeteredGrid`).
    handlers : mapping of str to str
        Message type (``"train"``, ``"train.shefl"``, ...) -> ``"module:function"`` of a ClientApp handler
        ``(msg, context, cfg) -> Message``, `cfg` the run config the ClientApp validated. Several packages may serve
        the same message type; the ClientApp picks the handler of the run's ``method``.
    keys : tuple of Key
        The package's own run-config keys (common keys live in :mod:`hetfl.common.config`).
    check : callable, optional
        A whole-config check ``check(cfg)`` raising :class:`~hetfl.common.config.ConfigError`. It runs in every
        validation, i.e. in the ServerApp and in each ClientApp process: the config alone, no files.
    preflight : str, optional
        ``"module:function"`` of a check ``(cfg) -> None`` (ConfigError) that reads files named by the config on the
        launcher's host (e.g. a saved ensemble to reuse); the launcher's pre-flight only, never a ClientApp.
    node_info : str, optional
        ``"module:function"`` of ``(context, cfg, client) -> dict`` with extra fields a node reports for one of its
        clients in its answer to
        :data:`~hetfl.common.registry.NODE_QUERY` (e.g. SHEFL's device class).
    node_keys : tuple of NodeKey
        The node-config keys of the package's device profile (SHEFL's ``device-class``, AdaptiveFL's ``capacity``);
        common node keys live in :mod:`hetfl.common.nodeconfig` (docs/deployment.md).
    params : mapping of str to str
        Method name -> ``"module:Class"`` of its frozen parameter object (a :class:`~hetfl.common.params.MethodParams`),
        built once from the config by ``Class.from_config(cfg)``; strategies and handlers take it.
    titles : mapping of str to str
        Method name -> the name a reader knows it by, as papers and results pages write it (``"fedkd"`` ->
        ``"FedKD"``); every name of :attr:`names` has one (a registry test checks it).
    renamed : mapping of str to str
        Old names of the package's keys -> new names (or ``" <what replaces it>"`` for a removed key): an old name in a
        run config fails with one line saying so (docs/architecture.md#keys).
    phase1 : mapping of str to Phase1
        Method name -> its one-shot :class:`~hetfl.common.oneshot.Phase1` where a run may start from a saved one
        (its ``reuse_key``); a search that leaves phase 1 alone trains it once (:func:`hetfl.tune.phase1_once`).
    """

    names: tuple[str, ...]
    server: str
    handlers: Mapping[str, str] = field(default_factory=dict)
    keys: tuple[Key, ...] = ()
    check: Callable[[dict[str, Any]], None] | None = None
    preflight: str | None = None
    node_info: str | None = None
    node_keys: tuple[NodeKey, ...] = ()
    params: Mapping[str, str] = field(default_factory=dict)
    titles: Mapping[str, str] = field(default_factory=dict)
    renamed: Mapping[str, str] = field(default_factory=dict)
    phase1: Mapping[str, Any] = field(default_factory=dict)

    def params_for(self, cfg: dict[str, Any]) -> Any:
        """The run's frozen parameter object (:attr:`params` of ``cfg["method"]``; ``NoParams()`` if none declared),
        read once from the validated config (docs/architecture.md#params)."""
        from .params import NoParams

        path = self.params.get(cfg["method"])
        return (load(path) if path else NoParams).from_config(cfg)
