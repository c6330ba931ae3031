"""The ``hetfl`` command: one entry point for running, deploying, exporting, tuning and looking things up.

    hetfl run configs/quickstart.toml --run-config "num-server-rounds=5"   # = python -m hetfl.launch ...
    hetfl cluster --nodes 3 --submit configs/quickstart.toml               # = python -m hetfl.cluster ...
    hetfl export configs/quickstart.toml --out split/                      # = python -m hetfl.export ...
    hetfl tune configs/fedavg/fmnist-dir0.1.toml --space "lr=log:0.003:0.3" --trials 8 --rounds 10 --study s/
    hetfl study run experiments/shefl-table1.toml                           # a declared study, to its verdict
    hetfl keys [--method fens]                                              # every run-config key
    hetfl presets [--method fens]                                           # every preset, with what it runs

Each subcommand is the module's own command line (``python -m hetfl.<module>`` keeps working); ``hetfl <sub> --help``
lists its options.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("hetfl.launch", "run one simulation of a preset (Flower's Simulation Engine)"),
    "cluster": ("hetfl.cluster", "a deployment: SuperLink and SuperNodes here, or one role of a real one"),
    "export": ("hetfl.export", "write a run's partition as one directory per client, for devices"),
    "tables": ("hetfl.data.tables", "write one of scikit-learn's bundled tables as a dir: dataset (CSV or Parquet)"),
    "tune": ("hetfl.tune", "choose a method's hyperparameters on validation data (Optuna; docs/tuning.md)"),
    "fleet": ("hetfl.fleets", "a fleet file from a real cluster's measured devices, or its clock checked against a run"),
    "compare": ("hetfl.compare", "every heterogeneous method on one simulated fleet, tuned alike (docs/compare.md)"),
    "study": ("hetfl.study", "a verdict as a declared study: tune alike, train the seeds, decide (docs/verdicts.md)"),
    "keys": ("hetfl.keys", "list the run-config keys (default, allowed values, which methods read them)"),
    "presets": ("hetfl.cli", "list the presets under configs/ with the first line of each one's header"),
}


def header_line(text: str) -> str:
    """The first line of a preset's header comment (what it runs); "" if it has none."""
    for line in text.splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


def presets(argv: list[str], prog: str = "hetfl presets") -> int:
    import argparse
    import tomllib

    p = argparse.ArgumentParser(prog=prog, description=SUBCOMMANDS["presets"][1])
    p.add_argument("--method", help="only the presets of this method")
    a = p.parse_args(argv)
    for path in sorted((ROOT / "configs").rglob("*.toml")):
        text = path.read_text()
        method = tomllib.loads(text).get("method", "fedavg")
        if not a.method or method == a.method:
            print(f"{path.relative_to(ROOT)}\n    {header_line(text) or f'method {method!r}'}")
    return 0


def _main_of(sub: str) -> Callable[..., int]:
    if sub == "presets":
        return presets
    import importlib

    return importlib.import_module(SUBCOMMANDS[sub][0]).main


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: hetfl <command> [options]   (hetfl <command> --help for its options)", "",
             "Heterogeneous federated learning on Flower: SHEFL, FENS, AdaptiveFL and their baselines.", "",
             "commands:"]
    lines += [f"  {name:<{width}}  {doc}" for name, (_, doc) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from hetfl import __version__

        print(f"hetfl {__version__}")
        return 0
    sub, rest = argv[0], argv[1:]
    if sub not in SUBCOMMANDS:
        print(f"error: hetfl {sub!r}: no such command; expected one of {', '.join(SUBCOMMANDS)} (hetfl --help)",
              file=sys.stderr)
        return 2
    return int(_main_of(sub)(rest, prog=f"hetfl {sub}") or 0)


if __name__ == "__main__":
    sys.exit(main())
