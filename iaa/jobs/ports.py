"""The ports of the jobs: what a workflow needs from run tracking and from a cluster.

Jobs are written against these protocols and never import :mod:`iaa.platform`, which holds
the adapters: :class:`iaa.platform.tracking.tracker.MlflowTracker` (a :class:`Tracker`) and
:class:`iaa.platform.sweeps.launch.RayLauncher` (a :class:`Launcher`). ``iaa.cli`` builds them and
hands them to the jobs. The adapters import from :mod:`iaa.jobs` only these ports, the configs
and the work folder's paths: the job code they run (the training loop, the predictor) reaches
them as callables the job passes in, and the records they share with the jobs live here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ContextManager, Mapping, Protocol, Sequence

from iaa.errors import IaaError
from iaa.jobs.search.search_space import SearchSpace
from iaa.jobs.training.config import JobConfig, from_dict, to_dict
from iaa.jobs.training.presets import TunePreset
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, RunFolder

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from iaa.jobs.inference.raw_text import Question

Metrics = dict[str, object]
MetricsCallback = Callable[[Metrics], None]
FAILED_STATUSES = frozenset({"ERROR", "FAILED"})


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
    """The job's code that a logged model needs: ``read`` loads a verified checkpoint's state, and
    ``load`` rebuilds the predictor from member checkpoints and a data folder (its
    ``predict_records`` answers predict's rows). The model pickles ``load`` by reference, so both
    are module-level callables of :mod:`iaa`, which travels with the model."""

    read: Callable[[Path], dict[str, object]]
    load: Callable[[Sequence[Path], "Path | None"], "Answerer"]
    write: Callable[[Path, dict[str, object]], Path]   # saves a state with its digest


class Answerer(Protocol):
    """A loaded reader or ensemble: ``iaa-cli predict``'s rows for its questions."""

    def predict_records(self, records: Sequence[Mapping[str, object]]) -> list[dict[str, object]]: ...


class Tracker(Protocol):
    """A store of runs, their parameters, metrics, artifacts and models.

    A failing store raises one of ``transient_errors``: the caller decides whether the work goes on.
    """

    uri: str
    transient_errors: tuple[type[BaseException], ...]

    def start_run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
                  parent_run_id: str | None = None) -> TrackedRun: ...
    def reopen_run(self, run_id: str) -> TrackedRun: ...               # RUNNING again, owned by this process
    def attach(self, run_id: str) -> TrackedRun: ...                   # an existing run, as it is
    def run(self, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
            resume_id: str | None = None) -> ContextManager[TrackedRun]: ...  # ends FINISHED, FAILED or KILLED
    def find_runs(self, experiment: str, tags: Mapping[str, str] | None = None,
                  status: str | None = None) -> list[RunRecord]: ...     # newest first
    def find_by_tag(self, key: str, values: Sequence[str]) -> str | None: ...
    def log_model(self, run: TrackedRun, checkpoints: Sequence[Path], prepared: Path, register: str | None = None, *,
                  code: ModelCode) -> str | None: ...      # the model URI; None (and noted on run) when the store failed
    def experiment_records(self, experiment: str) -> list[RunRecord] | None: ...  # oldest first
    def experiment_names(self) -> list[str]: ...
    def show_columns(self, experiment: str, columns: Sequence[str]) -> str | None: ...  # a UI URL
    def metric_history(self, run_id: str, key: str) -> list[MetricPoint]: ...


# --- launching trials and workers ----------------------------------------------------------------


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a sweep (or one member trained for an ensemble), as ``sweep.json`` stores it."""

    trial_id: str
    config: JobConfig
    params: Mapping[str, object] = field(default_factory=dict)   # the Tune config: sampled values
    best_valid_acc: float | None = None
    checkpoint: str | None = None          # the best checkpoint file, readable from the driver
    mlflow_run_id: str | None = None
    status: str = "TERMINATED"             # Tune's: TERMINATED, ERROR, or unfinished (RUNNING, PENDING ...)
    checks: int = 0
    steps: int = 0
    stop_reason: str = ""                  # the loop's (patience, max_epochs ...), or "asha"
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES

    @property
    def scored(self) -> bool:
        """Finished without error and made at least one validation check."""
        return self.best_valid_acc is not None and not self.failed

    def to_json(self) -> dict[str, object]:
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**row, "config": to_dict(self.config), "params": dict(self.params)}

    @classmethod
    def from_json(cls, row: Mapping[str, object]) -> "TrialRecord":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in known}
        acc = values.get("best_valid_acc")
        return cls(**{**values, "config": from_dict(row["config"]), "params": dict(row.get("params") or {}),
                      "best_valid_acc": float(acc) if acc is not None else None})


CHECKPOINT_FILE = "checkpoint.pt"       # the state file inside every reported checkpoint folder
# Ray keeps the checkpoint with the highest score plus the latest. The score is valid_acc at the
# checks that improved it and -1 elsewhere, so a later check that only ties the best never
# displaces the best checkpoint (the loop's best is the first check reaching the maximum).
CHECKPOINT_SCORE = "checkpoint_score"


class WorkerLink(Protocol):
    """What the training loop on a cluster worker needs from the cluster (a Tune trial or a Train
    worker); :class:`iaa.jobs.training.session.ClusterSession` builds the loop's session on it."""

    rank: int
    world_size: int
    device: "torch.device"

    def all_reduce(self, values: Sequence[float], op: str) -> list[float]: ...   # op: "sum" or "min"
    def prepare_model(self, model: "torch.nn.Module") -> "torch.nn.Module": ...  # the model on device (DDP)
    def last_checkpoint(self) -> ContextManager[Path | None]: ...        # the latest reported folder
    def publish(self, metrics: Metrics, folder: Path | None) -> None: ...  # folder: rank 0 only


