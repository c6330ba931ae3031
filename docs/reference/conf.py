"""Sphinx configuration of hetfl's API reference (``make docs``): every name of ``hetfl.__all__``, from its docstring.

The page of names (``api.rst``) is written here from ``hetfl._API`` on every build, so that the reference lists
exactly the public API; warnings and broken cross-references fail the build (``-W -n``, Makefile). Types of other
packages (Flower, NumPy, torch, the standard library) are not cross-referenced: the build is offline, without
intersphinx inventories.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent))

import hetfl  # noqa: E402

project = "hetfl"
author = "the hetfl authors"
release = hetfl.__version__
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = False
napoleon_numpy_docstring = True
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_default_options = {"undoc-members": False, "inherited-members": False}
napoleon_use_ivar = True
napoleon_preprocess_types = True  # {"global", "tensor"}: a choice of literals  # a class's "Attributes" section as fields, not a second description of each attribute
exclude_patterns = ["_build"]
html_theme = "alabaster"
nitpicky = True
napoleon_type_aliases = {  # the short type names that docstrings use, to the documented objects
    "ClientMap": "~hetfl.common.nodes.ClientMap", "RoundCallback": "~hetfl.common.rounds.RoundCallback",
    "SHEFLParams": "~hetfl.shefl_app.keys.SHEFLParams", "AdaptiveFLParams": "~hetfl.adaptivefl_app.keys.AdaptiveFLParams",
    "FederationParams": "~hetfl.common.params.FederationParams", "SubmodelPool": "~hetfl.adaptivefl_app.core.SubmodelPool",
    "Traffic": "~hetfl.common.comm.Traffic", "Ensemble": "~hetfl.common.oneshot.ensemble.Ensemble",
    "FENSParams": "~hetfl.fens_app.keys.FENSParams",
}
EXTERNAL = r"(flwr|numpy|np|torch|nn|optuna|pathlib|collections|typing|dataclasses|logging|abc|enum)(\..*)?"
BUILTINS = r"(int|float|str|bool|dict|list|tuple|set|frozenset|bytes|object|type|None|Any|Callable|Mapping|" \
           r"Sequence|Iterable|Iterator|Collection|MutableMapping|T|P|optional|callable|mapping|sequence|array-like)"
nitpick_ignore_regex = [(r"py:.*", EXTERNAL), (r"py:.*", BUILTINS), (r"py:.*", r"(Array|ArrayRecord|ConfigRecord|"
                        r"MetricRecord|RecordDict|Message|Context|Grid|Result|Strategy|FedAvg|ClientApp|Module|"
                        r"ndarray|Tensor|Generator|Path|ClassVar|TypeVar)"), (r"py:.*", r"(hetfl\.[a-z_.]+\.)?[TP]"),
                        (r"py:.*", r".*\[.*")]  # TypeVars; generics such as dict[int, str] (split at the comma)


SUPPORTING = {  # not in hetfl.__all__, documented because the public names' docstrings refer to them
    "hetfl.common.params": ["key", "MethodParams", "NoParams", "FederationParams", "LocalSGDParams", "apply_options"],
    "hetfl.shefl_app.keys": ["SHEFLParams"], "hetfl.adaptivefl_app.keys": ["AdaptiveFLParams", "Variant"],
    "hetfl.fens_app.keys": ["FENSParams"], "hetfl.common.oneshot.ensemble": ["Ensemble"],
    "hetfl.oneshot_app.keys": ["FedKDParams", "FedETParams", "CoBoostParams", "FedCVAEParams"],
    "hetfl.oneshot_app.strategy": ["OneShotStrategy"], "hetfl.common.oneshot.client": ["phase1_reply"],
    "hetfl.common.fedopt": ["FedAdamParams", "FedYogiParams", "AdamParams", "MomentParams"],
    "hetfl.baselines.params": ["FedProxParams", "FedBEParams", "FedNovaParams", "ScaffoldParams", "STCParams"],
    "hetfl.common.strategy": ["seeded_init", "validate_replies"],
    "hetfl.common.rounds": ["run_rounds", "run_strategy", "record_round"],
    "hetfl.common.nodes": ["discover_clients"], "hetfl.common.registry": ["NODE_QUERY"],
    "hetfl.common.results": ["RunRecorder"], "hetfl.common.comm": ["Traffic", "MeteredGrid"],
    "hetfl.shefl_app.core": ["RoundPlan"], "hetfl.shefl_app.client_app": ["Fit"],
    "hetfl.adaptivefl_app.client_app": ["Fit"], "hetfl.adaptivefl_app.strategy": ["Planner"],
    "hetfl.common.clientstore": ["ClientStateStore"], "hetfl.stats": ["Interval", "Equivalence"],
    "hetfl.baselines.client_app": ["train_scaffold"],
    "hetfl.common.config": ["keys_of", "Key"], "hetfl.inprocess": ["InProcessGrid"], "hetfl.common.final_model": [], "hetfl.common.oneshot.artifacts": [], "hetfl.tune": [], "hetfl.common.tracking": [], "hetfl.common.checkpoint": [], "hetfl.baselines.fedbe": [],
}
MEMBERS = {"RunRecorder": "", "FederationParams": "", "MeteredGrid": " take"}  # supporting classes' members referred to


def _entry(module: str, name: str, members: str | None) -> list[str]:
    import importlib

    obj = getattr(importlib.import_module(module), name)
    kind = "autoclass" if isinstance(obj, type) else "autofunction" if callable(obj) else "autodata"
    return [f".. {kind}:: {module}.{name}", *([f"   :members:{members}"] if members is not None and kind == "autoclass" else []), ""]


def _write_api_page() -> None:
    by_module: dict[str, list[str]] = {}
    for name, module in hetfl._API.items():
        by_module.setdefault(module, []).append(name)
    out = ["The public API", "==============", "",
           "Every name of ``hetfl.__all__``, documented where it is defined (``import hetfl`` then ``hetfl.<name>``).",
           "How they fit together: ``docs/api.md``.", ""]
    for module, names in by_module.items():
        out += [module, "-" * len(module), "", f".. module:: {module}", ""]
        for name in names:
            out += _entry(module, name, "")
    out += ["Supporting types", "================", "",
            "Not public (not in ``hetfl.__all__``): what the names above take, return or refer to.", ""]
    for module, names in SUPPORTING.items():
        out += [module, "-" * len(module), ""]
        if module not in by_module:
            out += [f".. module:: {module}", ""]
        for name in names:
            out += _entry(module, name, MEMBERS.get(name))
    (HERE / "api.rst").write_text("\n".join(out))


_write_api_page()
