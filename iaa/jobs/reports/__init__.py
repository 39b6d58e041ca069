"""Use case: reports read back from tracking: learning curves and a sweep's importances."""
