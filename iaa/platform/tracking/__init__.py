"""MLflow tracking: the store and the jobs' Tracker on it."""
