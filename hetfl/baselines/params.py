"""The baselines' parameter objects (docs/architecture.md#params)."""

from __future__ import annotations

from dataclasses import dataclass

from hetfl.common.fedopt import FedAdamParams, FedYogiParams  # noqa: F401 - the FedOpt family's, declared there
from hetfl.common.params import LocalSGDParams, MethodParams, key


@dataclass(frozen=True)
class FedProxParams(MethodParams):
    """FedProx (Li et al. 2020): the proximal term mu/2 ||w - w_t||^2 added to the local loss."""

    mu: float = key("fedprox-mu", 0.01, "FedProx proximal coefficient mu", min=0.0)


@dataclass(frozen=True)
class FedBEParams(MethodParams):
    """FedBE (Chen and Chao 2021): Bayesian ensemble of S sampled models, distilled with SWA on the server's unlabeled
    set (docs/readings.md#fedbe)."""

    samples: int = key("fedbe-samples", 5, "FedBE: models drawn from the Gaussian over client models (SHEFL: S = 5)", min=0)
    epochs: int = key("fedbe-epochs", 20, "FedBE: server distillation epochs over the unlabeled set (SWA over them)", min=1)
    batch_size: int = key("fedbe-batch-size", 128, "FedBE: server distillation batch size", min=1)
    lr: float = key("fedbe-lr", 1e-3, "FedBE: server distillation SGD learning rate", min=0.0, min_inclusive=False)
    momentum: float = key("fedbe-momentum", 0.9, "FedBE: server distillation SGD momentum", min=0.0, max=1.0, max_inclusive=False)
    weight_decay: float = key("fedbe-weight-decay", 1e-5, "FedBE: server distillation SGD weight decay", min=0.0)
    swa_start: int = key("fedbe-swa-start", 500, "FedBE: distillation steps before SWA snapshots (one per later epoch; 0 = every epoch)", min=0)


@dataclass(frozen=True)
class FedNovaParams(MethodParams):
    """FedNova (Wang et al. 2020) as the FENS authors run it: normalised averaging with server momentum `gmf`; the
    normaliser of a client depends on its steps and the local momentum in `sgd` (docs/readings.md#fens-iterative)."""

    gmf: float = key("fednova-gmf", 0.9, "FedNova: global (server) momentum factor (0 = none; FENS authors' script: 0.9)", min=0.0, max=1.0, max_inclusive=False)
    sgd: LocalSGDParams = key("", LocalSGDParams(), nested=LocalSGDParams)


@dataclass(frozen=True)
class ScaffoldParams(MethodParams):
    """Scaffold (Karimireddy et al. 2020, option II): server learning rate eta_g; the control variates use the local
    lr in `sgd` (docs/readings.md#fens-scaffold)."""

    server_lr: float = key("scaffold-server-lr", 1.0, "Scaffold: server learning rate eta_g", min=0.0, min_inclusive=False)
    sgd: LocalSGDParams = key("", LocalSGDParams(), nested=LocalSGDParams)


@dataclass(frozen=True)
class STCParams(MethodParams):
    """FedAvg-STC (FENS Sec. 4: 50% sparse, 16-bit uploads): the share of entries uploaded, the top-k scope and
    whether the client keeps what it did not upload."""

    density: float = key("stc-density", 0.5, "FedAvg-STC: share of the update's entries uploaded (top-k by magnitude; FENS: 0.5)", min=0.0, max=1.0, min_inclusive=False)
    topk_scope: str = key("stc-topk-scope", "global", "FedAvg-STC: top-k over the whole model or per tensor", choices=("global", "tensor"))
    error_feedback: bool = key("stc-error-feedback", False, "FedAvg-STC: keep what was not uploaded on the client and add it to the next update")
