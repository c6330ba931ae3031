"""AdaptiveFL (Jia et al., 2024): width-wise submodel pool, client-side pruning, RL client selection."""

from hetfl.common.registry import MethodSpec

from .keys import KEYS, NODE_KEYS, check

TRAIN = "train.adaptivefl"  # a (sub)model to prune to the device's capacity, train and return

METHOD = MethodSpec(
    names=("adaptivefl",),
    server="hetfl.adaptivefl_app.server_app:run",
    handlers={TRAIN: "hetfl.adaptivefl_app.client_app:train"},
    keys=KEYS,
    check=check,
    node_info="hetfl.adaptivefl_app.client_app:node_info",  # the device tier, for the HeteroFL/Decoupled baselines
    node_keys=NODE_KEYS,  # node config capacity (docs/deployment.md)
)
