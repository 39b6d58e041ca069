"""The ports of the jobs: what a workflow needs from run tracking and from a cluster.

Jobs are written against these protocols and never import :mod:`iaa.platform`, which holds
the adapters: :class:`iaa.platform.tracking.MlflowTracker` (a :class:`Tracker`) and
:class:`iaa.platform.launch.RayLauncher` (a :class:`Launcher`). ``iaa.cli`` builds them and
hands them to the jobs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager, Mapping, Protocol, Sequence

from iaa.jobs.config import JobConfig
from iaa.jobs.sweep import TrialRecord
from iaa.jobs.workdir import RunFolder

MetricsCallback = Callable[[dict[str, Any]], None]


# --- tracking ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRecord:
    """A tracked run as found by its experiment or tags: its name, start, parameters and tags."""

    run_id: str
    name: str
    status: str
    start_ms: int
    params: Mapping[str, str]
    tags: Mapping[str, str]
    parent_run_id: str | None = None


@dataclass(frozen=True)
class MetricPoint:
    step: int
    value: float
    timestamp_ms: int


class TrackedRun(Protocol):
    """One run of the store: what it logs. Failures of the store are warnings, never fatal."""

    run_id: str
    lost: list[str]          # what the store refused for good, with why (empty while all is logged)

    def log_params(self, params: Mapping[str, Any]) -> None: ...            # nested dicts are flattened
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None: ...
    def set_tags(self, tags: Mapping[str, Any]) -> None: ...
    def log_dataset(self, prepared: Path, context: str = "train") -> None: ...
    def log_file_input(self, path: Path, context: str) -> None: ...     # a file input (name, path, sha256)
    def log_artifact(self, path: Path, folder: str | None = None) -> None: ...
    def end(self, status: str = "FINISHED") -> None: ...


class Tracker(Protocol):
    """A store of runs, their parameters, metrics, artifacts and models."""

    uri: str

    def start_run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
                  parent_run_id: str | None = None) -> TrackedRun: ...
    def reopen_run(self, run_id: str) -> TrackedRun: ...               # RUNNING again, owned by this process
    def attach(self, run_id: str) -> TrackedRun: ...                   # an existing run, as it is
    def run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
            resume_id: str | None = None) -> ContextManager[TrackedRun]: ...  # ends FINISHED, FAILED or KILLED
    def find_runs(self, experiment: str, tags: Mapping[str, str] | None = None,
                  status: str | None = None) -> list[RunRecord]: ...     # newest first
    def find_by_tag(self, key: str, values: Sequence[str]) -> str | None: ...
    def log_model(self, run: TrackedRun, checkpoints: Sequence[Path], prepared: Path,
                  register: str | None = None) -> str | None: ...      # the model URI; None (and noted on run) when the store failed
    def experiment_records(self, experiment: str) -> list[RunRecord] | None: ...  # oldest first
    def experiment_names(self) -> list[str]: ...
    def show_columns(self, experiment: str, columns: Sequence[str], order_by: str) -> str | None: ...  # a UI link
    def metric_history(self, run_id: str, key: str) -> list[MetricPoint]: ...


# --- launching trials and workers ----------------------------------------------------------------


@dataclass(frozen=True)
class Placement:
    """How a group of trials fits the cluster, settled when the launcher connects."""

    name: str                # the run's name under ``storage``
    storage: str             # a local path or a bucket URI
    prepared: Path
    max_concurrent: int      # trials at once
    threads: int             # torch threads per worker
    gpus_per_worker: float
    train_rows: int

    @property
    def experiment_path(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"


@dataclass(frozen=True)
class TrialTracking:
    """Where every trial's child run goes: the store, the experiment and the parent run."""

    uri: str
    experiment: str
    parent_run_id: str | None
    sweep: str
    dataset: str
    data_dir: Path | None = None


@dataclass(frozen=True)
class SearchPlan:
    """What a sweep searches and how it stops trials (the adapter builds the searcher and scheduler)."""

    base: JobConfig
    space: Any               # iaa.jobs.search_space.SearchSpace
    preset: Any              # iaa.jobs.presets.TunePreset, with the request's ASHA settings
    seed: int
    num_samples: int
    max_t: int               # the most checks a trial can reach
    study_storage: str | None = None  # where the searcher keeps its study (an Optuna RDB URL); None: in memory
    study_name: str | None = None


class Launcher(Protocol):
    """Runs trials, Train workers and maps on a cluster."""

    def check_free(self, storage: str, name: str, folder: Path | None = None) -> None: ...
    def claim(self, storage: str, name: str, folder: Path) -> None: ...
    def connect(self, *, name: str, prepared: Path, storage: str, workers_per_trial: int, gpus_per_worker: float,
                threads: int | None, max_concurrent: int | None, num_trials: int,
                show_progress: bool) -> Placement: ...
    def can_resume(self, placement: Placement) -> bool: ...
    def sweep(self, placement: Placement, plan: SearchPlan, trials: TrialTracking, *, resume: bool,
              downloads: Path, progress: Any = None, show_progress: bool = True,
              verbose: bool = False) -> list[TrialRecord]: ...   # progress: an iaa.jobs.console.SweepConsole
    def train_many(self, configs: Sequence[JobConfig], prepared: Path, *, name: str, storage: str,
                   trials: TrialTracking, downloads: Path, workers_per_trial: int = 1, gpus_per_worker: float = 0.0,
                   show_progress: bool = True) -> list[TrialRecord]: ...
    def train_workers(self, cfg: JobConfig, prepared: Path, folder: RunFolder, *, workers: int,
                      gpus_per_worker: float, resume: bool, storage: str, on_metrics: MetricsCallback | None,
                      show_progress: bool) -> dict[str, Any]: ...
