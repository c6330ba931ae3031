"""hetfl: heterogeneous federated learning on Flower (SHEFL, FENS, AdaptiveFL and their baselines)."""

__version__ = "0.1.0"
