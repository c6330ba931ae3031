"""The FENS phase-2 strategy: FedAdam (or FedYogi) over the aggregator's parameters (FENS Table 8)."""

from __future__ import annotations

from typing import Any

from hetfl.baselines.strategy import SeededFedAdam, SeededFedYogi, adam_options
from hetfl.common.nodes import ClientMap


class AggregatorFedAdam(SeededFedAdam):
    """FedAdam on the aggregator only; the client models stay frozen (their logits are cached on the clients).

    Default (``adam-update = "authors"``): the authors' step without bias correction, tau 1e-3,
    clients weighted by the samples they saw, min(n_i, batch x steps) (docs/readings.md#fens-phase2).
    """


class AggregatorFedYogi(SeededFedYogi):
    """Flower's FedYogi on the aggregator (``agg-server-opt = "yogi"``; tau from ``adam-tau``)."""


def make_strategy(cfg: dict[str, Any], cmap: ClientMap) -> AggregatorFedAdam | AggregatorFedYogi:
    """Phase 2's strategy: every client every round (nodes were awaited in phase 1), seeded by client id."""
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1,
                  eta=cfg["agg-server-lr"], eta_l=cfg["agg-client-lr"])
    opts = adam_options(cfg)
    if cfg["agg-server-opt"] == "yogi":
        opts.pop("bias_correction")
        strategy = AggregatorFedYogi(**common, **opts)
    else:
        strategy = AggregatorFedAdam(**common, **opts)
    return strategy.bind(cmap, cfg["seed"], cfg["round-timeout"])
