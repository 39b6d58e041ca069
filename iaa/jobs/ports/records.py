"""The records the ports carry: plain, frozen, checked when made, and what ``sweep.json`` and a
served model's settings store as JSON (:meth:`TrialRecord.to_json`, :class:`ServeConfig`).

They depend only on the configs and the work folder's paths, never on a port.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Mapping

from iaa.errors import IaaError
from iaa.jobs.config.job_config import JobConfig, from_dict, to_dict
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR

Metrics = dict[str, object]
MetricsCallback = Callable[[Metrics], None]
FAILED_STATUSES = frozenset({"ERROR", "FAILED"})
WORKER_LOST = "worker-lost"    # the stop reason of a trial that lost its worker with no restores left
TIME_BUDGET = "time-budget"    # the stop reason of a trial that the sweep's time budget ended


# --- runs ----------------------------------------------------------------------------------------


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


# --- trials ---------------------------------------------------------------------------------------


def trial_name(number: int) -> str:
    """A sweep trial's one name, from its number in the Optuna study: ``trial-0003``, as the
    console, Optuna (user attribute ``trial_name``), its MLflow run and its model call it."""
    return f"trial-{number:04d}"


def trial_said(name: str) -> str:
    """How a line names a trial: its one name reads alone (``trial-0003``); any other id (a member's
    ``seed-7``, Ray's ``1f2e3_00003``) is said as ``trial seed-7``."""
    return name if name.startswith("trial-") else f"trial {name}"


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
    stop_reason: str = ""                  # the loop's (patience, max_epochs ...), "asha", WORKER_LOST or TIME_BUDGET
    error: str | None = None
    name: str = ""                         # its one name (``trial-0003``, ``seed-7``); "" in older records
    seconds: float | None = None           # its time in its trainable, restores included (Tune's time_total_s)

    @property
    def label(self) -> str:
        """What a person calls the trial: its one name, else Tune's id."""
        return self.name or self.trial_id

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES

    @property
    def lost(self) -> bool:
        """Failed because its worker was lost (its process or node died) with no restores left:
        continuing the sweep runs it again from its last checkpoint."""
        return self.failed and self.stop_reason == WORKER_LOST

    @property
    def cut(self) -> bool:
        """Stopped where it stood when the sweep's time budget was spent (its checks count)."""
        return self.stop_reason == TIME_BUDGET

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


MEMBER_KEY = "member"      # train_many: each trial's Tune config is {"member": index into its configs}
INTERRUPTED_TAG = "interrupted"   # a run a signal stopped: the signal's name (removed when a resume runs it again)
TUNE_RUN_TAG = "tune_run"  # a trial's run: the Tune run that trained it (an ensemble's members: ensemble-NAME-<id>)


# --- serving --------------------------------------------------------------------------------------

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
            raise IaaError(f"`model_kind` {self.ref}: expected an MLflow model URI, models:/NAME/VERSION")


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
            raise IaaError(f"`autoscale` {self.autoscale[0]}:{self.autoscale[1]}: need 0 <= MIN <= MAX and MAX >= 1")


@dataclass(frozen=True)
class ServeApi:
    """The served API as JSON schema, for one model (its placeholder word is in the texts and the
    examples): a request body's schema and named example bodies the model answers, a 200
    answer's schema, and the definitions their ``$ref`` s point at (OpenAPI's ``components/schemas``)."""

    request: Mapping[str, object]
    examples: Mapping[str, object]       # name -> a request body (an object or a list of them)
    answer: Mapping[str, object]
    definitions: Mapping[str, object]


@dataclass(frozen=True)
class ModelFiles:
    """What a logged model is made of: its checkpoints (one reader, or an ensemble's members),
    the prepared folder whose vocabulary they read, and the temperature an ensemble's averaged
    distributions are scaled by (None: a single reader, which answers at its checkpoint's own)."""

    checkpoints: tuple[Path, ...]
    prepared: Path
    temperature: float | None = None

    @classmethod
    def of(cls, checkpoint: str | Path, prepared: Path) -> ModelFiles:
        """One reader's model."""
        return cls((Path(checkpoint),), Path(prepared))


@dataclass(frozen=True)
class ModelCard:
    """What a registered model version says of itself: a Markdown ``description`` (what it is, how
    good, the run it came from) and ``tags`` (plain strings: its dataset, valid accuracy, kind)."""

    description: str
    tags: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        odd = {k: v for k, v in self.tags.items() if not isinstance(k, str) or not isinstance(v, str)}
        if odd:
            raise IaaError(f"a model card's tags are strings, got {odd!r}")


@dataclass(frozen=True)
class LoadedModel:
    """A model's files on this machine, and its name and version (both strings)."""

    checkpoints: tuple[Path, ...]
    data_dir: Path | None                # None: the vocabulary the checkpoints carry
    name: str
    version: str
    temperature: float | None = None     # what an ensemble's averaged distributions are scaled by; None: the checkpoint's own
