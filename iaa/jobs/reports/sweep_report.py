"""``iaa-cli report --sweep NAME``: what a sweep learnt, from its Optuna study.

Four figures (parameter importances, parallel coordinates, each trial's checks with ASHA's
stops marked, and the best valid_acc found over the sweep's time) go to ``--out`` (default
``WORKDIR/sweeps/NAME/report``) and to the sweep's parent run under ``report/``; the numbers
behind them are the returned :class:`SweepReportResult` (``--json``). The study is read by a
:class:`~iaa.jobs.ports.StudyAnalyzer` (the adapter: :func:`iaa.platform.sweeps.studies.study.analyze`),
which returns a :class:`~iaa.jobs.ports.StudyAnalysis`.

Importances and parallel coordinates compare trials: a study of fewer than two scored trials has
none, and the report says so in a warning and draws the rest. The study may hold more trials
than the sweep (its record's): a sweep that was stopped ends its unfinished trials FAIL in the
study, and its resume continues each of them as a new trial; the first line counts both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from iaa.errors import IaaError
from iaa.jobs.config import exploration
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.evaluation.result import Result, absent_when_none, hidden, plain
from iaa.jobs.sweeps import comparison
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.cost import duration
from iaa.jobs.sweeps.ranking import Ranking
from iaa.jobs.sweeps.record import SweepRecord
from iaa.jobs.ports import BestTrial, HistoryPoint, StudyAnalysis, StudyAnalyzer, StudyTrial, Tracker
from iaa.jobs.workdir import names


@dataclass(frozen=True, kw_only=True)
class SweepReportResult(Result):
    """``iaa-cli report --sweep``: the sweep's study, its trials and parameter importances, the
    figures drawn and the parent run they were logged to (None: none was). The study's fields
    are its :class:`~iaa.jobs.ports.StudyAnalysis`'s; a trial in the JSON object is
    :meth:`StudyTrial.fields <iaa.jobs.ports.StudyTrial.fields>`."""

    sweep: str
    sampler: str | None
    study: str
    trials: tuple[StudyTrial, ...]
    importances: dict[str, float]                                  # fANOVA's, by parameter
    figures: dict[str, Path]                                       # name -> PNG
    dashboard_importances: dict[str, float]                        # optuna-dashboard's PED-ANOVA
    sweep_trials: int | None = absent_when_none()                  # the sweep's, as its record counts them
    stopped_attempts: int | None = absent_when_none()              # study trials beyond them: :func:`stopped_attempts`
    complete_trials: int
    scored_trials: int
    first_comparison: dict[str, Any] | None = absent_when_none()   # :func:`first_comparison`
    close_trials: tuple[str, ...] | None = absent_when_none()      # within chance of the best (None: unknown)
    close_note: str | None = hidden()                              # the line that names them
    storage: str                                                   # the study's storage URL
    importance_evaluator: str
    best: BestTrial | None
    history: tuple[HistoryPoint, ...]                              # the best valid_acc as the trials ended
    carried_trials: int                                            # scored trials a warm start carried
    carried_best: float | None
    logged_to_run: str | None = None

    def fields(self) -> dict[str, Any]:
        """:meth:`Result.fields`, each trial as
        :meth:`StudyTrial.fields <iaa.jobs.ports.StudyTrial.fields>` lists it."""
        found = super().fields()
        found["trials"] = [plain(t.fields()) for t in self.trials]
        return found


def from_analysis(analysis: StudyAnalysis, *, sweep: str, sampler: str | None = None,
                  grace_period: int | None = None, logged_to_run: str | None = None,
                  warnings: tuple[str, ...] = (), close: tuple[tuple[str, ...], str | None] | None = None,
                  recorded: int | None = None) -> SweepReportResult:
    """The result of the study's ``analysis`` for ``sweep``, whose ASHA first compared trials at check ``grace_period`` (None: unknown),
    ``close``: the trials within chance of its best and the line that says so (None: unknown), and
    ``recorded``: the trials its record holds (None: unknown)."""
    compared = first_comparison(analysis.trials, grace_period) if grace_period else None
    return SweepReportResult(
        sweep=sweep, sampler=sampler, study=analysis.study, trials=analysis.trials,
        importances=dict(analysis.importances), figures={name: str(Path(path).resolve()) for name, path in analysis.figures.items()},
        dashboard_importances=dict(analysis.dashboard_importances), sweep_trials=recorded,
        stopped_attempts=None if recorded is None else stopped_attempts(analysis.trials, recorded),
        complete_trials=analysis.complete_trials, scored_trials=analysis.scored_trials, first_comparison=compared,
        close_trials=None if close is None else close[0], close_note=None if close is None else close[1],
        storage=analysis.storage, importance_evaluator=analysis.importance_evaluator, best=analysis.best,
        history=analysis.history, carried_trials=analysis.carried_trials, carried_best=analysis.carried_best,
        logged_to_run=logged_to_run, warnings=warnings + tuple(comparison.ranked_poorly(compared)))


def stopped_attempts(trials: Sequence[StudyTrial], recorded: int) -> int:
    """How many of the study's own ``trials`` (not those a warm start carried) are not among the
    ``recorded`` trials of the sweep (its record's), and ended FAIL: the attempts that a stop ended
    (or a process that died, marked by the resume) and that the resume continued as new trials. 0
    when the record holds none (a sweep that recorded no trials yet)."""
    own = [t for t in trials if not t.carried_from]
    if not recorded or len(own) <= recorded:
        return 0
    return min(len(own) - recorded, sum(t.state == "FAIL" for t in own))


def unranked_note(scored: int) -> str:
    """Why a study of fewer than :data:`exploration.RANKED_FROM` scored trials has no importances."""
    return (f"{scored} scored trial(s): parameter importances and parallel coordinates compare trials and need "
            f"{exploration.RANKED_FROM} or more; drawn: the checks per trial and the best valid_acc over time")


def first_comparison(trials: Sequence[StudyTrial], grace_period: int) -> dict[str, Any]:
    """:func:`iaa.jobs.sweeps.comparison.first_comparison` of the study's own scored trials (not
    those a warm start carried)."""
    return comparison.first_comparison(
        [comparison.Checked(t.intermediate_values, t.stopped_by_asha)
         for t in trials if t.scored and not t.carried_from], grace_period)


def run(name: str, workdir: Path, analyze: StudyAnalyzer, open_tracker: Callable[[str], Tracker],
        out: Path | None = None) -> SweepReportResult:
    """Draw the figures of sweep ``name``'s study and log them to its parent run; BadNameError
    when ``name`` could leave the work folder's ``sweeps`` folder."""
    names.folder_name(name, "`sweep`")
    path = sweep_file.find(Path(workdir), name)
    sweep = sweep_file.read(path)
    if sweep.optuna is None or not sweep.optuna.storage:
        raise IaaError(f"{path}: the sweep kept no Optuna study (it ran before studies were stored); "
                       "run the sweep again to analyse it")
    folder = Path(out) if out is not None else path.parent / "report"
    analysis = analyze(sweep.optuna.storage, sweep.optuna.study, folder, sweep.spans or ())
    logged = False
    if sweep.parent_run_id and sweep.tracking_uri:
        parent = open_tracker(sweep.tracking_uri).attach(sweep.parent_run_id)
        for figure in analysis.figures.values():
            parent.log_artifact(Path(figure), "report")
        logged = True
    scored = [t.params for t in analysis.trials if t.scored]
    searched = list((sweep.search_space or {}).get("params") or {}) or sorted({k for t in scored for k in t})
    notes = exploration.notes(scored, searched) if len(scored) >= exploration.RANKED_FROM else [unranked_note(len(scored))]
    return from_analysis(analysis, sweep=sweep.name, sampler=sweep_file.sampler(sweep),
                         grace_period=sweep.asha.grace_period if sweep.asha else None,
                         logged_to_run=sweep.parent_run_id if logged else None,
                         warnings=tuple(notes), close=close_trials(sweep, workdir), recorded=len(sweep.trials))


