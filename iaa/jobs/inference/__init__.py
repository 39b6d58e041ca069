"""A trained reader at work: evaluate, predict, explain and serve."""
