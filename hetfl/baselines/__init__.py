"""FedAvg, FedProx, FedAdam and FedBE on Flower's built-in strategies, sharing the common data/model/training code."""

from hetfl.common.config import ConfigError, Key
from hetfl.common.fedopt import ADAM_KEYS, ADAM_RENAMED
from hetfl.common.registry import MethodSpec

KEYS = (
    Key("fedprox-mu", float, 0.01, "FedProx proximal coefficient mu", min=0.0, methods=("fedprox",)),
    Key("fedadam-server-lr", float, 0.01, "FedAdam server learning rate eta", min=0.0, min_inclusive=False, methods=("fedadam",)),
    *ADAM_KEYS,
    Key("fedbe-samples", int, 5, "FedBE: models drawn from the Gaussian over client models (SHEFL: S = 5)", min=0, methods=("fedbe",)),
    Key("fedbe-epochs", int, 20, "FedBE: server distillation epochs over the unlabeled set (SWA over them)", min=1, methods=("fedbe",)),
    Key("fedbe-batch-size", int, 128, "FedBE: server distillation batch size", min=1, methods=("fedbe",)),
    Key("fedbe-lr", float, 1e-3, "FedBE: server distillation SGD learning rate", min=0.0, min_inclusive=False, methods=("fedbe",)),
    Key("fedbe-momentum", float, 0.9, "FedBE: server distillation SGD momentum", min=0.0, max=1.0, max_inclusive=False, methods=("fedbe",)),
    Key("fedbe-weight-decay", float, 1e-5, "FedBE: server distillation SGD weight decay", min=0.0, methods=("fedbe",)),
    Key("fedbe-swa-start", int, 500, "FedBE: distillation steps before SWA snapshots (one per later epoch; 0 = every epoch)", min=0, methods=("fedbe",)),
)


def check(cfg: dict) -> None:
    """FedBE needs the server's unlabeled set."""
    if cfg["method"] == "fedbe" and cfg["server-holdout"] <= 0:
        raise ConfigError(f"run-config key 'server-holdout' = {cfg['server-holdout']}: method 'fedbe' needs an unlabeled "
                          "server set held out of the train split (e.g. 5000 on FMNIST)")


METHOD = MethodSpec(
    names=("fedavg", "fedprox", "fedadam", "fedbe"),
    server="hetfl.baselines.server_app:run",
    handlers={"train": "hetfl.baselines.client_app:train"},  # Flower's strategies send plain `train` messages
    keys=KEYS,
    check=check,
    params={"fedavg": "hetfl.common.params:NoParams", "fedprox": "hetfl.baselines.params:FedProxParams",
            "fedadam": "hetfl.baselines.params:FedAdamParams", "fedbe": "hetfl.baselines.params:FedBEParams"},
    renamed={"proximal-mu": "fedprox-mu", "server-lr": "fedadam-server-lr", **ADAM_RENAMED},
)
