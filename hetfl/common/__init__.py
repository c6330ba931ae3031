"""Shared pieces of all apps: config, models, training/evaluation, communication, results (their data: hetfl.data)."""
