"""A sweep stopped and continued: what a stop marks, what it keeps, and what a resume finds.

- **stopped** (SIGINT, SIGTERM: :mod:`iaa.jobs.interrupt`): every run of the sweep still RUNNING
  (the parent and the trials' child runs) ends KILLED, tagged ``interrupted``; every unfinished
  trial of the Optuna study ends FAIL with the user attribute ``interrupted``;
- **left RUNNING by a process that was killed** (``kill -9``): ``--resume`` marks them the same
  way before it continues, tagged ``killed``;
- **resumed**: what is kept and what is left, or that nothing is left (what a resume reads of
  its record is settled once, in :mod:`iaa.jobs.tune.settle`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Collection, Mapping

from iaa.files import DiskFullError, UnwritableError
from iaa.jobs.config.presets import STOP_METRIC
from iaa.jobs.evaluation.closing import Command
from iaa.jobs.ports import INTERRUPTED_TAG, Launcher, RunRecord, SearchPlan, Tracker
from iaa.jobs.sweeps.cost import duration
from iaa.jobs.sweeps.record import SweepRecord

KILLED_BEFORE = "left RUNNING by a process that ended without closing it; marked when the sweep was resumed"


def end_running(tracker: Tracker, launcher: Launcher, experiment: str, sweep: str, plan: SearchPlan | None,
                tag: Mapping[str, str]) -> int:
    """FAIL the study's unfinished trials (user attributes ``tag``), then end KILLED every RUNNING
    run of ``sweep`` (tagged ``tag``); returns the runs ended. In that order: a process cut off
    between the two (Ray's core worker ends the command at once when a signal to the whole group
    has ended Ray's raylet) leaves runs RUNNING, which the next command closes, failing the trials
    of their sweep with them; trials left RUNNING beside closed runs no command would find."""
    if plan is not None:
        launcher.fail_unfinished_trials(plan, tag)
    ended = 0
    for found in tracker.find_runs(experiment, {"sweep": sweep}, status="RUNNING"):
        run = tracker.attach(found.run_id)
        run.set_tags(tag)
        run.end("KILLED")
        ended += 1
    return ended


def on_stop(tracker: Tracker, launcher: Launcher, experiment: str, sweep: str,
            plan: SearchPlan) -> Callable[[str], None]:
    """The mark a stopped sweep makes, given the signal's name."""
    return lambda signal_name: end_running(tracker, launcher, experiment, sweep, plan,
                                           {INTERRUPTED_TAG: signal_name})


def stopped_by_full_disk(tracker: Tracker, launcher: Launcher, experiment: str, sweep: str, plan: SearchPlan,
                         err: DiskFullError, resume: Command) -> DiskFullError:
    """The one error of a sweep that a full disk stopped (its trials' actors are stopped already).

    Its unfinished Optuna trials end FAIL, then its runs still RUNNING end KILLED, each marked
    ``disk_full``, as far as the disk lets. Where the study cannot take it, the runs are left
    RUNNING too: the next command that opens the work folder, its process gone, marks both
    (KILLED and FAIL, ``killed``); the error says which."""
    tag = {"disk_full": str(err)[:500]}
    marked = True
    try:
        launcher.fail_unfinished_trials(plan, tag)
        for found in tracker.find_runs(experiment, {"sweep": sweep}, status="RUNNING"):
            run = tracker.attach(found.run_id)
            run.set_tags(tag)
            run.end("KILLED")
            if run.lost:                      # the store is full too: the rest would fail the same way
                marked = False
                break
    except UnwritableError:
        marked = False
    except tracker.transient_errors:
        marked = False
    done = ("its runs are KILLED and its unfinished Optuna trials FAIL" if marked else
            "what the full disk kept from being marked, the next command in this work folder marks KILLED and FAIL")
    return DiskFullError(f"{err}; sweep {sweep} stopped: {done}; free some space, then resume with: {resume}")


def close_leftovers(tracker: Tracker, launcher: Launcher, record: SweepRecord, plan: SearchPlan) -> int:
    """Before a resume: the runs and trials a killed process left RUNNING end KILLED and FAIL."""
    return end_running(tracker, launcher, record.experiment or "", record.name, plan, {"killed": KILLED_BEFORE})


@dataclass(frozen=True)
class Standing:
    """The trials of a sweep by their child runs: ``finished`` (their runs ended FINISHED or FAILED,
    but for those run again), ``unfinished``, and of these the ``checkpointed`` ones, which continue
    from their last checkpoint; the others made no check and start again from the beginning."""

    finished: int
    unfinished: int
    checkpointed: int


def standing(tracker: Tracker, experiment: str, sweep: str, parent_run_id: str | None,
             again: Collection[str] = ()) -> Standing:
    """The :class:`Standing` of ``sweep``'s trials by their child runs' status; the trials ``again``
    (by Tune trial id: those that lost their worker with no restores left) run again, unfinished.

    An unfinished trial counts as checkpointed once its run logged a check (its ``valid_acc``):
    every check a trial reports carries its checkpoint, and the driver logs the check only once
    the report, checkpoint and all, has reached it. A trial stopped before its first check has
    nothing to continue from."""
    latest = _latest_runs(tracker, experiment, sweep, parent_run_id)
    unfinished = _unfinished(latest, again)
    checkpointed = sum(1 for run in unfinished if tracker.metric_history(run.run_id, STOP_METRIC))
    return Standing(len(latest) - len(unfinished), len(unfinished), checkpointed)


def _latest_runs(tracker: Tracker, experiment: str, sweep: str, parent_run_id: str | None) -> dict[str, RunRecord]:
    """The newest child run of each trial of ``sweep``, by Tune trial id."""
    runs = [r for r in tracker.find_runs(experiment, {"sweep": sweep})
            if r.parent_run_id == parent_run_id and r.tags.get("trial_id")]
    latest: dict[str, RunRecord] = {}
    for run in reversed(runs):                              # oldest first: a trial's newest run wins
        latest[run.tags["trial_id"]] = run
    return latest


def _unfinished(latest: Mapping[str, RunRecord], again: Collection[str]) -> list[RunRecord]:
    return [run for trial_id, run in latest.items() if run.status not in ("FINISHED", "FAILED") or trial_id in again]


def kept(tracker: Tracker, experiment: str, sweep: str, parent_run_id: str | None, folder: Path,
         num_samples: int) -> str:
    """What a stopped sweep of ``num_samples`` trials keeps, in words: the unfinished trials that
    made no check have no checkpoint, and a resume starts them again, as it starts those that had
    not started."""
    tally = standing(tracker, experiment, sweep, parent_run_id)
    fresh = tally.unfinished - tally.checkpointed
    unchecked = (f"; {fresh} unfinished one(s) had made no check, so no checkpoint: a resume starts "
                 f"{'it' if fresh == 1 else 'them'} again from the beginning" if fresh else "")
    waiting = num_samples - tally.finished - tally.unfinished
    unstarted = f"; {waiting} of its {num_samples} trials had not started: a resume starts them" if waiting > 0 else ""
    return (f"sweep {sweep} kept {tally.finished} finished trial(s) and the last checkpoints of {tally.checkpointed} "
            f"unfinished one(s){unchecked}{unstarted} ({folder}; runs KILLED, unfinished Optuna trials FAIL)")


def resumed_line(tracker: Tracker, record: SweepRecord, num_samples: int, time_budget_s: float | None = None) -> str:
    """What a resumed sweep keeps and what is left: of what is left, the trials that continue from
    a checkpoint, and those that start from the beginning (new ones, and unfinished ones that made
    no check)."""
    tally = standing(tracker, record.experiment or "", record.name, record.parent_run_id, lost_trials(record))
    left = max(num_samples - tally.finished, 0)
    continuing = min(tally.checkpointed, left)
    budget = (f"; its time budget of {duration(time_budget_s)} counts the time its trials ran before"
              if time_budget_s is not None else "")
    fresh = f" and {left - continuing} start from the beginning" if left > continuing else ""
    return (f"resuming sweep {record.name}: {tally.finished} of {num_samples} trials finished and kept; {left} left, "
            f"of which {continuing} continue from their last checkpoint{fresh}{budget}")


def lost_trials(record: SweepRecord) -> set[str]:
    """The Tune ids of the trials of ``record`` that lost their worker with no restores left."""
    return {t.trial_id for t in record.trials if t.lost}


def nothing_left_line(record: SweepRecord, folder: Path, search_on: Command) -> str:
    """A resumed sweep that has nothing left to run, in one line, naming ``search_on``: the command
    that begins a new sweep with its trials (a finished sweep takes no more trials, nor time)."""
    if record.budget_spent:
        why = (f"its time budget of {duration(record.time_budget_s or 0)} was spent after {len(record.trials)} of "
               f"{record.num_samples} trials, and a sweep's stopped trials do not start again")
    else:
        why = f"{len(record.trials)} of {record.num_samples} trials finished, and a finished sweep takes no more"
    return (f"sweep {record.name}: nothing left to run: {why}; its results stand as recorded ({folder}); to search "
            f"on from its trials: {search_on}")


def more_refused(record: SweepRecord, given: str, search_on: Command) -> str:
    """The one line of a ``given`` setting (```num_samples` 6``, ```time_budget_s` 3h``) that the
    resume of a finished sweep does not use, since it takes no more trials nor time: ``search_on``
    begins a new sweep with its trials."""
    spent = ", its time budget spent" if record.budget_spent else ""
    return (f"{given} is not used: sweep {record.name} is finished ({len(record.trials)} of {record.num_samples} "
            f"trials{spent}) and a finished sweep takes no more trials nor time; a new sweep that begins with its "
            f"trials can: {search_on}")


def refuse_more_after_the_end(tracker: Tracker, record: SweepRecord, path: Path, search_on: Command) -> None:
    """RecordError naming ``path`` (the record) when a sweep that ran to its end is asked, by a
    ``num_samples`` raised in its record since, for more trials: its run holds its best config
    as params (``best.trial_id``), which a later trial could not change, so a finished sweep takes
    no more trials. ``search_on`` begins a new sweep with its trials instead."""
    parent = next((r for r in tracker.find_runs(record.experiment or "", {"sweep": record.name})
                   if r.run_id == record.parent_run_id), None)
    if parent is None or "best.trial_id" not in parent.params:
        return
    from iaa.jobs.workdir.fields import RecordError

    raise RecordError(f"{path}: num_samples: sweep {record.name} finished with {len(record.trials)} trials and its run "
                      f"keeps its best config for good, but its record now asks for {record.num_samples}; a finished "
                      f"sweep takes no more trials: set num_samples back to {len(record.trials)}, or search on from "
                      f"its trials: {search_on}")
