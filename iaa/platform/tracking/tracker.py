"""The jobs' :class:`~iaa.jobs.ports.Tracker` on MLflow: the store opened by
:mod:`iaa.platform.tracking.connection`, runs from :mod:`iaa.platform.tracking.store`, read back by
:mod:`iaa.platform.tracking.queries`, models from :mod:`iaa.platform.mlflow_model`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.errors import IaaError
from iaa.files import DiskFullError
from iaa.jobs.ports import MetricPoint, ModelCard, ModelCode, ModelFiles, RunRecord
from iaa.platform import mlflow_model
from iaa.platform.tracking import connection, queries
from iaa.platform.tracking.connection import TRANSIENT
from iaa.platform.tracking.store import Run, run_context


class MlflowTracker:
    """:class:`iaa.jobs.ports.Tracker` on an MLflow store (checked when it is opened).

    ``model_file`` is the code file of the models it logs (models-from-code: MLflow runs it to
    load one), which the composition root names (:data:`iaa.cli.adapters.MODEL_FILE`); without
    it, the tracker logs runs but refuses to log a model.
    """

    transient_errors = TRANSIENT

    def __init__(self, uri: str, model_file: Path | None = None) -> None:
        self.uri = connection.open_store(uri)
        self.model_file = model_file

    @property
    def ui_command(self) -> str:
        """How a person opens the store's runs: a server is its own UI; a database needs ``mlflow ui``."""
        return queries.ui_command(self.uri)

    def full(self, failed: str) -> DiskFullError:
        return connection.store_full(self.uri, failed)

    def start_run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
                  parent_run_id: str | None = None) -> Run:
        return Run.start(self.uri, experiment, name, tags=tags, parent_run_id=parent_run_id)

    def reopen_run(self, run_id: str) -> Run:
        return Run.reopen(self.uri, run_id)

    def attach(self, run_id: str) -> Run:
        return Run(self.uri, run_id)

    def run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
            resume_id: str | None = None, parent_run_id: str | None = None) -> Any:
        return run_context(self.uri, experiment, name, tags=tags, resume_id=resume_id,
                           parent_run_id=parent_run_id)

    def find_runs(self, experiment: str, tags: Mapping[str, str] | None = None,
                  status: str | None = None) -> list[RunRecord]:
        return queries.find_runs(self.uri, experiment, tags, status)

    def find_by_tag(self, key: str, values: Sequence[str]) -> str | None:
        """The newest run tagged ``key`` = one of ``values``; None also when the store fails (a courtesy link)."""
        try:
            return queries.find_by_tag(self.uri, key, values)
        except TRANSIENT:
            return None

    def delete_run(self, run_id: str) -> None:
        """MLflow's soft delete: the run leaves the experiment's list; ``mlflow runs restore`` brings it back."""
        queries.delete_run(self.uri, run_id)

    def log_model(self, run: Run, files: ModelFiles, register: str | None = None, *,
                  code: ModelCode, card: ModelCard | None = None) -> str | None:
        if self.model_file is None:
            raise IaaError("this tracker was opened without a model code file, so it cannot log a model")
        return mlflow_model.try_log(self.uri, run.run_id, files, code, register, run=run, model_file=self.model_file,
                                    card=card)

    def model_uri(self, run_id: str) -> str | None:
        """The URI of run ``run_id``'s logged model; None when it has none or the store fails."""
        try:
            model_id = mlflow_model.logged_model_id(self.uri, run_id)
        except TRANSIENT:
            return None
        return f"models:/{model_id}" if model_id else None

    def experiment_records(self, experiment: str) -> list[RunRecord] | None:
        return queries.experiment_records(self.uri, experiment)

    def experiment_names(self) -> list[str]:
        return queries.experiment_names(self.uri)

    def show_columns(self, experiment: str, columns: Sequence[str]) -> str | None:
        """A saved runs view with these columns, trials nested under their sweep: its URL and how
        to see the trials there (MLflow's UI opens a shared view with every parent collapsed and
        cannot be told otherwise); None when the store failed (a courtesy)."""
        try:
            url = queries.show_columns(self.uri, experiment, columns)
        except TRANSIENT:
            return None
        return None if url is None else f"{url} {queries.EXPAND_HINT}"

    def metric_history(self, run_id: str, key: str) -> list[MetricPoint]:
        return queries.metric_history(self.uri, run_id, key)
