"""FedAvg, FedProx, FedAdam, FedYogi and FedBE on Flower's built-in strategies, and FENS's iterative baselines FedNova,
Scaffold and FedAvg-STC on the same sampling (docs/readings.md#fens-iterative), sharing the common data/model/training code."""

from hetfl.common.config import ConfigError, keys_of
from hetfl.common.fedopt import ADAM_KEYS, ADAM_RENAMED
from hetfl.common.params import NoParams
from hetfl.common.registry import MethodSpec

from .params import FedAdamParams, FedBEParams, FedNovaParams, FedProxParams, FedYogiParams, ScaffoldParams, STCParams

PARAMS = {"fedavg": NoParams, "fedprox": FedProxParams, "fedadam": FedAdamParams, "fedyogi": FedYogiParams,
          "fedbe": FedBEParams, "fednova": FedNovaParams, "scaffold": ScaffoldParams, "fedavg-stc": STCParams}
KEYS = (*keys_of(PARAMS), *ADAM_KEYS)  # each declared once, in its parameter object's field



TRAIN_SCAFFOLD = "train.scaffold"  # Scaffold's train message: the global model, c, and the client's c_i version
TRAIN_STC = "train.stc"  # FedAvg-STC's train message: the global model; the reply is a sparse 16-bit update
SGD_ONLY = ("fednova", "scaffold")


def check(cfg: dict) -> None:
    """FedBE needs the server's unlabeled set; FedNova and Scaffold normalise by steps of plain SGD at a constant lr."""
    method = cfg["method"]
    if method in SGD_ONLY:
        if cfg["optimizer"] != "sgd":
            raise ConfigError(f"run-config key 'optimizer' = {cfg['optimizer']!r}: method {method!r} runs local SGD "
                              "(its update counts SGD steps); use 'sgd'")
        if cfg["lr-schedule"] != "constant":
            raise ConfigError(f"run-config key 'lr-schedule' = {cfg['lr-schedule']!r}: method {method!r} needs a "
                              "constant lr within a round (it divides by steps x lr); use 'constant'")
    if method == "scaffold" and cfg["momentum"] != 0.0:
        raise ConfigError(f"run-config key 'momentum' = {cfg['momentum']}: method 'scaffold' runs plain SGD as the "
                          "FENS authors' Scaffold does (momentum 0); set momentum = 0.0")
    if cfg["method"] == "fedbe" and cfg["server-holdout"] <= 0:
        raise ConfigError(f"run-config key 'server-holdout' = {cfg['server-holdout']}: method 'fedbe' needs an unlabeled "
                          "server set held out of the train split (e.g. 5000 on FMNIST)")


METHOD = MethodSpec(
    names=("fedavg", "fedprox", "fedadam", "fedyogi", "fedbe", "fednova", "scaffold", "fedavg-stc"),
    server="hetfl.baselines.server_app:run",
    handlers={"train": "hetfl.baselines.client_app:train",  # Flower's strategies (and FedNova) send plain `train`
              TRAIN_SCAFFOLD: "hetfl.baselines.client_app:train_scaffold",
              TRAIN_STC: "hetfl.baselines.client_app:train_stc"},
    keys=KEYS,
    check=check,
    params={method: f"{cls.__module__}:{cls.__qualname__}" for method, cls in PARAMS.items()},
    titles={"fedavg": "FedAvg", "fedprox": "FedProx", "fedadam": "FedAdam", "fedyogi": "FedYogi", "fedbe": "FedBE",
            "fednova": "FedNova", "scaffold": "Scaffold", "fedavg-stc": "FedAvg-STC"},
    renamed={"proximal-mu": "fedprox-mu", "server-lr": "fedadam-server-lr", **ADAM_RENAMED},
)
