"""A sweep's trials: the function each runs, its MLflow child run and console events, kept by
Tune callbacks in the driver, and trials lost with their worker or met by a full disk."""
