"""hetfl: heterogeneous federated learning on Flower (SHEFL, FENS, AdaptiveFL and their baselines)."""

__version__ = "0.1.0"

# The method registry: registers every method package's `method` names and run-config keys,
# so that a config validates the same wherever hetfl is imported.
from hetfl import methods as _methods  # noqa: E402,F401
