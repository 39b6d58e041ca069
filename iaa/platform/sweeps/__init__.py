"""Sweeps on Ray Tune with Optuna: the launcher, one trial, its MLflow child run, the search."""
