"""hetfl: heterogeneous federated learning on Flower (SHEFL, FENS, AdaptiveFL and their baselines).

The public API is what ``__all__`` names (docs/api.md); each name is imported on first use, so that ``import hetfl``
on a device stays light.
"""

from __future__ import annotations

_API = {  # public name -> the module that defines it
    # strategies: Flower Strategies whose start(grid, initial_arrays, ...) runs on any Grid
    "StrategyBase": "hetfl.common.strategy", "SeededSampling": "hetfl.common.strategy",
    "SeededFedAvg": "hetfl.baselines.strategy", "SeededFedProx": "hetfl.baselines.strategy",
    "SeededFedBE": "hetfl.baselines.strategy", "SeededFedNova": "hetfl.baselines.strategy",
    "SeededScaffold": "hetfl.baselines.strategy", "SeededFedAvgSTC": "hetfl.baselines.strategy",
    "SeededFedAdam": "hetfl.common.fedopt", "SeededFedYogi": "hetfl.common.fedopt",
    "SHEFL": "hetfl.shefl_app.strategy", "AdaptiveFL": "hetfl.adaptivefl_app.strategy", "FENS": "hetfl.fens_app.strategy",
    "FedKD": "hetfl.oneshot_app.strategy", "FedET": "hetfl.oneshot_app.strategy",
    "CoBoosting": "hetfl.oneshot_app.strategy", "FedCVAEEns": "hetfl.oneshot_app.strategy",
    # client functions: what a ClientApp of one's own calls to answer a method's train message
    "shefl_train": "hetfl.shefl_app.client_app", "adaptivefl_train": "hetfl.adaptivefl_app.client_app",
    "fens_local_train": "hetfl.fens_app.client_app", "fens_logits": "hetfl.fens_app.client_app",
    "fens_aggregator_train": "hetfl.fens_app.client_app", "make_aggregator": "hetfl.fens_app.aggregators",
    "oneshot_local_train": "hetfl.oneshot_app.client_app",
    # packing several models in one ArrayRecord (SHEFL's members, Decoupled's models): keys m<j>.<name>
    "pack_models": "hetfl.common.task", "unpack_models": "hetfl.common.task",
    # the round loop's callbacks, and what a failed run raises
    "RoundCallback": "hetfl.common.rounds", "Evaluation": "hetfl.common.rounds", "IdleStop": "hetfl.common.rounds",
    "Checkpointing": "hetfl.common.rounds", "NoClientSucceeded": "hetfl.common.results",
    # clients and discovery
    "register_discovery": "hetfl.common.hosting", "declare_clients": "hetfl.common.hosting",
    "ClientMap": "hetfl.common.nodes", "map_clients": "hetfl.common.nodes", "sample_clients": "hetfl.common.nodes",
    # the papers' pure pieces
    "topk_sparsify": "hetfl.common.compression", "PermutationSchedule": "hetfl.shefl_app.core",
    "workload_weights": "hetfl.shefl_app.core", "SubmodelPool": "hetfl.adaptivefl_app.core",
    "ClientSelector": "hetfl.adaptivefl_app.core", "Aggregator": "hetfl.fens_app.aggregators",
    "quantize_int8": "hetfl.common.compression", "dequantize_int8": "hetfl.common.compression",
    # devices that measure themselves (docs/fleets.md#measured) and the rules that assign their profile
    "DeviceProfile": "hetfl.common.profile", "measure_training": "hetfl.common.profile",
    "measured_classes": "hetfl.shefl_app.core", "budget_capacity": "hetfl.adaptivefl_app.core",
    # the statistics of a verdict
    "paired_interval": "hetfl.stats", "label": "hetfl.stats", "tost": "hetfl.stats", "holm": "hetfl.stats",
    "seeds_needed": "hetfl.stats",
}
__all__ = ["__version__", *_API]


def __getattr__(name: str):
    if name in _API:
        import importlib

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'hetfl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def _version() -> str:
    """The version, written once: pyproject.toml's [project] version (beside the package in a checkout or a FAB),
    else the installed distribution's."""
    from pathlib import Path

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if pyproject.is_file():
        import tomllib

        project = tomllib.loads(pyproject.read_text()).get("project", {})
        if project.get("name") == "hetfl":
            return project["version"]
    from importlib.metadata import version

    return version("hetfl")


__version__ = _version()
