"""Convert a `python -m hetfl.export` directory into plain .npz files the authors' code can read.

    python tools/export_to_npz.py <export-dir> [<out-dir>]      (default out: <export-dir>/npz)

Writes, row order unchanged:
  client-<i>.npz  x: uint8 (n, 28, 28), y: int64 (n,)   -- exactly the rows of <export-dir>/client-<i>
  server_test.npz x, y                                   -- <export-dir>/server `test` split (10,000 rows, in the
                                                            order hetfl evaluates it: first half = validation,
                                                            second half = reported test)
  classes.json    the class names (checked identical in every directory)

Not part of the authors' code: it runs with the project's venv (Hugging Face `datasets`), from outside the
authors' tree, whose own `datasets/` package would shadow the library.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from datasets import load_from_disk


def _arrays(ds, image_col: str, label_col: str, names_ref: list | None):
    names = ds.features[label_col].names if hasattr(ds.features[label_col], "names") else None
    if names_ref is not None and names is not None and names != names_ref:
        raise SystemExit(f"class names differ: {names} vs {names_ref}")
    x = np.stack([np.asarray(im, dtype=np.uint8) for im in ds[image_col]]) if len(ds) else np.zeros((0, 28, 28), np.uint8)
    y = np.asarray(ds[label_col], dtype=np.int64)
    return x, y, names


def main() -> int:
    src = Path(sys.argv[1]).resolve()
    out = Path(sys.argv[2]).resolve() if len(sys.argv) > 2 else src / "npz"
    out.mkdir(parents=True, exist_ok=True)
    man = json.loads((src / "manifest.json").read_text())
    ic, lc = man["input-column"], man["label-column"]
    server = load_from_disk(str(src / man["server"]["dir"]))["test"]
    xs, ys, names = _arrays(server, ic, lc, None)
    np.savez(out / "server_test.npz", x=xs, y=ys)
    for c in man["clients"]:
        x, y, _ = _arrays(load_from_disk(str(src / c["dir"])), ic, lc, names)
        assert len(y) == c["rows"], (c["dir"], len(y), c["rows"])
        assert np.bincount(y, minlength=man["num-classes"]).tolist() == c["label_counts"], c["dir"]
        np.savez(out / f"client-{c['client-id']}.npz", x=x, y=y)
    (out / "classes.json").write_text(json.dumps({"names": names, "num_clients": len(man["clients"]),
                                                  "rows": [c["rows"] for c in man["clients"]],
                                                  "server_test_rows": int(len(ys))}, indent=1) + "\n")
    print(f"{len(man['clients'])} clients + server test ({len(ys)} rows) -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
