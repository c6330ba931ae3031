"""Run-config keys of FENS and its baselines (FedENS, weighted averaging are aggregator choices)."""

from hetfl.common.config import Key

from .aggregators import AGGREGATORS

KEYS = (
    Key("aggregator", str, "nn", "FENS: aggregator over the ensemble's logits", choices=AGGREGATORS),
    Key("aggregator-hidden", int, 40, "FENS: hidden width k of the NN aggregator", min=1),
    Key("fens-local-fraction", float, 0.9, "FENS: share of a client's data for local training (rest: aggregator)", min=0.0, max=1.0, min_inclusive=False, max_inclusive=False),
    Key("fens-quantize", bool, True, "FENS: send the ensemble as INT8 (per-channel symmetric weights)"),
    Key("fens-exclude-own", bool, False, "FENS: do not send a client its own model (it uses its local copy)"),
    Key("agg-client-lr", float, 1.0, "FENS phase 2: client SGD lr of the aggregator", min=0.0, min_inclusive=False),
    Key("agg-server-lr", float, 0.001, "FENS phase 2: FedAdam server lr (eta)", min=0.0, min_inclusive=False),
    Key("agg-batch-size", int, 128, "FENS phase 2: batch size on cached logits", min=1),
    Key("agg-local-steps", int, 1, "FENS phase 2: local steps per round", min=1),
)
