"""Use case: a seed ensemble from a sweep or given checkpoints (``iaa-cli ensemble``)."""
