"""FENS: one-shot local training, INT8 ensemble download, federated training of a logit aggregator."""
