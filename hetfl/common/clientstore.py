"""Per-client server state on disk: one small file per client, loaded only for the clients of a round.

Scaffold's server keeps a copy of every client's control variate c_i (one model's worth each); in memory that is
unbounded in the number of clients (138 MB for 20 CNN clients, ~69 GB for 10,000). :class:`ClientStateStore` keeps
each client's arrays in ``<run-dir>/<name>/c<client>-r<round>.safetensors`` (safetensors: loading runs no code) and
the server holds only the round of each client's latest version. The newest two versions of a client are kept, so a
run resumed from the checkpoint of the round before a crash still finds the version that checkpoint names
(docs/checkpoints.md#per-client-state).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

import numpy as np

_NAME = re.compile(r"c(\d+)-r(\d+)\.safetensors")


class ClientStateStore:
    """Client id + round -> a dict of arrays, one file each, the newest two versions of a client kept."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, client: int, rnd: int) -> Path:
        return self.root / f"c{int(client)}-r{int(rnd)}.safetensors"

    def put(self, client: int, rnd: int, state: dict[str, np.ndarray]) -> None:
        """Write `client`'s arrays as of round `rnd` (atomically), then drop its versions older than the previous."""
        from safetensors.numpy import save_file

        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        os.close(fd)
        save_file({k: np.ascontiguousarray(v) for k, v in state.items()}, tmp)
        os.replace(tmp, self.path(client, rnd))
        for r in self.rounds(client)[:-2]:
            self.path(client, r).unlink(missing_ok=True)

    def get(self, client: int, rnd: int) -> dict[str, np.ndarray]:
        """`client`'s arrays as of round `rnd`; FileNotFoundError if that version is not stored."""
        from safetensors.numpy import load_file

        return load_file(str(self.path(client, rnd)))

    def rounds(self, client: int) -> list[int]:
        """The rounds of `client`'s stored versions, ascending."""
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(2)) for p in self.root.glob(f"c{int(client)}-r*.safetensors")
                      if (m := _NAME.fullmatch(p.name)) and int(m.group(1)) == int(client))

    def disk_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.root.glob("*.safetensors")) if self.root.is_dir() else 0
