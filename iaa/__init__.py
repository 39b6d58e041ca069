"""Iterative Alternating Attention reader and the platform that trains, tunes and ensembles it."""

__version__ = "0.1.0"
