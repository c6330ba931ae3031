"""FedAvg, FedProx and FedAdam on Flower's built-in strategies, sharing the common data/model/training code."""

from hetfl.common.config import Key
from hetfl.common.registry import MethodSpec

KEYS = (
    Key("proximal-mu", float, 0.01, "FedProx proximal coefficient (method = fedprox)", min=0.0),
    Key("server-lr", float, 0.01, "FedAdam server learning rate eta (method = fedadam)", min=0.0, min_inclusive=False),
)

METHOD = MethodSpec(
    names=("fedavg", "fedprox", "fedadam"),
    server="hetfl.baselines.server_app:run",
    handlers={"train": "hetfl.baselines.client_app:train"},  # Flower's strategies send plain `train` messages
    keys=KEYS,
)
