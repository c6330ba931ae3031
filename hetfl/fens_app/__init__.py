"""FENS: one-shot local training, INT8 ensemble download, federated training of a logit aggregator."""

from hetfl.common.oneshot import Phase1
from hetfl.common.registry import MethodSpec

from .keys import KEYS, RENAMED

LOCAL = "train.fens_local"  # phase 1: one-shot local training and upload
LOGITS = "train.fens_logits"  # the (INT8) ensemble download; clients cache its logits
AGGREGATOR = "train"  # phase 2: Flower's FedAdam sends plain `train` messages
# FENS's phase 1 trains on a seeded split, from a downloaded or its own initial model, to completion if asked
_BY_NAME = {k.name: k for k in KEYS}
PHASE1 = Phase1(LOCAL, tuple(_BY_NAME[n] for n in (
    "fens-local-fraction", "fens-diff-init", "fens-member-val-fraction", "fens-member-patience")), legacy_method="fens",
                reuse_key="fens-reuse")

METHOD = MethodSpec(
    names=("fens",),
    server="hetfl.fens_app.server_app:run",
    handlers={
        LOCAL: "hetfl.fens_app.client_app:local",
        LOGITS: "hetfl.fens_app.client_app:logits",
        AGGREGATOR: "hetfl.fens_app.client_app:train_aggregator",
    },
    keys=KEYS,
    preflight="hetfl.fens_app.keys:check_files",
    params={"fens": "hetfl.fens_app.keys:FENSParams"},
    titles={"fens": "FENS"},
    phase1={"fens": PHASE1},
    renamed=RENAMED,
)
