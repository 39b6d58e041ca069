"""The workflows port: a use case's workflow that another use case runs, handed over by the
composition step. Distillation trains its student with ``iaa-cli train``'s tracked workflow
(:func:`iaa.jobs.train.train.run_tracked`, its store bound) as a :class:`TrainWorkflow`, and
hands it one :class:`TrainRun`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Protocol, TypeVar

from iaa.jobs.config.job_config import JobConfig

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True)
class TrainRun:
    """One tracked training run: what it trains (``cfg`` on ``prepared``, in ``run_dir``), where
    (in this process or on Ray Train workers) and what its tracked run records."""

    cfg: JobConfig
    prepared: Path                            # the prepared data folder
    run_dir: Path
    resume: bool = False                      # go on from run_dir's last checkpoint, in its tracked run
    workers: int = 0                          # Ray Train workers; 0 trains in this process
    gpus_per_worker: float = 0.0              # in this process: > 0 trains on this machine's GPU
    storage: str = ""                         # where the workers' Ray run keeps its checkpoints
    show_progress: bool = True
    register: str | None = None               # also register the logged model under this name
    train_rows: "pa.Table | None" = None      # replaces the prepared training split (in process only)
    teacher: Path | None = None               # the teacher's file, logged as an input of a new run
    tags: Mapping[str, str] = field(default_factory=dict)   # a new run's tags, beside the workflow's own
    experiment: str | None = None             # None: train-DATASET


Result_co = TypeVar("Result_co", covariant=True)


class TrainWorkflow(Protocol[Result_co]):
    """Trains and tracks one run; returns its result. The result's type is the base's
    :class:`~iaa.jobs.training.summary.TrainResult`, which the ports sit below, so the caller
    names it: ``TrainWorkflow[TrainResult]``."""

    def __call__(self, run: TrainRun) -> Result_co: ...
