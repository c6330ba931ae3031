"""Run-config keys of FENS and its baselines (FedENS, weighted averaging, voting are aggregator choices)."""

from pathlib import Path

from hetfl.common.config import ConfigError, Key

from .aggregators import AGGREGATORS, INITS

KEYS = (
    Key("aggregator", str, "nn", "FENS: aggregator over the ensemble's logits", choices=AGGREGATORS),
    Key("aggregator-hidden", int, 0, "FENS: hidden width k of the NN aggregator (0 = 2 x number of models, the authors')", min=0),
    Key("aggregator-init", str, "xavier", "FENS: start of the per-class and linear aggregators (authors: xavier)", choices=INITS),
    Key("fens-local-fraction", float, 0.9, "FENS: share of a client's data for local training (rest: aggregator)", min=0.0, max=1.0, min_inclusive=False, max_inclusive=False),
    Key("fens-quantize", bool, True, "FENS: send the ensemble as INT8 (per-channel symmetric weights)"),
    Key("fens-exclude-own", bool, False, "FENS: do not send a client its own model (it uses its local copy)"),
    Key("fens-diff-init", bool, False, "FENS: every client starts from its own random model (authors' diff_init; no initial download)"),
    Key("fens-reuse", str, "", "FENS: reuse the phase-1 ensemble saved by an earlier run (its run directory or ensemble.json): no local training"),
    Key("agg-server-opt", str, "adam", "FENS phase 2: server optimizer over the aggregator (adam: adam-update/adam-tau; yogi: Flower's FedYogi)",
        choices=("adam", "yogi")),
    Key("agg-client-lr", float, 1.0, "FENS phase 2: client SGD lr of the aggregator", min=0.0, min_inclusive=False),
    Key("agg-server-lr", float, 0.001, "FENS phase 2: server lr (eta) of FedAdam/FedYogi", min=0.0, min_inclusive=False),
    Key("agg-batch-size", int, 128, "FENS phase 2: batch size on cached logits", min=1),
    Key("agg-local-steps", int, 1, "FENS phase 2: local steps per round", min=1),
)


def check(cfg: dict) -> None:
    """A reused ensemble must exist (checked before any process starts)."""
    if cfg["method"] != "fens" or not cfg["fens-reuse"]:
        return
    p = Path(cfg["fens-reuse"])
    if not (p / "ensemble.json" if p.is_dir() else p).is_file():
        raise ConfigError(f"run-config key 'fens-reuse' = {cfg['fens-reuse']!r}: no ensemble there; "
                          "expected a FENS run directory holding ensemble.json, or the ensemble.json file")
