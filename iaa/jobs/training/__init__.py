"""Training one reader: its config and presets, the loop, one step, checkpoints, and the throughput bench."""
