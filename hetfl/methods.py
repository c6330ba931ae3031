"""Registry: run-config `method` -> server entry point."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hetfl.common.config import SCHEMA

ServerFn = Callable[..., Any]


def _baselines(grid, context, cfg):
    from hetfl.baselines.server_app import run

    return run(grid, context, cfg)


def _shefl(grid, context, cfg):
    from hetfl.shefl_app.server_app import run

    return run(grid, context, cfg)


def _fens(grid, context, cfg):
    from hetfl.fens_app.server_app import run

    return run(grid, context, cfg)


def _adaptivefl(grid, context, cfg):
    from hetfl.adaptivefl_app.server_app import run

    return run(grid, context, cfg)


SERVERS: dict[str, ServerFn] = {"fedavg": _baselines, "fedprox": _baselines, "fedadam": _baselines, "shefl": _shefl, "fens": _fens,
                              "adaptivefl": _adaptivefl}


def server_for(method: str) -> ServerFn:
    """The server function for a method (the config validation already checked the name)."""
    try:
        return SERVERS[method]
    except KeyError:
        raise KeyError(f"run-config key 'method' = {method!r}; expected one of {SCHEMA['method'].choices}") from None
