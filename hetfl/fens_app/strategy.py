"""The FENS phase-2 strategy: FedAdam (or FedYogi) over the aggregator's parameters (FENS Table 8)."""

from __future__ import annotations


from hetfl.common.fedopt import SeededFedAdam, SeededFedYogi
from hetfl.common.nodes import ClientMap
from hetfl.common.params import FederationParams

from .keys import FENSParams


class AggregatorFedAdam(SeededFedAdam):
    """FedAdam on the aggregator only; the client models stay frozen (their logits are cached on the clients).

    Default (``fedadam-update = "authors"``): the authors' step without bias correction, tau 1e-3,
    clients weighted by the samples they saw, min(n_i, batch x steps) (docs/readings.md#fens-phase2).
    """


class AggregatorFedYogi(SeededFedYogi):
    """Flower's FedYogi on the aggregator (``fens-agg-server-opt = "yogi"``; tau from ``fedadam-tau``)."""


def make_strategy(p: FENSParams, fed: FederationParams, cmap: ClientMap) -> AggregatorFedAdam | AggregatorFedYogi:
    """Phase 2's strategy: every client every round (nodes were awaited in phase 1), seeded by client id."""
    common = dict(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=1, min_available_nodes=1,
                  eta=p.agg_server_lr, eta_l=p.agg_client_lr)
    yogi = p.agg_server_opt == "yogi"
    strategy = (AggregatorFedYogi if yogi else AggregatorFedAdam)(**common, **p.adam.options(yogi))
    return strategy.bind(cmap, fed.seed, fed.round_timeout)
