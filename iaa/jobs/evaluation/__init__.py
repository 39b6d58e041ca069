"""Scoring a trained reader (base): evaluation, the predictor and model code, explain pages, ensemble averaging and the frequency baseline."""
