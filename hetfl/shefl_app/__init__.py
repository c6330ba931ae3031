"""SHEFL: heterogeneous ensemble FL with permutation schedule, resource-aware top-k and workload-aware aggregation."""
