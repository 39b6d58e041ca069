"""Sweeps on Ray Tune with Optuna: the launcher (``launch``), the search (``search``), the
study (``studies``), the trials (``trials``), the time budget, and the driver's side of a run."""
