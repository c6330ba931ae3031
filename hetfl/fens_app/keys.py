"""Run-config keys and parameters of FENS (its baselines FedENS, weighted averaging and voting are aggregator choices)."""

from dataclasses import dataclass

from hetfl.common.config import keys_of
from hetfl.common.fedopt import ADAM_KEYS, AdamParams
from hetfl.common.params import MethodParams, key

from .aggregators import AGGREGATORS, INITS


RENAMED = {"aggregator": "fens-aggregator", "aggregator-hidden": "fens-aggregator-hidden",
           "aggregator-init": "fens-aggregator-init", **{f"agg-{k}": f"fens-agg-{k}" for k in (
               "server-opt", "client-lr", "server-lr", "batch-size", "local-steps")}}


@dataclass(frozen=True)
class FENSParams(MethodParams):
    """FENS's parameters (Sec. 3; docs/readings.md#fens).

    Parameters
    ----------
    aggregator : str
        The model over the ensemble's logits (``aggregators.AGGREGATORS``; "nn" = the paper's).
    aggregator_hidden : int
        Hidden width k of the NN aggregator (0 = 2 x number of models, the authors').
    aggregator_init : str
        Start of the per-class and linear aggregators.
    local_fraction : float
        Share of a client's data for its one-shot local model; the rest trains the aggregator.
    member_val_fraction, member_patience : float, int
        Members trained to completion (Sec. 3.1's "until convergence"): a share of the local split held out, the
        epoch of best accuracy on it kept, training stopped after `member_patience` epochs without a better one.
    quantize : bool
        Download the ensemble as INT8 (per-channel symmetric).
    exclude_own, diff_init : bool
        Do not send a client its own model; start every client from its own random model.
    reuse : str
        A saved phase-1 ensemble to load instead of training one.
    agg_server_opt : {"adam", "yogi"}
        Phase 2's server optimizer; `adam` holds its constants.
    agg_client_lr, agg_server_lr : float
        Phase 2's client SGD and server (eta) learning rates.
    agg_batch_size, agg_local_steps : int
        Phase 2's batch size on cached logits and local steps per round.
    """

    aggregator: str = key("fens-aggregator", "nn", "FENS: aggregator over the ensemble's logits", choices=AGGREGATORS)
    aggregator_hidden: int = key("fens-aggregator-hidden", 0, "FENS: hidden width k of the NN aggregator (0 = 2 x number of models, the authors')", min=0)
    aggregator_init: str = key("fens-aggregator-init", "xavier", "FENS: start of the per-class and linear aggregators (authors: xavier)", choices=INITS)
    local_fraction: float = key("fens-local-fraction", 0.9, "FENS: share of a client's data for local training (rest: aggregator)", min=0.0, max=1.0, min_inclusive=False, max_inclusive=False)
    member_val_fraction: float = key("fens-member-val-fraction", 0.0, "FENS phase 1: share of a client's local split held out to choose its model's epochs (the best validation epoch of at most local-epochs is kept; 0 = exactly local-epochs)", min=0.0, max=1.0, max_inclusive=False)
    member_patience: int = key("fens-member-patience", 0, "FENS phase 1 with fens-member-val-fraction: stop after this many epochs without a better validation accuracy (0 = run every local epoch)", min=0)
    quantize: bool = key("fens-quantize", True, "FENS: send the ensemble as INT8 (per-channel symmetric weights)")
    exclude_own: bool = key("fens-exclude-own", False, "FENS: do not send a client its own model (it uses its local copy)")
    diff_init: bool = key("fens-diff-init", False, "FENS: every client starts from its own random model (authors' diff_init; no initial download)")
    reuse: str = key("fens-reuse", "", "FENS: reuse the phase-1 ensemble saved by an earlier FENS run with the same phase-1 settings (its run directory or ensemble.json): no local training")
    agg_server_opt: str = key("fens-agg-server-opt", "adam", "FENS phase 2: server optimizer over the aggregator (adam: fedadam-update/fedadam-tau; yogi: Flower's FedYogi)", choices=("adam", "yogi"))
    agg_client_lr: float = key("fens-agg-client-lr", 1.0, "FENS phase 2: client SGD lr of the aggregator", min=0.0, min_inclusive=False)
    agg_server_lr: float = key("fens-agg-server-lr", 0.001, "FENS phase 2: server lr (eta) of FedAdam/FedYogi", min=0.0, min_inclusive=False)
    agg_batch_size: int = key("fens-agg-batch-size", 128, "FENS phase 2: batch size on cached logits", min=1)
    agg_local_steps: int = key("fens-agg-local-steps", 1, "FENS phase 2: local steps per round", min=1)
    adam: AdamParams = key("", AdamParams(), nested=AdamParams)


def check_files(cfg: dict) -> None:
    """Pre-flight only (``MethodSpec.preflight``): a reused ensemble must exist on this host and record this run's
    phase-1 settings (its JSON only; docs/readings.md#fens-artifacts). The ServerApp checks it again after discovery."""
    if cfg["method"] != "fens" or not cfg["fens-reuse"]:
        return
    from hetfl.common.oneshot.artifacts import check_reuse

    from . import PHASE1  # imported here: the package's __init__ imports this module first

    check_reuse(cfg, "fens-reuse", PHASE1)


KEYS = (*keys_of({"fens": FENSParams}), *ADAM_KEYS)
