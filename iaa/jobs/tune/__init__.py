"""Use case: a hyperparameter sweep (``iaa-cli tune``)."""
