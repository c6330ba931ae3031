"""FedAvg, FedProx and FedAdam on Flower's built-in strategies, sharing the common data/model/training code."""

from hetfl.common.config import Key
from hetfl.common.registry import MethodSpec

KEYS = (
    Key("proximal-mu", float, 0.01, "FedProx proximal coefficient (method = fedprox)", min=0.0),
    Key("server-lr", float, 0.01, "FedAdam server learning rate eta (method = fedadam)", min=0.0, min_inclusive=False),
    Key("adam-update", str, "authors", "FedAdam server step (fedadam, FENS phase 2): 'authors' = no bias correction (FENS code), 'flower' = Flower's bias-corrected step",
        choices=("authors", "flower")),
    Key("adam-tau", float, 1e-3, "FedAdam/FedYogi adaptivity tau (fedadam, FENS phase 2)", min=0.0, min_inclusive=False),
    Key("adam-beta1", float, 0.9, "FedAdam/FedYogi first-moment decay beta_1", min=0.0, max=1.0, max_inclusive=False),
    Key("adam-beta2", float, 0.99, "FedAdam/FedYogi second-moment decay beta_2", min=0.0, max=1.0, max_inclusive=False),
)

METHOD = MethodSpec(
    names=("fedavg", "fedprox", "fedadam"),
    server="hetfl.baselines.server_app:run",
    handlers={"train": "hetfl.baselines.client_app:train"},  # Flower's strategies send plain `train` messages
    keys=KEYS,
)
