"""The FENS phase-2 strategy: FedAdam over the aggregator's parameters (FENS Table 8)."""

from __future__ import annotations

from hetfl.baselines.strategy import FedAdamF32


class AggregatorFedAdam(FedAdamF32):
    """FedAdam on the aggregator only; the client models stay frozen (their logits are cached on the clients)."""
