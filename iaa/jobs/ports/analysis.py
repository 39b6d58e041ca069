"""The port of ``iaa-cli report --sweep``: what an adapter reads back from a sweep's Optuna study.

A :class:`StudyAnalyzer` draws the study's figures into a folder and returns a
:class:`StudyAnalysis`: the figures' paths, the parameter importances, each trial
(:class:`StudyTrial`), the best trial (:class:`BestTrial`) and the best valid_acc found over the
sweep's time (:class:`HistoryPoint`). The adapter is :func:`iaa.platform.sweeps.studies.study.analyze`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

SCORED_STATES = ("COMPLETE", "PRUNED")    # finished, or stopped by ASHA with the checks it made


@dataclass(frozen=True)
class StudyTrial:
    """One trial of the study, as Optuna holds it.

    Attributes:
        number: its number in the study.
        name: its one name (``trial-0003``), as the console, its MLflow run and ``sweep.json``
            call it (a trial a resume continues keeps the name of the one it continues).
        state: Optuna's name of its state (``COMPLETE``, ``PRUNED``, ``FAIL``, ``RUNNING`` ...).
        params: its searched values, by parameter.
        value: its objective, the best check of a COMPLETE trial; None where it has none.
        intermediate_values: its ``valid_acc`` by validation check (1 first).
        stopped_by_asha: ASHA stopped it (PRUNED, and not by the time budget).
        stopped_by_time_budget: the sweep's time budget stopped it where it stood.
        carried_from: the earlier sweep a warm start carried it from (None: the sweep's own).
        tried_first: which of the configurations given to try first it ran (None: none).
    """

    number: int
    name: str
    state: str
    params: Mapping[str, Any]
    value: float | None
    intermediate_values: Mapping[int, float]
    stopped_by_asha: bool = False
    stopped_by_time_budget: bool = False
    carried_from: str | None = None
    tried_first: int | None = None

    @property
    def scored(self) -> bool:
        """It finished, or ASHA stopped it with the checks it made."""
        return self.state in SCORED_STATES

    def fields(self) -> dict[str, Any]:
        """The trial as the report's JSON lists it: ``carried_from`` and ``tried_first`` only
        where it has them."""
        found = dataclasses.asdict(self)
        for key in ("carried_from", "tried_first"):
            if found[key] is None:
                del found[key]
        return found


@dataclass(frozen=True)
class HistoryPoint:
    """One of the sweep's own trials as it ended, in the best valid_acc found over time.

    Attributes:
        number: the trial's number in the study.
        name: its one name.
        hours: when it ended, in hours after the sweep's first trial started (wall clock).
        value: its best check.
        best: the best value of all the trials ended by then.
        cut: the sweep's time budget stopped it.
        running_hours: when it ended, in hours that the sweep had run by then: the wall clock less
            the time it stood stopped between its runs. None where the sweep's record holds no
            runs (written before they were recorded), or where the sweep's first trial started or
            this one ended outside them (a run begun by an earlier version, one still going, or
            one killed before it could record itself).
    """

    number: int
    name: str
    hours: float
    value: float
    best: float
    cut: bool = False
    running_hours: float | None = None


@dataclass(frozen=True)
class BestTrial:
    """The best scored trial of the study: its searched values and its value (its best check)."""

    params: Mapping[str, Any]
    value: float


@dataclass(frozen=True, kw_only=True)
class StudyAnalysis:
    """What a sweep's study holds, and the figures drawn of it.

    Attributes:
        study: the study's name.
        storage: the URL of the storage that holds it.
        importances: each parameter's importance (fANOVA over the scored trials), highest first;
            empty where the trials cannot tell the parameters apart.
        importance_evaluator: the evaluator of ``importances``.
        dashboard_importances: the importances optuna-dashboard shows (PED-ANOVA over the
            COMPLETE trials); empty under 2 of them.
        scored_trials: the trials that finished or that ASHA stopped (those carried included).
        complete_trials: the COMPLETE trials.
        best: the best scored trial (None: none was scored).
        history: the best valid_acc over the sweep's time, one point per trial of its own that ended.
        carried_trials: the scored trials a warm start carried from an earlier sweep.
        carried_best: the best of their values (None: none was carried).
        trials: every trial of the study, in its order.
        figures: the PNGs drawn, by figure name.
    """

    study: str
    storage: str
    importances: Mapping[str, float]
    importance_evaluator: str
    dashboard_importances: Mapping[str, float]
    scored_trials: int
    complete_trials: int
    best: BestTrial | None
    history: tuple[HistoryPoint, ...]
    carried_trials: int
    carried_best: float | None
    trials: tuple[StudyTrial, ...]
    figures: Mapping[str, Path]


class StudyAnalyzer(Protocol):
    """Reads a sweep's Optuna study and draws its figures."""

    def __call__(self, storage_url: str, study_name: str, out_dir: Path,
                 spans: Sequence[tuple[float, float]] = (), /) -> StudyAnalysis:
        """Draw the figures of study ``study_name`` of the storage ``storage_url`` into
        ``out_dir`` and return them with the study's numbers; IaaError when the storage holds no
        such study. ``spans``: the sweep's runs, each (its start in Unix seconds, its seconds),
        which the history's time counts instead of the wall clock where they hold every trial's end."""
        ...
