"""Run-config keys and parameters of FENS's one-shot baselines (docs/readings.md#oneshot)."""

from __future__ import annotations

from dataclasses import dataclass

from hetfl.common.config import ConfigError, keys_of
from hetfl.common.params import MethodParams, key
from hetfl.data.byo import is_byo
from hetfl.data.catalog import DATASETS

CLASSIFIER_PHASE1 = ("fedkd", "fedet", "coboost")  # the methods that share a classifier phase 1 (oneshot-reuse)
POS = dict(min=0.0, min_inclusive=False)

HOLDOUT = ("fedkd", "fedet")


def check(cfg: dict) -> None:
    """FedKD and Fed-ET distil on the server's unlabeled set; FedCVAE-Ens needs images; Co-Boosting and FedCVAE-Ens
    keep no checkpoint to resume (FedKD and Fed-ET do, after each server epoch). (The ``oneshot-reuse`` source is
    checked by :func:`check_files`, not here.)"""
    method = cfg["method"]
    if method in HOLDOUT and cfg["server-holdout"] <= 0:
        raise ConfigError(f"run-config key 'server-holdout' = {cfg['server-holdout']}: method {method!r} distils on an "
                          "auxiliary unlabeled set held out of the train split (FMNIST presets: 24000, FENS's 60/40)")
    if method == "fedcvae" and not is_byo(cfg["dataset"]) and DATASETS[cfg["dataset"]].kind != "image":
        raise ConfigError(f"run-config key 'dataset' = {cfg['dataset']!r} does not fit method 'fedcvae': its clients train a "
                          "conditional VAE on images; expected an image dataset")
    for k, off in (("resume", "false"), ("stop-after-round", "0")):
        if method in ("coboost", "fedcvae") and cfg[k]:
            raise ConfigError(f"run-config key '{k}' = {cfg[k]}: method {method!r} is one-shot (one upload, then the "
                              f"server's step) and keeps no checkpoint to go on from (FedKD and Fed-ET do); expected "
                              f"{k} = {off}")


def check_files(cfg: dict) -> None:
    """Pre-flight only (``MethodSpec.preflight``): a reused ensemble must exist on this host and record this run's
    phase-1 settings (its JSON only; docs/readings.md#fens-artifacts). The ServerApp checks it again after discovery."""
    if cfg["method"] in CLASSIFIER_PHASE1 and cfg["oneshot-reuse"]:
        from hetfl.common.oneshot.artifacts import check_reuse

        from . import PHASE1  # imported here: the package's __init__ imports this module first

        check_reuse(cfg, "oneshot-reuse", PHASE1)


@dataclass(frozen=True)
class OneShotParams(MethodParams):
    """What the three one-shot baselines share: where a reused phase-1 ensemble comes from.

    Parameters
    ----------
    reuse : str
        A one-shot run directory (or its ensemble.json) whose phase 1 this run starts from ("" = train it).
    member_val_fraction, member_patience : float, int
        Phase 1 to completion, as FENS's members (``fens-member-*``): the share of a client's data held out to
        choose its model's epochs (at most local-epochs) and the epochs without a better one before it stops.
    """

    reuse: str = key("oneshot-reuse", "", "FedKD / Fed-ET / Co-Boosting: start from the phase-1 ensemble saved by an earlier one-shot run with the same phase-1 settings (its run directory or ensemble.json): no local training, its bytes and times reported")
    member_val_fraction: float = key("oneshot-member-val-fraction", 0.0, "FedKD / Fed-ET / Co-Boosting phase 1: share of a client's data held out to choose its model's epochs, as FENS's fens-member-val-fraction (the best validation epoch of at most local-epochs is kept; 0 = exactly local-epochs)", min=0.0, max=1.0, max_inclusive=False)
    member_patience: int = key("oneshot-member-patience", 0, "FedKD / Fed-ET / Co-Boosting phase 1 with oneshot-member-val-fraction: stop after this many epochs without a better validation accuracy (0 = run every local epoch)", min=0)


@dataclass(frozen=True)
class FedKDParams(OneShotParams):
    """FedKD's one-shot server distillation (Gong et al. 2022; authors' ``distill_local_central_oneshot``).

    Parameters
    ----------
    epochs, batch_size : int
        Adam over the auxiliary set: its epochs and batch size.
    lr, lr_min : float
        A per-epoch cosine from lr to lr_min.
    loss : {"l1", "kl"}
        "l1" (the authors' default: mean abs(student - teacher) on logits) or "kl" (T = 3).
    weighting : {"class-counts", "data-size"}
        "class-counts": member m's logit of class c weighted n_mc / sum_m n_mc; "data-size": n_m / n.
    """

    epochs: int = key("fedkd-epochs", 200, "FedKD: server distillation epochs over the auxiliary set (authors: fedrounds 200)", min=1)
    batch_size: int = key("fedkd-batch-size", 512, "FedKD: server distillation batch size (authors: disbatchsize 512)", min=1)
    lr: float = key("fedkd-lr", 1e-3, "FedKD: server Adam lr (authors: dis_lr 1e-3)", **POS)
    lr_min: float = key("fedkd-lr-min", 1e-3, "FedKD: floor of the per-epoch cosine lr (authors: dis_lrmin 1e-3, i.e. constant)", min=0.0)
    loss: str = key("fedkd-loss", "l1", "FedKD: distillation loss on logits (authors: l1; kl = KL at T = 3)", choices=("l1", "kl"))
    weighting: str = key("fedkd-weighting", "class-counts", "FedKD: member weights of the teacher's logits (authors: clscnt = 1, per-class label counts)", choices=("class-counts", "data-size"))


