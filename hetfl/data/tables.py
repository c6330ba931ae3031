"""Tables that ship offline, as a dir: dataset: one of scikit-learn's bundled tabular datasets written as CSV or
Parquet files (train and test: a stratified 80/20 split with a fixed seed), its numeric feature columns in the
dataset's order and an integer label column (docs/node-data.md#tables).

    hetfl tables breast_cancer data/breast-cancer          # CSV
    hetfl tables wine data/wine --format parquet
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

TABLES = ("breast_cancer", "wine", "iris")
"""scikit-learn's bundled tabular classification datasets (``sklearn.datasets.load_<name>``)."""


def _column(name: str) -> str:
    """A feature name as a plain column name (``mean radius`` -> ``mean_radius``, ``sepal length (cm)`` -> ``sepal_length_cm``)."""
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()


def write_table(name: str, out: str | Path, fmt: str = "csv", test_fraction: float = 0.2, seed: int = 0) -> Path:
    """Write scikit-learn's `name` table under `out` as ``train.<fmt>`` and ``test.<fmt>``; returns `out`."""
    import pandas as pd
    from sklearn import datasets
    from sklearn.model_selection import train_test_split

    if name not in TABLES:
        raise ValueError(f"table {name!r} is not allowed; expected one of {', '.join(TABLES)}")
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"format {fmt!r} is not allowed; expected 'csv' or 'parquet'")
    bunch = getattr(datasets, f"load_{name}")()
    frame = pd.DataFrame(np.asarray(bunch.data, dtype=np.float64), columns=[_column(c) for c in bunch.feature_names])
    frame["label"] = np.asarray(bunch.target, dtype=np.int64)
    train, test = train_test_split(frame, test_size=test_fraction, random_state=seed, stratify=frame["label"])
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", train), ("test", test)):
        path = out / f"{split}.{fmt}"
        part.to_csv(path, index=False) if fmt == "csv" else part.to_parquet(path, index=False)
    return out


def main(argv: list[str] | None = None, prog: str = "hetfl tables") -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    p.add_argument("name", help=f"one of {', '.join(TABLES)}")
    p.add_argument("out", help="the directory to write (a dir: dataset)")
    p.add_argument("--format", default="csv", help="csv (default) or parquet")
    a = p.parse_args(argv)
    try:
        out = write_table(a.name, a.out, a.format)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{out}: train.{a.format}, test.{a.format} (dataset = \"dir:{out}\", model = \"mlp\")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
