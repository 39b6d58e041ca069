"""The tracking port: a store of runs, their parameters, metrics, artifacts and models
(:class:`iaa.platform.tracking.tracker.MlflowTracker` implements it)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ContextManager, Mapping, Protocol, Sequence

from iaa.files import DiskFullError
from iaa.jobs.ports.records import MetricPoint, ModelCard, ModelFiles, RunRecord


class TrackedRun(Protocol):
    """One run of the store: what it logs. Failures of the store are warnings, never fatal."""

    run_id: str
    lost: list[str]          # what the store refused for good, with why (empty while all is logged)
    full: Exception | None   # a full disk under the store, once a write met one: an error naming the store

    def status(self) -> str: ...                                          # RUNNING, FINISHED, FAILED, KILLED
    def mark_running(self) -> None: ...                                   # RUNNING again, owned by this process
    def log_params(self, params: Mapping[str, object]) -> None: ...       # nested dicts are flattened
    def log_metrics(self, metrics: Mapping[str, object], step: int | None = None) -> None: ...
    def set_tags(self, tags: Mapping[str, object]) -> None: ...
    def log_dataset(self, prepared: Path, context: str = "train") -> None: ...
    def log_file_input(self, path: Path, context: str) -> None: ...     # a file input (name, path, sha256)
    def log_artifact(self, path: Path, folder: str | None = None) -> None: ...
    def end(self, status: str = "FINISHED") -> None: ...


@dataclass(frozen=True)
class ModelCode:
    """The job's checkpoint code that logging a model needs: ``read`` loads a verified
    checkpoint's state, ``write`` saves the inference-only part of it as a member of the model.

    How the model rebuilds its predictor when it is loaded is not carried here: the model's code
    file (:mod:`iaa.cli.logged_model`, which MLflow runs) hands the predictor's loader to the
    platform's pyfunc model."""

    read: Callable[[Path], dict[str, object]]
    write: Callable[[Path, dict[str, object]], Path]   # saves a state with its digest


class Answerer(Protocol):
    """A loaded reader or ensemble: ``iaa-cli predict``'s rows for its questions."""

    def predict_records(self, records: Sequence[Mapping[str, object]]) -> list[dict[str, object]]: ...


class Tracker(Protocol):
    """A store of runs, their parameters, metrics, artifacts and models.

    A failing store raises one of ``transient_errors``: the caller decides whether the work goes on.
    """

    uri: str
    ui_command: str          # how a person opens the store's runs (``mlflow ui ...``)
    transient_errors: tuple[type[BaseException], ...]

    def start_run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
                  parent_run_id: str | None = None) -> TrackedRun: ...
    def reopen_run(self, run_id: str) -> TrackedRun: ...               # RUNNING again, owned by this process
    def attach(self, run_id: str) -> TrackedRun: ...                   # an existing run, as it is
    def run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
            resume_id: str | None = None,
            parent_run_id: str | None = None) -> ContextManager[TrackedRun]: ...  # ends FINISHED, FAILED or KILLED
    def find_runs(self, experiment: str, tags: Mapping[str, str] | None = None,
                  status: str | None = None) -> list[RunRecord]: ...     # newest first
    def find_by_tag(self, key: str, values: Sequence[str]) -> str | None: ...
    def delete_run(self, run_id: str) -> None: ...      # out of its experiment's runs; the store can restore it
    # the model URI; None (and noted on run) when the store failed; ``card`` describes and tags the
    # version that ``register`` makes (a model logged without ``register`` has no use for it)
    def log_model(self, run: TrackedRun, files: ModelFiles, register: str | None = None, *,
                  code: ModelCode, card: ModelCard | None = None) -> str | None: ...
    def model_uri(self, run_id: str) -> str | None: ...  # the run's logged model, read only; None: none, or the store failed
    def experiment_records(self, experiment: str) -> list[RunRecord] | None: ...  # oldest first
    def experiment_names(self) -> list[str]: ...
    def show_columns(self, experiment: str, columns: Sequence[str]) -> str | None: ...  # a UI URL, then what to click
    def metric_history(self, run_id: str, key: str) -> list[MetricPoint]: ...
    def full(self, failed: str) -> DiskFullError: ...   # the one error of a full disk under the store: it could not ``failed``
