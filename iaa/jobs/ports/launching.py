"""The launching port: trials, Train workers and maps on a cluster
(:class:`iaa.platform.sweeps.launch.RayLauncher` implements it), and the requests it takes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Mapping, Protocol, Sequence

from iaa.errors import IaaError
from iaa.jobs.config.job_config import JobConfig
from iaa.jobs.config.presets import DEFAULT_SAMPLER, TunePreset
from iaa.jobs.config.search_space import SearchSpace
from iaa.jobs.ports.records import Metrics, MetricsCallback, TrialRecord
from iaa.jobs.workdir.paths import RunFolder

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from iaa.jobs.ports.tracking import Tracker


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


@dataclass(frozen=True)
class WorkerData:
    """What the loop on one worker trains on: a one-worker trial gets its ``train`` and ``valid``
    tables and ``vocab`` card; a Train worker reads its rank's rows of the ``prepared`` folder."""

    vocab_hash: str                                  # the prepared data's, checked against checkpoints
    prepared: str = ""
    train: "pa.Table | None" = None
    valid: "pa.Table | None" = None
    vocab: Mapping[str, object] | None = None
    show_progress: bool = False                      # rank 0's progress bar on stderr (a Train run, not a trial)


class WorkerFit(Protocol):
    """The job's loop on one worker (:func:`iaa.jobs.training.loop.fit_on_worker`) on ``data``, with
    ``threads`` torch threads. It travels to Ray workers pickled by reference, so it is a
    module-level function."""

    def __call__(self, cfg: JobConfig, link: WorkerLink, data: WorkerData, *, threads: int) -> Metrics: ...


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
    fits_now: int | None = None   # trials today's nodes run at once (a growing cluster admits more); None: all

    @property
    def experiment_path(self) -> str:
        return f"{self.storage.rstrip('/')}/{self.name}"


@dataclass(frozen=True)
class TrialTracking:
    """Where every trial's child run goes: the tracker, the experiment and the parent run."""

    tracker: Tracker
    experiment: str
    parent_run_id: str | None
    sweep: str                           # the sweep's name, as its runs are tagged (``sweep``)
    dataset: str
    data_dir: Path | None = None
    member_names: tuple[str, ...] = ()   # train_many: the run name of member i (``ENSEMBLE-seed-7``)


@dataclass(frozen=True)
class WarmStart:
    """An earlier sweep whose scored trials a new sweep's study begins with (``tune --warm-start``).

    A trial carries where it lies in the new search space: ``filled`` holds the earlier sweep's
    value of each parameter the new sweep searches and the earlier one did not (its trials ran
    with it), ``fixed`` the new sweep's value of each parameter the earlier one searched and the
    new one does not (a trial carries only where its value equals it)."""

    sweep: str
    study_storage: str
    study_name: str
    filled: Mapping[str, Any]
    fixed: Mapping[str, Any]


@dataclass(frozen=True)
class Carried:
    """What a warm start carried into a new sweep's study: how many trials of sweep ``sweep``,
    the best value among them, and the others by why they were left out. ``ran`` holds each
    carried trial's configuration (in the new sweep's space) with its value, for the sweep's
    start alone: its record (``to_json``) keeps the counts."""

    sweep: str
    trials: int
    best: float | None = None
    left_out: Mapping[str, int] = field(default_factory=dict)     # reason -> trials
    ran: tuple[tuple[Mapping[str, Any], float], ...] = field(default=(), compare=False, repr=False)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Carried:
        return cls(sweep=str(data["sweep"]), trials=int(data["trials"]),
                   best=None if data.get("best") is None else float(data["best"]),
                   left_out={str(k): int(v) for k, v in (data.get("left_out") or {}).items()})

    def to_json(self) -> dict[str, Any]:
        return {"sweep": self.sweep, "trials": self.trials, "best": self.best, "left_out": dict(self.left_out)}


