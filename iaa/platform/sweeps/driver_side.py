"""The stores and the console that a sweep's Tune objects use, bound by the process that runs it.

Ray Tune pickles a run's searcher and callbacks into the run's folder and brings them back on
``--resume``, wherever the run is resumed from: a copy of the work folder resumes objects that
were built for the original. So those objects keep no store, path or console of their own. Each
names its Tune run, and finds what it uses in the :class:`DriverSide` that the running process
bound to that name (:func:`bound`): the MLflow store, the Optuna study and the console of the
work folder it runs in now.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from iaa.errors import IaaError
from iaa.jobs.ports import SweepEvents, Tracker
from iaa.platform.sweeps.trials.trial import TrialSpec


@dataclass
class TimeBudget:
    """A sweep's time budget in this process: the total its trials may run over every process
    (``total_s``; None: no limit), whether the sweep's clock found it spent (``ended``:
    :class:`~iaa.platform.sweeps.budget.SweepClock`), and then the trials that Tune stopped without
    telling anyone (``untold``: Tune trial id -> its last result). Of those, the ``cut`` ones were
    stopped where they stood; the others had just reported their own end (their last result
    names its ``stop_reason``)."""

    total_s: float | None = None
    ended: bool = False
    untold: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def cut(self) -> set[str]:
        return {t for t, last in self.untold.items() if not last.get("stop_reason")}


@dataclass(frozen=True)
class DriverSide:
    """What one Tune run's searcher and callbacks use in this process."""

    tracker: Tracker                        # the MLflow store of the trials' child runs
    experiment: str
    parent_run_id: str | None
    dataset: str
    spec: TrialSpec                         # what the trials share: storage, data folder, base config
    data_dir: Path | None = None            # the prepared data each child run logs as its dataset
    member_names: tuple[str, ...] = ()      # an ensemble's member names (``ENSEMBLE-seed-7``), by member
    sweep: str = ""                         # the sweep's name, as the trials' runs are tagged; "": the Tune run's
    console: SweepEvents | None = None
    study_storage: str | None = None        # the Optuna storage URL (None: the study lives in memory)
    study_name: str | None = None
    num_samples: int | None = None          # the sweep's trials in all (a resume may ask for more than it began
                                            # with); None: what Tune saved
    run_ids: dict[str, str] = field(default_factory=dict)   # Tune trial id -> MLflow run id, filled as runs open
    numbers: dict[str, int] = field(default_factory=dict)   # Tune trial id -> its number in the study, as asked
    names: dict[str, str] = field(default_factory=dict)     # Tune trial id -> its one name (``trial-0003``, ``seed-7``)
    given: set[str] = field(default_factory=set)            # Tune trial ids of configurations given to try first
    again: dict[str, str] = field(default_factory=dict)     # Tune trial id -> the Tune id of the trial it runs
                                                            # again (one a stop cut off before Tune saved it)
    finished_before: set[str] = field(default_factory=set)  # Tune trial ids whose runs had ended FINISHED when
                                                            # this process met them (a resumed sweep's)
    full: list[IaaError] = field(default_factory=list)      # the first full disk met (a DiskFullError): the run stops
    budget: TimeBudget = field(default_factory=TimeBudget)
    # Tune's live trials -> what the process keeps of them while they run (a sweep's record), told
    # by StandingCallback (iaa.platform.sweeps.trials.standing); None: nothing is kept
    standing: Callable[[Sequence[Any]], None] | None = None

    def note_full(self, err: IaaError) -> None:
        """A write of the run met a full disk: the first one is what the command reports, and the
        Tune loop ends at its next step (:class:`~iaa.platform.sweeps.trials.trial_runs.TrialRuns`)."""
        if not self.full:
            self.full.append(err)


_BOUND: dict[str, DriverSide] = {}


@contextmanager
def bound(name: str, side: DriverSide) -> Iterator[DriverSide]:
    """``side`` is what the objects of the Tune run ``name`` use, until the block ends."""
    _BOUND[name] = side
    try:
        yield side
    finally:
        _BOUND.pop(name, None)


def of(name: str) -> DriverSide:
    """What this process bound to the Tune run ``name``."""
    try:
        return _BOUND[name]
    except KeyError:
        raise IaaError(f"nothing runs the Tune run {name!r} in this process: its searcher and callbacks "
                       "have no stores to use") from None


def is_bound(name: str) -> bool:
    return name in _BOUND
