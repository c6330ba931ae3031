"""FedAvg and FedProx on Flower's built-in strategies, sharing the common data/model/training code."""
