"""Export the split a preset makes in simulation, for a deployment: one directory per client and one for the server.

    python -m hetfl.export configs/fedavg/fmnist-dir0.6.toml --out /data/fmnist-split --clients 10 \
        [--set key=value ...]

writes, with the preset's partitioner and ``partition-seed`` and ``--clients`` partitions (default: the preset's
``min-available-nodes``):

* ``<out>/client-<i>/``: partition i, exactly the rows (same images, labels and order) that simulated client i trains
  on, as a ``Dataset.save_to_disk`` directory with the dataset's column names (for a SuperNode started with
  ``--node-config 'data-path="<out>/client-<i>" client-id=<i>'``);
* ``<out>/server/``: the server's data as a ``DatasetDict.save_to_disk`` directory: ``test``, the evaluation set in the
  order simulation evaluates it (``eval-split`` and ``max-test-samples`` apply to it as before), and ``holdout`` when
  ``server-holdout`` > 0 (FedBE's unlabeled set); for run-config ``server-data-path = "<out>/server"``;
* ``<out>/manifest.json``: what was exported (preset, overrides, dataset description, partitioner, rows and label
  counts per client) and the node and run configs that use it.

The partitions come from :func:`hetfl.data.load.load_partition` (the same code and cache as simulation).
docs/node-data.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"


def export_split(run_config: dict[str, Any], out: str | Path, clients: int | None = None) -> dict[str, Any]:
    """Write the clients' partitions, the server's data and the manifest under `out`; return the manifest.

    Parameters
    ----------
    run_config : dict
        The preset's keys with the overrides applied (validated here).
    clients : int, optional
        Number of partitions (default: ``min-available-nodes``, as a simulation of the preset with that many
        SuperNodes).

    Raises
    ------
    ConfigError
        The run config is invalid.
    FileExistsError
        `out` exists and is not empty.
    """
    from hetfl.methods import validate
    from hetfl.data.arrays import label_histogram
    from hetfl.data.byo import is_byo
    from hetfl.data.convert import to_hf
    from hetfl.data.load import load_eval, load_partition, load_server_set
    from hetfl.data.spec import DataSpec

    cfg = validate(run_config)
    n = int(clients or cfg["min-available-nodes"])
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"--out {str(out)!r} exists and is not empty; expected a new or empty directory")
    spec = DataSpec.from_config(cfg, n)
    info = spec.info
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        part = load_partition(spec, i, cfg["cache-dir"])
        # an empty partition (Dirichlet with dirichlet-min-size = 0) still gets one (empty) shard: a readable directory
        to_hf(info, part).save_to_disk(str(out / f"client-{i}"), num_shards=1 if len(part) == 0 else None)
        rows.append({"client-id": i, "dir": f"client-{i}", "rows": len(part),
                     "label_counts": label_histogram(part.y, info.num_classes).tolist()})
    from datasets import DatasetDict

    server = {"test": load_eval(spec, cfg["cache-dir"])}
    if cfg["server-holdout"]:
        server["holdout"] = load_server_set(spec, cfg["cache-dir"])
    DatasetDict({k: to_hf(info, v) for k, v in server.items()}).save_to_disk(str(out / "server"))
    run_keys: dict[str, Any] = {"server-data-path": str(out / "server")}
    if is_byo(cfg["dataset"]):  # nodes describe the dataset from their data: fix the head's size for all of them
        run_keys["num-classes"] = info.num_classes
    manifest = {
        "dataset": cfg["dataset"], "kind": info.kind, "input-column": info.image_col, "label-column": info.label_col,
        "num-classes": info.num_classes, "input-shape": list(info.shape),
        "partitioner": cfg["partitioner"], "partition-seed": cfg["partition-seed"], "num-partitions": n,
        "partition-key": spec.key(), "clients": rows,
        "server": {"dir": "server", "rows": {k: len(v) for k, v in server.items()}},
        "node-config": f'data-path="{out}/client-<i>" client-id=<i>',  # Flower parses the values as TOML
        "run-config": run_keys,
    }
    (out / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None, prog: str = "python -m hetfl.export") -> int:
    from hetfl.launch import (PreflightError, absolute_paths, add_run_config_args, config_errors, load_preset,
                              overrides_of, preflight)

    p = argparse.ArgumentParser(prog=prog, description="Write a run's partition as one directory per client "
                                "(client-<i>/, server/, manifest.json) for devices that hold their own data "
                                "(docs/node-data.md).")
    p.add_argument("config", help="run-config preset (TOML), e.g. configs/fedavg/fmnist-dir0.6.toml")
    p.add_argument("--out", required=True, help="directory to write client-<i>/, server/ and manifest.json into")
    p.add_argument("--clients", type=int, default=None, help="number of partitions (default: min-available-nodes)")
    add_run_config_args(p)
    p.add_argument("--debug", action="store_true", help="show tracebacks of configuration errors")
    a = p.parse_args(argv)
    import datasets

    from hetfl.data.byo import LocalDataError
    from hetfl.data.catalog import DatasetUnavailable

    datasets.disable_progress_bars()  # one progress bar per saved client otherwise

    with config_errors(a.debug):
        if a.clients is not None and a.clients < 1:
            raise PreflightError(f"--clients {a.clients}: expected a number of partitions >= 1")
        run_config = {**load_preset(a.config), **overrides_of(a)}
        run_config.update(absolute_paths(run_config))
        preflight(run_config)
        try:
            m = export_split(run_config, a.out, a.clients)
        except (LocalDataError, DatasetUnavailable, FileExistsError) as err:
            raise PreflightError(str(err)) from None
        except ValueError as err:  # e.g. dirichlet-max-draws exhausted, server-holdout too large
            raise PreflightError(str(err)) from None
    sizes = np.array([c["rows"] for c in m["clients"]])
    out = Path(a.out).resolve()
    print(f"exported {m['num-partitions']} clients of {m['dataset']!r} ({m['partitioner']}, partition-seed "
          f"{m['partition-seed']}): {sizes.sum()} rows, {sizes.min()}-{sizes.max()} per client -> {out}/client-<i>")
    print(f"server: {', '.join(f'{k} {v} rows' for k, v in m['server']['rows'].items())} -> {out}/server")
    if (sizes == 0).any():
        print(f"warning: clients {np.nonzero(sizes == 0)[0].tolist()} hold no rows; their nodes will fail with a "
              "LocalDataError", file=sys.stderr)
    print(f"SuperNode i: --node-config 'data-path=\"{out}/client-<i>\" client-id=<i>'")
    print("run config: " + " ".join(f"{k}={json.dumps(v)}" for k, v in m["run-config"].items()))
    print(f"manifest: {out / MANIFEST}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