def close_trials(sweep: SweepRecord, workdir: Path) -> tuple[tuple[str, ...], str | None] | None:
    """The trials of ``sweep`` within chance of its best on its validation split, and the line that
    names them with the ensemble that ranks them (None when there are none); None when the
    split's size is not known (its prepared folder is gone)."""
    from iaa.data.prepared.manifest import counted

    try:
        n = counted(Path(sweep.data_dir), "valid") if sweep.data_dir else 0
    except (OSError, ValueError, IaaError):
        n = 0
    scores = {r.label: r.best_valid_acc for r in sweep.trials if r.scored}
    if not n or not scores:
        return None
    ranking = Ranking.of(scores, n)
    best = ranking.ties[0]
    if not ranking.close:
        return (), None
    ensemble = Command.of("ensemble", sweep=sweep.name, top_configs=ranking.top_configs, **where(workdir))
    return ranking.close, ranking.note(scores, best, n, ensemble)


def dashboard_line(result: SweepReportResult) -> list[str]:
    """optuna-dashboard's importances of the same study, and in one line why they differ from fANOVA's
    (none where there are no fANOVA importances: too few trials for either)."""
    if not result.importances:
        return []
    shown = ", ".join(f"{k} {v:.3f}" for k, v in result.dashboard_importances.items()) or "none (under 2 COMPLETE trials)"
    return [f"optuna-dashboard shows PED-ANOVA instead: {shown}; it compares the best 10% of the "
            f"{result.complete_trials} COMPLETE trials with all of them (fANOVA above fits all {result.scored_trials} "
            "scored ones), so a small sweep ties there"]


