"""The one ServerApp: validates the run config, then runs the method it names.

Method servers have the signature ``run(grid, context, cfg) -> summary`` and receive a
:class:`~hetfl.common.comm.MeteredGrid`, so every method's bytes are counted the same way.
"""

from __future__ import annotations

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from hetfl.common.comm import MeteredGrid
from hetfl.common.task import config_of, log, seed_everything, server_threads, setup_logging
from hetfl.methods import SCHEMA, server_for

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Validate the config (fails before any training), seed, dispatch on `method`."""
    setup_logging()
    cfg = config_of(context, SCHEMA)
    seed_everything(cfg["seed"])
    torch.set_num_threads(server_threads(cfg))  # the same evaluation numbers in every engine (task.server_threads)
    log.info("method=%s dataset=%s model=%s rounds=%d", cfg["method"], cfg["dataset"], cfg["model"], cfg["num-server-rounds"])
    server_for(cfg["method"])(MeteredGrid(grid), context, cfg)
