"""FedAvg, FedProx, FedAdam, FedYogi and FedBE on Flower's built-in strategies, and FENS's iterative baselines FedNova,
Scaffold and FedAvg-STC on the same sampling (docs/readings.md#fens-iterative), sharing the common data/model/training code."""

from hetfl.common.config import ConfigError, Key
from hetfl.common.fedopt import ADAM_KEYS, ADAM_RENAMED
from hetfl.common.registry import MethodSpec

KEYS = (
    Key("fedprox-mu", float, 0.01, "FedProx proximal coefficient mu", min=0.0, methods=("fedprox",)),
    Key("fedadam-server-lr", float, 0.01, "FedAdam/FedYogi server learning rate eta", min=0.0, min_inclusive=False, methods=("fedadam", "fedyogi")),
    *ADAM_KEYS,
    Key("fedbe-samples", int, 5, "FedBE: models drawn from the Gaussian over client models (SHEFL: S = 5)", min=0, methods=("fedbe",)),
    Key("fedbe-epochs", int, 20, "FedBE: server distillation epochs over the unlabeled set (SWA over them)", min=1, methods=("fedbe",)),
    Key("fedbe-batch-size", int, 128, "FedBE: server distillation batch size", min=1, methods=("fedbe",)),
    Key("fedbe-lr", float, 1e-3, "FedBE: server distillation SGD learning rate", min=0.0, min_inclusive=False, methods=("fedbe",)),
    Key("fedbe-momentum", float, 0.9, "FedBE: server distillation SGD momentum", min=0.0, max=1.0, max_inclusive=False, methods=("fedbe",)),
    Key("fedbe-weight-decay", float, 1e-5, "FedBE: server distillation SGD weight decay", min=0.0, methods=("fedbe",)),
    Key("fedbe-swa-start", int, 500, "FedBE: distillation steps before SWA snapshots (one per later epoch; 0 = every epoch)", min=0, methods=("fedbe",)),
    Key("fednova-gmf", float, 0.9, "FedNova: global (server) momentum factor (0 = none; FENS authors' script: 0.9)",
        min=0.0, max=1.0, max_inclusive=False, methods=("fednova",)),
    Key("scaffold-server-lr", float, 1.0, "Scaffold: server learning rate eta_g", min=0.0, min_inclusive=False, methods=("scaffold",)),
    Key("stc-density", float, 0.5, "FedAvg-STC: share of the update's entries uploaded (top-k by magnitude; FENS: 0.5)",
        min=0.0, max=1.0, min_inclusive=False, methods=("fedavg-stc",)),
    Key("stc-topk-scope", str, "global", "FedAvg-STC: top-k over the whole model or per tensor", choices=("global", "tensor"), methods=("fedavg-stc",)),
    Key("stc-error-feedback", bool, False, "FedAvg-STC: keep what was not uploaded on the client and add it to the next update", methods=("fedavg-stc",)),
)

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
    params={"fedavg": "hetfl.common.params:NoParams", "fedprox": "hetfl.baselines.params:FedProxParams",
            "fedadam": "hetfl.baselines.params:FedAdamParams",
            "fedyogi": "hetfl.baselines.params:FedYogiParams", "fedbe": "hetfl.baselines.params:FedBEParams",
            "fednova": "hetfl.baselines.params:FedNovaParams", "scaffold": "hetfl.baselines.params:ScaffoldParams",
            "fedavg-stc": "hetfl.baselines.params:STCParams"},
    renamed={"proximal-mu": "fedprox-mu", "server-lr": "fedadam-server-lr", **ADAM_RENAMED},
)