def history_line(result: SweepReportResult) -> list[str]:
    """When the sweep found its best, against how long it ran (its stops left out, where its
    runs are recorded; else by the wall clock)."""
    if not result.history:
        return []
    running = all(p.running_hours is not None for p in result.history)
    hours = [p.running_hours if running else p.hours for p in result.history]
    best = result.history[-1].best
    found = next(k for k, p in enumerate(result.history) if p.best == best)
    clock = "of the sweep's running time (its stops left out)" if running else "by the wall clock"
    return [f"the best trial ({result.history[found].name}, valid_acc {best:.4f}) ended {duration(hours[found] * 3600)} "
            f"after the first trial started, the last one at {duration(hours[-1] * 3600)}, {clock} (figure: history)"]


def comparison_line(result: SweepReportResult) -> list[str]:
    """What ASHA's first comparison did, and how the trials it let go on ended against its order
    (nothing where fewer than two trials reached it: there was nothing to compare)."""
    c = result.first_comparison
    if not c or c["compared"] < 2:
        return []
    ended = ("" if c["spearman"] is None else
             f"; the {c['went_on']} that went on past it ended in an order that correlates {c['spearman']:.2f} "
             "(Spearman) with the order it put them in")
    return [f"ASHA first compared {c['compared']} trials at check {c['check']} and stopped {c['stopped']} there{ended}"]


def carried_line(result: SweepReportResult) -> list[str]:
    """How many of the study's trials a warm start carried from earlier sweeps, and which figures count them."""
    origins = sorted({t.carried_from for t in result.trials if t.carried_from})
    if not origins:
        return []
    carried = sum(1 for t in result.trials if t.carried_from)
    return [f"{carried} of the {len(result.trials)} trials began the study from sweep {', '.join(origins)} "
            f"(a warm start; best valid_acc {result.carried_best or 0:.4f}): the importances and "
            "parallel coordinates count them, the checks and history figures show this sweep's own trials"]


def given_line(result: SweepReportResult) -> list[str]:
    """Which trials ran the configurations given to try first, and how the best of them did."""
    given = [t for t in result.trials if t.tried_first is not None]
    if not given:
        return []
    scored = [(t.value, t.name) for t in given if t.scored and t.value is not None]
    best = max(scored, key=lambda valued: valued[0], default=None)
    beat = "" if best is None else f" (best valid_acc {best[0]:.4f}, {best[1]})"
    configs = len({t.tried_first for t in given})
    return [f"{configs} configuration(s) given to try first ran in {', '.join(t.name for t in given)} "
            f"of the {len(result.trials)}{beat} (a stopped trial goes on in a new one); ASHA left them to run to "
            "their end"]


def trials_line(result: SweepReportResult) -> str:
    """The sweep's trials and its study's; where the study holds attempts a stop ended, both counts."""
    sampler = f", proposed by the {result.sampler} sampler" if result.sampler else ""
    if not result.stopped_attempts:
        return f"sweep {result.sweep}: {len(result.trials)} trials in study {result.study}{sampler}"
    return (f"sweep {result.sweep}: {result.sweep_trials} trials{sampler}; its study {result.study} holds "
            f"{len(result.trials)}, {result.stopped_attempts} of them attempt(s) that ended FAIL when the sweep was "
            "stopped, which its resume continued as new trials")


def describe(result: SweepReportResult) -> str:
    """The importances and the figures, for the console."""
    lines = [trials_line(result)]
    if result.importances:
        lines.append("parameter importance (fANOVA over finished and ASHA-stopped trials):")
        lines += [f"  {name:24s} {value:.3f}" for name, value in result.importances.items()]
    lines += dashboard_line(result)
    lines += carried_line(result)
    lines += given_line(result)
    lines += history_line(result)
    lines += comparison_line(result)
    lines += [result.close_note] if result.close_note else []
    lines += [f"{name}: {path}" for name, path in result.figures.items()]
    if result.logged_to_run:
        lines.append(f"figures logged to the parent run {result.logged_to_run} under report/")
    return "\n".join(lines)