@dataclass(frozen=True)
class FedETParams(OneShotParams):
    """Fed-ET's one-shot ensemble transfer (Cho et al. 2022, Sec. 3.2): weighted consensus distillation with the
    diversity regularization weighted by `lam`, on FedKD's distillation setup (docs/readings.md#fedet)."""

    lam: float = key("fedet-lambda", 0.05, "Fed-ET: weight of the diversity regularization (FENS: best lambda 0.05)", min=0.0)
    epochs: int = key("fedet-epochs", 200, "Fed-ET: server distillation epochs over the auxiliary set (FedKD's setup, as FENS runs both)", min=1)
    batch_size: int = key("fedet-batch-size", 512, "Fed-ET: server distillation batch size", min=1)
    lr: float = key("fedet-lr", 1e-3, "Fed-ET: server Adam lr", **POS)


@dataclass(frozen=True)
class CoBoostParams(OneShotParams):
    """Co-Boosting (Dai et al. 2024): per epoch, a generator synthesizes hard samples, the ensemble's weights are
    adjusted on the synthetic pool, and the student distils the weighted ensemble on it (docs/readings.md#coboost)."""

    epochs: int = key("coboost-epochs", 200, "Co-Boosting: epochs of synthesis + re-weighting + distillation (authors: 200)", min=1)
    g_steps: int = key("coboost-g-steps", 30, "Co-Boosting: generator steps per epoch (authors: 30)", min=1)
    batch_size: int = key("coboost-batch-size", 128, "Co-Boosting: synthetic batch per epoch and distillation batch size (authors: 128)", min=1)
    lr_g: float = key("coboost-lr-g", 1e-3, "Co-Boosting: Adam lr of the generator and its inputs z (authors: 1e-3)", **POS)
    kd_lr: float = key("coboost-kd-lr", 0.01, "Co-Boosting: student SGD lr, cosine over the epochs (authors: 0.01)", **POS)
    kd_t: float = key("coboost-kd-t", 4.0, "Co-Boosting: distillation temperature (authors: kd_T 4)", **POS)
    ods_eta: float = key("coboost-ods-eta", 8.0, "Co-Boosting: ODS step on the normalised synthetic images, in 1/255 (authors: odseta 8)", min=0.0)
    hs: float = key("coboost-hs", 1.0, "Co-Boosting: hardness exponent of the hard-sample loss (authors: hs 1.0)", min=0.0)
    adv: float = key("coboost-adv", 1.0, "Co-Boosting: weight of the adversarial (student-teacher disagreement) term (authors: adv 1.0)", min=0.0)
    oh: float = key("coboost-oh", 1.0, "Co-Boosting: weight of the hard-sample cross-entropy term (authors: ohg 1.0)", min=0.0)
    mu: float = key("coboost-mu", 0.01, "Co-Boosting: step of the ensemble re-weighting (authors: mu 0.01)", min=0.0)
    wdc: float = key("coboost-wdc", 0.99, "Co-Boosting: per-epoch decay of the re-weighting step (authors: wdc 0.99)", min=0.0, max=1.0)


@dataclass(frozen=True)
class FedCVAEParams(MethodParams):
    """FedCVAE-Ens (Heinbaugh et al. 2023; authors' ``ServerFedCVAEEns``): client CVAEs, decoder upload, a synthetic
    set from the decoders, the classifier trained on it (docs/readings.md#fedcvae). The clients' CVAE training
    reads the run's local-training keys (the presets: the authors' Adam 1e-3, batch 32, 25 epochs).

    Parameters
    ----------
    z_dim : int
        Latent size of the clients' CVAEs.
    beta : float
        KL weight of the clients' CVAE loss.
    z_bound : float
        The server's latent draws are N(0, I) truncated to plus or minus z_bound per coordinate (0: none).
    samples : int
        Size of the synthetic set, split over the clients by data size (the last client takes the rest).
    epochs, batch_size : int
        Adam over the synthetic set, from the initial classifier.
    lr : float
        Its learning rate.
    """

    z_dim: int = key("fedcvae-z-dim", 10, "FedCVAE-Ens: latent size of the clients' CVAEs (authors' FMNIST: z_dim 10)", min=1)
    beta: float = key("fedcvae-beta", 1.0, "FedCVAE-Ens: weight of the KL term in the CVAE loss (authors: beta 1.0)", min=0.0)
    z_bound: float = key("fedcvae-z-bound", 3.0, "FedCVAE-Ens: server z ~ N(0, I) truncated to [-b, b], 0 = untruncated (authors' FMNIST: uniform_range (-3, 3))", min=0.0)
    samples: int = key("fedcvae-samples", 5000, "FedCVAE-Ens: synthetic samples the server classifier trains on (authors: classifier_num_train_samples 5000)", min=1)
    epochs: int = key("fedcvae-epochs", 5, "FedCVAE-Ens: server classifier epochs over the synthetic set (authors' FMNIST: classifier_epochs 5)", min=1)
    batch_size: int = key("fedcvae-batch-size", 32, "FedCVAE-Ens: server classifier batch size (authors: 32)", min=1)
    lr: float = key("fedcvae-lr", 1e-3, "FedCVAE-Ens: server classifier Adam lr (authors: 1e-3)", **POS)


PARAMS = {"fedkd": FedKDParams, "fedet": FedETParams, "coboost": CoBoostParams, "fedcvae": FedCVAEParams}
KEYS = keys_of(PARAMS)  # each declared once, in its parameter object's field
