"""Flower's FedAvg on scikit-learn's digits (the twin of hetfl's examples)."""
