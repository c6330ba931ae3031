"""The FENS phase-2 strategy: FedAdam over the aggregator's parameters (FENS Table 8)."""

from __future__ import annotations

from hetfl.baselines.strategy import SeededFedAdam


class AggregatorFedAdam(SeededFedAdam):
    """FedAdam on the aggregator only; the client models stay frozen (their logits are cached on the clients).

    Flower's bias-corrected FedAdam with tau 1e-9; the authors' update is future work (docs/readings.md#fens-phase2).
    """
