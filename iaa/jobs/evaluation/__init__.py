"""Scoring a trained reader (base): evaluation, calibration, the predictor and model code, the frequency
baseline and how a command ends; explain pages (``explaining``) and seed ensembles (``ensembling``)."""
