"""FENS (hetfl) on scikit-learn's digits: a Flower app of its own that uses hetfl's strategy and client functions."""
