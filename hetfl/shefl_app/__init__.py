"""SHEFL: heterogeneous ensemble FL with permutation schedule, resource-aware top-k and workload-aware aggregation."""

from hetfl.common.registry import MethodSpec

from .keys import KEYS, NODE_KEYS, RENAMED, check

TRAIN = "train.shefl"  # the server sends each sampled node the ensemble members it trains

METHOD = MethodSpec(
    names=("shefl",),
    server="hetfl.shefl_app.server_app:run",
    handlers={TRAIN: "hetfl.shefl_app.client_app:train"},
    keys=KEYS,
    check=check,
    node_info="hetfl.shefl_app.client_app:node_info",  # the node's device class (hpc | lpc)
    node_keys=NODE_KEYS,  # node config device-class (docs/deployment.md)
    params={"shefl": "hetfl.shefl_app.keys:SHEFLParams"},
    titles={"shefl": "SHEFL"},
    renamed=RENAMED,
)