class WorkerFit(Protocol):
    """The job's loop on one worker (:func:`iaa.jobs.training.train.fit_on_worker`): a trial gets its
    ``train`` and ``valid`` tables and ``vocab`` card; a Train worker reads its rows of ``prepared``.
    It travels to Ray workers pickled by reference, so it is a module-level function."""

    def __call__(self, cfg: JobConfig, link: WorkerLink, *, threads: int, vocab_hash: str, prepared: str = "",
                 train: "pa.Table | None" = None, valid: "pa.Table | None" = None,
                 vocab: Mapping[str, object] | None = None) -> Metrics: ...


# (checkpoints, prepared, split, limit, out folder) -> each member's predictions file
Scorer = Callable[[Sequence[Path], Path, str, "int | None", Path], list[Path]]


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
    """Where every trial's child run goes: the tracker, the experiment and the parent run."""

    tracker: Tracker
    experiment: str
    parent_run_id: str | None
    sweep: str
    dataset: str
    data_dir: Path | None = None


@dataclass(frozen=True)
class SearchPlan:
    """What a sweep searches and how it stops trials (the adapter builds the searcher and scheduler)."""

    base: JobConfig
    space: SearchSpace
    preset: TunePreset       # with the request's ASHA settings
    seed: int
    num_samples: int
    max_t: int               # the most checks a trial can reach
    study_storage: str | None = None  # where the searcher keeps its study (an Optuna RDB URL); None: in memory
    study_name: str | None = None


MEMBER_KEY = "member"      # train_many: each trial's Tune config is {"member": index into its configs}


class SweepEvents(Protocol):
    """What a sweep's console hears of its trials (:class:`iaa.jobs.search.console.SweepConsole`)."""

    def trial_started(self, trial_id: str, config: Mapping[str, object]) -> None: ...
    def trial_checked(self, trial_id: str, result: Mapping[str, object]) -> None: ...
    def trial_ended(self, trial_id: str, reason: str, error: str | None = None) -> None: ...
    def tick(self) -> None: ...
    def placed(self, concurrency: int) -> None: ...                       # how many trials run at once


@dataclass(frozen=True)
class ConnectRequest:
    """A group of trials to place on the cluster."""

    name: str                          # the run's name under ``storage``
    prepared: Path
    storage: str
    num_trials: int
    workers_per_trial: int = 1
    gpus_per_worker: float = 0.0
    threads: int | None = None         # torch threads per worker; None: what the cluster's CPUs allow
    max_concurrent: int | None = None  # None: as many as fit
    show_progress: bool = True


@dataclass(frozen=True)
class SweepRequest:
    """A search, placed by :meth:`Launcher.connect`, its trials tracked under ``tracking``."""

    placement: Placement
    plan: SearchPlan
    tracking: TrialTracking
    fit: WorkerFit
    downloads: Path                    # where checkpoints kept in a bucket are copied
    resume: bool = False               # continue the saved run of ``placement``
    console: SweepEvents | None = None
    show_progress: bool = True
    verbose: bool = False              # the cluster's own progress tables too


@dataclass(frozen=True)
class MembersRequest:
    """Configs to train as parallel trials, without search or early stopping (an ensemble's members)."""

    configs: tuple[JobConfig, ...]
    prepared: Path
    name: str
    storage: str
    tracking: TrialTracking
    fit: WorkerFit
    downloads: Path
    workers_per_trial: int = 1
    gpus_per_worker: float = 0.0
    show_progress: bool = True
    console: SweepEvents | None = None    # hears every member's events
    verbose: bool = False                 # the cluster's own progress tables too


@dataclass(frozen=True)
class WorkersRequest:
    """One training run on several data-parallel workers, its files in ``folder``."""

    cfg: JobConfig
    prepared: Path
    folder: RunFolder
    fit: WorkerFit
    workers: int
    storage: str
    gpus_per_worker: float = 0.0
    resume: bool = False
    on_metrics: MetricsCallback | None = None
    show_progress: bool = True