@dataclass(frozen=True)
class SearchPlan:
    """What a sweep searches and how it stops trials (the adapter builds the searcher and scheduler)."""

    base: JobConfig
    space: SearchSpace
    preset: TunePreset       # with the request's ASHA settings
    seed: int
    num_samples: int
    max_t: int               # ASHA's max_t: one more than the checks a trial makes (see `checks`)
    study_storage: str | None = None  # where the searcher keeps its study (an Optuna RDB URL); None: in memory
    study_name: str | None = None
    sampler: str = DEFAULT_SAMPLER   # the Optuna sampler that proposes the trials (presets.SAMPLERS)
    time_budget_s: float | None = None   # the trials' time in all, over every run of the sweep; None: no limit
    warm_start: WarmStart | None = None  # an earlier sweep whose trials the study begins with
    try_first: tuple[Mapping[str, Any], ...] = ()   # configurations the first trials run, in order

    @property
    def checks(self) -> int:
        """The most validation checks a trial makes: ``max_t`` is one more, so that ASHA never
        stops a trial that ends by itself."""
        return self.max_t - 1


class SweepEvents(Protocol):
    """What a sweep's console hears of its trials (:class:`iaa.jobs.sweeps.console.SweepConsole`)."""

    def trial_started(self, trial_id: str, config: Mapping[str, object]) -> None: ...
    def trial_continued(self, trial_id: str, config: Mapping[str, object], from_check: int) -> None: ...  # resumed
    def trial_checked(self, trial_id: str, result: Mapping[str, object]) -> None: ...
    def trial_ended(self, trial_id: str, reason: str, error: str | None = None) -> None: ...
    def tick(self) -> None: ...
    def placed(self, concurrency: int) -> None: ...                       # how many trials run at once
    def node_lost(self, node: str, detail: str = "") -> None: ...           # a node of the cluster died
    def trial_restored(self, trial_id: str, from_check: int) -> None: ...   # restarts from that check's checkpoint


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
class TrialRun:
    """How every trial of a group runs and is heard, a sweep's or an ensemble's members': the job's
    loop, where each trial's child run goes, where its checkpoint is fetched, and the console."""

    fit: WorkerFit
    tracking: TrialTracking
    downloads: Path                    # where checkpoints kept in a bucket are copied
    console: SweepEvents | None = None   # hears every trial's events
    verbose: bool = False              # the cluster's own progress tables too


@dataclass(frozen=True)
class SweepRequest:
    """A search, placed by :meth:`Launcher.connect`, its trials run and tracked as ``trials`` says."""

    placement: Placement
    plan: SearchPlan
    trials: TrialRun
    resume: bool = False               # continue the saved run of ``placement``
    show_progress: bool = True
    # hears the trials as they stand while the sweep runs, soon after a trial starts or ends and at
    # least every half minute (what a sweep's record keeps, should its process be killed); a
    # trial's checkpoint kept in a bucket is not fetched for it (None)
    standing: Callable[[Sequence[TrialRecord]], None] | None = None


@dataclass(frozen=True)
class MembersRequest:
    """Configs to train as parallel trials, without search or early stopping (an ensemble's members),
    placed as ``connection`` asks (its ``num_trials``: one per config)."""

    configs: tuple[JobConfig, ...]
    connection: ConnectRequest
    trials: TrialRun


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


class RestoresSpent(IaaError):
    """A run lost its workers (their processes or nodes died) more often than it may be restored
    from its last checkpoint; that checkpoint is kept, so resuming the run continues from it."""


class Launcher(Protocol):
    """Runs trials, Train workers and maps on a cluster."""

    def check_free(self, storage: str, name: str, folder: Path | None = None) -> None: ...
    def claim(self, storage: str, name: str, folder: Path) -> None: ...
    def connect(self, request: ConnectRequest) -> Placement: ...
    def can_resume(self, placement: Placement) -> bool: ...
    def sweep(self, request: SweepRequest) -> list[TrialRecord]: ...
    def saved_trials(self, request: SweepRequest) -> list[TrialRecord]: ...   # as the run last saved them (a stop)
    def fail_unfinished_trials(self, plan: SearchPlan, attrs: Mapping[str, str]) -> int: ...  # the study's: FAIL
    def has_study(self, storage: str, name: str) -> bool: ...   # the study is in the storage (none is made)
    def carry_trials(self, plan: SearchPlan) -> Carried: ...     # plan.warm_start's trials, into a new study
    def train_many(self, request: MembersRequest) -> list[TrialRecord]: ...   # one record per config, in order
    def train_workers(self, request: WorkersRequest) -> Metrics: ...
