"""FENS's one-shot baselines FedKD, Fed-ET, Co-Boosting and FedCVAE-Ens: FENS's phase 1 (every client trains once and
uploads its model; FedCVAE-Ens: a CVAE, and only its decoder goes up), then each paper's server step that turns the
uploads into one model (docs/readings.md#oneshot)."""

from hetfl.common.oneshot import Phase1
from hetfl.common.registry import MethodSpec

from .keys import CLASSIFIER_PHASE1, KEYS, PARAMS, check

LOCAL = "train.oneshot_local"  # phase 1: the initial model down, the trained model (and label counts) up, once
# all of a client's data, from the downloaded initial model, to completion on a held-out share if asked
_BY_NAME = {k.name: k for k in KEYS}
PHASE1 = Phase1(LOCAL, tuple(_BY_NAME[n] for n in ("oneshot-member-val-fraction", "oneshot-member-patience")),
                reuse_key="oneshot-reuse")
CVAE_LOCAL = "train.fedcvae_local"  # FedCVAE-Ens's phase 1: a request down, the trained CVAE's decoder (and label counts) up
CVAE_PHASE1 = Phase1(CVAE_LOCAL)

METHOD = MethodSpec(
    names=("fedkd", "fedet", "coboost", "fedcvae"),
    server="hetfl.oneshot_app.server_app:run",
    handlers={LOCAL: "hetfl.oneshot_app.client_app:local", CVAE_LOCAL: "hetfl.oneshot_app.client_app:cvae_local"},
    keys=KEYS,
    check=check,
    preflight="hetfl.oneshot_app.keys:check_files",
    params={method: f"{cls.__module__}:{cls.__qualname__}" for method, cls in PARAMS.items()},
    titles={"fedkd": "FedKD", "fedet": "Fed-ET", "coboost": "Co-Boosting", "fedcvae": "FedCVAE-Ens"},
    phase1={m: PHASE1 for m in CLASSIFIER_PHASE1},  # FedCVAE-Ens trains a CVAE: nothing to reuse
)