class Launcher(Protocol):
    """Runs trials, Train workers and maps on a cluster."""

    def check_free(self, storage: str, name: str, folder: Path | None = None) -> None: ...
    def claim(self, storage: str, name: str, folder: Path) -> None: ...
    def connect(self, request: ConnectRequest) -> Placement: ...
    def can_resume(self, placement: Placement) -> bool: ...
    def sweep(self, request: SweepRequest) -> list[TrialRecord]: ...
    def train_many(self, request: MembersRequest) -> list[TrialRecord]: ...   # one record per config, in order
    def train_workers(self, request: WorkersRequest) -> Metrics: ...


# --- serving ---------------------------------------------------------------------------------------

MODEL_PREFIXES = ("models:/", "runs:/")


class RequestError(IaaError):
    """A request the server refuses, with its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status

    def body(self) -> dict[str, object]:
        return {"error": str(self), "status": self.status}


@dataclass(frozen=True)
class Limits:
    """What one request may hold (over them: 413)."""

    max_document_words: int = 5000       # CNN documents run to ~2,000 words, CBT's to ~1,000
    max_query_words: int = 500           # CNN and CBT queries run to ~100 words
    max_candidates: int = 1000           # per question; CNN's run to ~500 entities, CBT's are 10
    max_questions: int = 256             # per request
    max_request_bytes: int = 8 << 20

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise IaaError(f"serve limit {name} must be a whole number >= 1, got {value!r}")


@dataclass(frozen=True)
class ServeCode:
    """The serve job's code that the Serve adapter runs (module-level callables, pickled by
    reference): ``load(source, threads=, fetch_model=)`` builds a reader replica's warmed-up
    answerer; ``parse(body, placeholder, lowercase, limits)`` checks one request body and returns
    ``(questions, single)`` or raises :class:`RequestError` (the ingress runs it, so a batch only
    computes); ``request_schema`` is the JSON schema of a request body, for the OpenAPI document."""

    load: Callable[..., "ServedModel"]
    parse: Callable[[bytes, str, bool, Limits], "tuple[list[Question], bool]"]
    request_schema: Mapping[str, object]


class ServedModel(Protocol):
    """What a reader replica holds: the loaded model, its names, and its answers to checked questions."""

    name: str
    version: str
    model: str
    load_seconds: float | None
    placeholder: str
    lowercase: bool

    def answer(self, requests: "Sequence[Sequence[Question]]") -> list[list[dict[str, object]] | Exception]: ...


@dataclass(frozen=True)
class ModelSource:
    """What a replica loads: ``kind`` is ``model`` (an MLflow URI), ``checkpoint`` or ``ensemble``."""

    kind: str
    ref: str
    data_dir: str | None = None          # the prepared folder (checkpoint, ensemble); None: the checkpoints' own vocabulary
    workdir: str = DEFAULT_WORKDIR
    tracking_uri: str | None = None      # for models:/ URIs

    def __post_init__(self) -> None:
        if self.kind not in ("model", "checkpoint", "ensemble"):
            raise IaaError(f"unknown model source kind {self.kind!r}")
        if self.kind == "model" and not self.ref.startswith(MODEL_PREFIXES):
            raise IaaError(f"--model {self.ref}: expected an MLflow model URI, models:/NAME/VERSION")


@dataclass(frozen=True)
class ServeConfig:
    """One served model and how it is deployed."""

    source: ModelSource
    replicas: int = 1
    autoscale: tuple[int, int] | None = None        # (min, max) replicas
    max_batch: int = 16                              # requests per model call
    batch_wait_ms: float = 5.0                       # how long a batch waits to fill
    cpus_per_replica: float = 0.5                    # Ray CPUs each replica holds (fractional on small nodes)
    threads: int = 1                                 # torch threads per replica
    host: str = "127.0.0.1"
    port: int = 8000
    address: str | None = None                       # an existing Ray cluster
    app_name: str = "iaa"
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.max_batch < 1 or self.batch_wait_ms < 0 or self.cpus_per_replica <= 0:
            raise IaaError("serve needs replicas >= 1, max batch >= 1, batch wait >= 0 ms and CPUs per replica > 0")
        if self.autoscale is not None and not 0 <= self.autoscale[0] <= self.autoscale[1] >= 1:
            raise IaaError(f"--autoscale {self.autoscale[0]}:{self.autoscale[1]}: need 0 <= MIN <= MAX and MAX >= 1")


@dataclass(frozen=True)
class LoadedModel:
    """A model's files on this machine, and its name and version (both strings)."""

    checkpoints: tuple[Path, ...]
    data_dir: Path | None                # None: the vocabulary the checkpoints carry
    name: str
    version: str


ModelFetcher = Callable[[str, "str | None"], LoadedModel]    # (MLflow URI, tracking URI) -> files
