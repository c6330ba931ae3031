"""The one cache of arrays: partitions, test and server sets and node-local directories, each an ``.npz`` file
under the cache root, written atomically and kept in the process's memory once read, so every ClientApp process
after the first loads its partition in milliseconds.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from .arrays import ArrayData


def cache_root(cache_dir: str) -> Path:
    """The cache root (made if missing): `cache_dir`, else ``$HETFL_CACHE``, else ``~/.cache/hetfl``."""
    root = Path(cache_dir or os.environ.get("HETFL_CACHE", Path.home() / ".cache" / "hetfl"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _atomic_save(path: Path, data: ArrayData) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".npz")
    os.close(fd)
    np.savez(tmp, x=data.x, y=data.y)
    os.replace(tmp, path)


def _load_npz(path: Path) -> ArrayData:
    with np.load(path, allow_pickle=True) as z:
        return ArrayData(z["x"], z["y"])


_MEM: dict[str, ArrayData] = {}


def cached(path: Path, build: Callable[[], ArrayData]) -> ArrayData:
    """The arrays cached at `path`: from this process's memory, else from the .npz file, else ``build()`` saved there
    (atomically, so concurrent ClientApps never read a half-written file). The one cache of partitions, test and
    server sets and node-local directories; `path` names everything the arrays depend on."""
    key = str(path)
    if key not in _MEM:
        if path.exists():
            _MEM[key] = _load_npz(path)
        else:
            data = build()
            _atomic_save(path, data)
            _MEM[key] = data
    return _MEM[key]
