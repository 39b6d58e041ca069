"""Reports read back from tracking: learning curves, a sweep's importances, the frequency baseline."""
