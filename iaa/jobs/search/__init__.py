"""Hyperparameter sweeps: search spaces, the tune job, its record on disk, its cost and its console."""
