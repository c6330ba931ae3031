"""The registry of methods: the one list of method packages (see docs/architecture.md).

Adding a method is one new package under ``hetfl/`` that declares ``METHOD = MethodSpec(...)``
in its ``__init__.py`` (see :class:`hetfl.common.registry.MethodSpec`), plus its name in
:data:`PACKAGES`. This module composes, as values, the run-config :data:`SCHEMA` (the common keys, the trackers' keys
and every package's) and the :data:`NODE_SCHEMA`; the ServerApp looks up its server here and the ClientApp its
handlers.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from hetfl.common import tracking
from hetfl.common.config import COMMON, Schema
from hetfl.common.nodeconfig import COMMON_NODE_KEYS, NodeSchema
from hetfl.common.params import MethodParams, NoParams
from hetfl.common.registry import MethodSpec, load

PACKAGES = (
    "hetfl.baselines",
    "hetfl.shefl_app",
    "hetfl.fens_app",
    "hetfl.adaptivefl_app",
    "hetfl.oneshot_app",
)


def method_table(specs: tuple[MethodSpec, ...]) -> dict[str, MethodSpec]:
    """run-config ``method`` -> the spec declaring it; RuntimeError if two packages declare one name."""
    found: dict[str, MethodSpec] = {}
    for spec in specs:
        clash = [n for n in spec.names if n in found]
        if clash:
            raise RuntimeError(f"method name(s) {clash} declared by two packages")
        found.update(dict.fromkeys(spec.names, spec))
    return found


def compose_schema(specs: tuple[MethodSpec, ...]) -> Schema:
    """The run-config schema of an app serving `specs`: the common keys, the trackers' and each package's."""
    return Schema.compose(
        COMMON,
        Schema(tracking.KEYS, checks=(tracking.check,)),  # the trackers' and progress keys, read by every method
        *(Schema(spec.keys, checks=(spec.check,) if spec.check else (), renamed=spec.renamed) for spec in specs),
        methods=method_table(specs),
    )


SPECS: tuple[MethodSpec, ...] = tuple(importlib.import_module(package).METHOD for package in PACKAGES)
"""Each package's declaration, in :data:`PACKAGES` order."""

METHODS: dict[str, MethodSpec] = method_table(SPECS)
"""run-config ``method`` -> the declaring package's :class:`MethodSpec`."""

SCHEMA: Schema = compose_schema(SPECS)
"""The app's run-config schema: the common keys, the trackers' and every method package's (docs/architecture.md#keys)."""

NODE_SCHEMA: NodeSchema = NodeSchema((*COMMON_NODE_KEYS, *(k for spec in SPECS for k in spec.node_keys)))
"""The node-config keys: the common ones and every method's device profile (docs/deployment.md#node-config)."""


def validate(run_config: Any, given: Any = None) -> dict[str, Any]:
    """The run config checked against :data:`SCHEMA`, with defaults filled (:meth:`Schema.validate
    <hetfl.common.config.Schema.validate>`)."""
    return SCHEMA.validate(run_config, given)


def spec_for(method: str) -> MethodSpec:
    """The spec serving run-config ``method`` (the config validation already checked the name)."""
    try:
        return METHODS[method]
    except KeyError:
        raise KeyError(f"run-config key 'method' = {method!r}; expected one of {SCHEMA['method'].choices}") from None


def server_for(method: str) -> Callable[..., Any]:
    """The server function ``run(grid, context, cfg)`` of a method."""
    return load(spec_for(method).server)


def message_types() -> list[str]:
    """Every message type some method's ClientApp handles (sorted)."""
    return sorted({t for spec in METHODS.values() for t in spec.handlers})


def handler_for(method: str, message_type: str) -> Callable[..., Any]:
    """The ClientApp handler of ``method`` for ``message_type``; ValueError if the method has none."""
    spec = spec_for(method)
    if message_type not in spec.handlers:
        raise ValueError(f"method {method!r} has no handler for message type {message_type!r} "
                         f"(it handles {sorted(spec.handlers)})")
    return load(spec.handlers[message_type])


def title(method: str) -> str:
    """The name a reader knows `method` by (its package's ``titles``: ``"fedcvae"`` -> ``"FedCVAE-Ens"``)."""
    return spec_for(method).titles.get(method, method)


def params_class(method: str) -> type[MethodParams]:
    """The frozen parameter class of ``method`` (:class:`~hetfl.common.params.NoParams` if it declares none)."""
    path = spec_for(method).params.get(method)
    return load(path) if path else NoParams


def phase1_of(method: str) -> Any:
    """The one-shot phase 1 (:class:`~hetfl.common.oneshot.Phase1`) a run of `method` may start from a saved copy
    of (its ``reuse_key``), or None (its package's ``phase1``)."""
    return spec_for(method).phase1.get(method)


def reuse_keys() -> frozenset[str]:
    """Every run-config key that starts a run from a saved phase 1 (``fens-reuse``, ``oneshot-reuse``): where the
    members come from, not what they are (a reused ensemble must record the run's own phase-1 settings)."""
    return frozenset(p.reuse_key for spec in SPECS for p in spec.phase1.values() if p.reuse_key)


def params_for(cfg: dict[str, Any]) -> MethodParams:
    """The run's method parameters, read once from the validated config (docs/architecture.md#params)."""
    return spec_for(cfg["method"]).params_for(cfg)


def node_info(method: str, context: Any, cfg: dict[str, Any], client: int) -> dict[str, Any]:
    """Extra fields a node of ``method`` reports for one of its clients when discovered (empty if none declared)."""
    spec = spec_for(method)
    return dict(load(spec.node_info)(context, cfg, client)) if spec.node_info else {}
