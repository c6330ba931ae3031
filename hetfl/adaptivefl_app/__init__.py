"""AdaptiveFL (Jia et al., 2024): width-wise submodel pool, client-side pruning, RL client selection; and the
baselines of its Sec. 4 built from the same code (HeteroFL, ScaleFL, Decoupled, All-Large: keys.VARIANTS)."""

from hetfl.common.registry import MethodSpec

from .keys import KEYS, NAMES, NODE_KEYS, RENAMED, check

TRAIN = "train.adaptivefl"  # a (sub)model to prune to the device's capacity, train and return

METHOD = MethodSpec(
    names=NAMES,  # AdaptiveFL and the baselines built from its code (keys.VARIANTS)
    server="hetfl.adaptivefl_app.server_app:run",
    handlers={TRAIN: "hetfl.adaptivefl_app.client_app:train"},
    keys=KEYS,
    check=check,
    node_info="hetfl.adaptivefl_app.client_app:node_info",  # the device tier, for the baselines that know tiers
    node_keys=NODE_KEYS,  # node config capacity (docs/deployment.md)
    params=dict.fromkeys(NAMES, "hetfl.adaptivefl_app.keys:AdaptiveFLParams"),
    titles={"adaptivefl": "AdaptiveFL", "heterofl": "HeteroFL", "scalefl": "ScaleFL", "all-large": "All-Large",
            "decoupled": "Decoupled"},
    renamed=RENAMED,
)
