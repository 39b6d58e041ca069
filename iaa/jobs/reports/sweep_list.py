"""``iaa-cli report --sweeps``: the work folder's sweeps, newest first, one row each.

Each row is read from the sweep's record (``sweep.json``; no store is opened): its dataset and
model, where it stands (:func:`state`; a process that runs it holds its lock), its trials against
the number it asked for, its best trial, its time and time budget, and the sweep it began from
(``--warm-start``). A damaged record is a warning naming the file and what is wrong, and the
others are listed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from iaa.errors import IaaError
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.evaluation.result import Result, hidden
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.sweeps.cost import duration
from iaa.jobs.sweeps.record import FINISHED_STATUSES, SweepRecord
from iaa.jobs.workdir import lock

FINISHED, BUDGET_SPENT, RUNNING, INTERRUPTED, LOST, EMPTY = ("finished", "budget spent", "running", "interrupted",
                                                              "lost trials", "no trials recorded")


@dataclass(frozen=True)
class SweepSummary:
    """One sweep, as its record has it."""

    name: str
    dataset: str | None
    model: str | None
    state: str                        # one of FINISHED, BUDGET_SPENT, RUNNING, INTERRUPTED, LOST, EMPTY
    trials: int                       # recorded
    ended: int                        # of those, the ones that ended (finished, stopped or failed)
    num_samples: int | None           # asked for
    best_valid_acc: float | None
    best_trial: str | None
    wall_s: float
    time_budget_s: float | None
    warm_start: str | None            # the sweep its study began from
    folder: Path
    resume: str | None                # the command that continues it (options as `name`); None: finished, or running
    pid: str | None = None            # the process that runs it now


@dataclass(frozen=True, kw_only=True)
class SweepListResult(Result):
    """``iaa-cli report --sweeps``: every sweep of ``workdir`` that could be read, newest first;
    ``unlisted``: the records that could not (each named by a warning)."""

    workdir: Path
    sweeps: tuple[SweepSummary, ...]
    unlisted: int = hidden(0)


def state(sweep: SweepRecord, running: bool = False) -> str:
    """Where ``sweep`` stands: running (a process holds its lock), finished, its time budget spent,
    trials lost with no restores left (a resume runs them again), interrupted (a resume continues
    it), or no trials recorded (a sweep records them as they run: its process was killed, or
    died, before Tune first saved them)."""
    if running:
        return RUNNING
    if sweep.budget_spent:
        return BUDGET_SPENT
    if sweep.finished:
        return FINISHED
    if not sweep.trials:
        return EMPTY
    if any(t.lost for t in sweep.trials) and all(t.status in FINISHED_STATUSES for t in sweep.trials):
        return LOST
    return INTERRUPTED


def summary(sweep: SweepRecord, folder: Path, options: dict[str, str], pid: str | None = None) -> SweepSummary:
    """``sweep`` (its record in ``folder``) in one row; ``pid``: the process that runs it now."""
    scored = [t for t in sweep.trials if t.scored]
    best = max(scored, key=lambda t: t.best_valid_acc or 0.0, default=None)
    now = state(sweep, running=pid is not None)
    return SweepSummary(name=sweep.name, dataset=sweep.dataset, model=(sweep.base or {}).get("model", {}).get("kind"),
                        state=now, trials=len(sweep.trials), num_samples=sweep.num_samples,
                        ended=sum(t.status in FINISHED_STATUSES for t in sweep.trials),
                        best_valid_acc=best.best_valid_acc if best else None, best_trial=best.label if best else None,
                        wall_s=sweep.wall_s, time_budget_s=sweep.time_budget_s,
                        warm_start=sweep.warm_start.sweep if sweep.warm_start else None, folder=folder.resolve(),
                        resume=str(Command.of("tune", resume=sweep.name, **options,
                                              **({"address": sweep.address} if sweep.address else {})))
                        if now in (INTERRUPTED, LOST, EMPTY) else None, pid=pid)


def run(workdir: Path) -> SweepListResult:
    """The sweeps of ``workdir``, newest record first; each damaged record a warning."""
    rows, damaged = [], []
    for path in sweep_file.newest(workdir):
        try:
            pid = lock.holder(lock.beside(path.parent))
            rows.append(summary(sweep_file.read(path), path.parent, where(workdir), pid))
        except (IaaError, OSError) as err:            # a record's error names its file; say it once
            damaged.append(f"not listed: {err}" if str(path) in str(err) else f"{path}: not listed: {err}")
    return SweepListResult(workdir=Path(workdir).resolve(), sweeps=tuple(rows), warnings=tuple(damaged), unlisted=len(damaged))


def describe(result: SweepListResult) -> str:
    """The sweeps as a table, then the command that continues each interrupted one, and how many
    records were not listed (each a warning, shown above the table)."""
    if not result.sweeps:
        if result.unlisted:
            return f"no readable sweeps in {result.workdir}: {result.unlisted} not listed (above)"
        return f"no sweeps in {result.workdir}: iaa-cli tune starts one"
    head = ["sweep", "dataset", "model", "state", "trials ended", "best", "best trial", "time", "from"]
    rows = [head] + [[s.name, s.dataset or "?", s.model or "?", f"{s.state} (pid {s.pid})" if s.pid else s.state,
                      f"{s.ended}/{s.num_samples}" if s.num_samples else str(s.ended),
                      f"{s.best_valid_acc:.4f}" if s.best_valid_acc is not None else "-", s.best_trial or "-",
                      duration(s.wall_s) + (f" (budget {duration(s.time_budget_s)})" if s.time_budget_s else ""),
                      s.warm_start or "-"] for s in result.sweeps]
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines += [f"continue {s.name}: {s.resume}" for s in result.sweeps if s.resume]
    lines += [f"{result.unlisted} more sweep(s) not listed (above)"] if result.unlisted else []
    return "\n".join(lines)
