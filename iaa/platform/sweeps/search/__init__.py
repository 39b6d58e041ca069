"""A sweep's search on Ray Tune: the Optuna searcher, its space-filling start and ASHA."""
