"""Shared pieces of all apps: config, data, models, training/evaluation, communication, results."""
