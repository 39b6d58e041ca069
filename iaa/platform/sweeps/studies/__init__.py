"""A sweep's Optuna study: its store, the trials carried from an earlier sweep or given to try
first, trials a lost process left running, and the study read back for the report."""
