"""AdaptiveFL (Jia et al., 2024): width-wise submodel pool, client-side pruning, RL client selection."""
