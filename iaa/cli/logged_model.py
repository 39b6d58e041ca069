"""The code of every logged reader model: MLflow runs this file (models-from-code) when it logs
the model and each time it loads it, so loading unpickles nothing.

Like :mod:`iaa.cli.adapters`, it wires the jobs to the platform: the platform's pyfunc model
rebuilds its predictor with the job's loader. Running it sets MLflow's model, so nothing imports
it; :data:`iaa.cli.adapters.MODEL_FILE` hands its path to the tracker, and the ``iaa`` package it
imports travels in the model's ``code_paths``.
"""

from iaa.jobs.evaluation.predictor import Predictor
from iaa.platform.mlflow_model import set_reader

set_reader(Predictor.load)
