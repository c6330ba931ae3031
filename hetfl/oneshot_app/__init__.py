"""FENS's one-shot baselines FedKD, Fed-ET and Co-Boosting: FENS's phase 1 (every client trains once and uploads its
model), then each paper's server step that turns the ensemble into one model (docs/readings.md#oneshot)."""

from hetfl.common.registry import MethodSpec

from .keys import KEYS, check

LOCAL = "train.oneshot_local"  # phase 1: the initial model down, the trained model (and label counts) up, once

METHOD = MethodSpec(
    names=("fedkd", "fedet", "coboost"),
    server="hetfl.oneshot_app.server_app:run",
    handlers={LOCAL: "hetfl.oneshot_app.client_app:local"},
    keys=KEYS,
    check=check,
    params={"fedkd": "hetfl.oneshot_app.keys:FedKDParams", "fedet": "hetfl.oneshot_app.keys:FedETParams",
            "coboost": "hetfl.oneshot_app.keys:CoBoostParams"},
)
