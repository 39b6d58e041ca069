"""What a sweep says on the console while it runs: one line per trial event and a short table.

The launcher's adapter calls :class:`SweepConsole` on each trial event (started, check, stopped
by ASHA, finished, failed) and on the scheduler's idle ticks; the console writes one line per
event and, after a trial ended and once nothing else was said for ``TABLE_EVERY_S`` seconds,
a compact table of the trials with the searched parameters as columns. It also corrects the
sweep's cost estimate from the first real checks: the probe before the sweep times a few
training steps only, while a trial also validates, checkpoints and starts up. The first check
comes from the quickest trial of the first wave, which in a sweep over model sizes is the
smallest; once every trial of that wave has checked, the estimate is said again where it moved
by more than ``REVISE_BY``.

Each event's line is also an event for programs (:func:`iaa.logs.event`; ``--log-format json``
writes its fields): ``trial_started``, ``trial_continued``, ``trial_checked``, ``trial_ended``,
``trial_restored`` and ``node_lost``, each with the trial's name as ``trial``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence

from iaa import logs
from iaa.errors import printable
from iaa.jobs.ports import TIME_BUDGET, trial_said
from iaa.jobs.sweeps import comparison
from iaa.jobs.sweeps.cost import SweepCost, duration
from iaa.jobs.config.job_config import config_label, short_name, short_value

_log = logging.getLogger(__name__)

TABLE_EVERY_S = 30.0
REVISE_BY = 0.2            # a share of the first estimate: less is not worth a line


@dataclass
class _Trial:
    params: Mapping[str, Any]
    started: float
    checks: int = 0
    epoch: float = 0.0
    valid_acc: float | None = None
    best: float | None = None
    state: str = "running"        # running, stopped (by ASHA or the time budget), finished, failed
    checked_at: float | None = None   # when its last check (and checkpoint) came
    restores: int = 0
    values: dict[int, float] = field(default_factory=dict)   # valid_acc by check number
    stopped_by_asha: bool = False


@dataclass
class SweepConsole:
    """The sweep's console; ``clock`` and ``say`` (where a line goes; None: the module's logger at
    INFO, an event's line with its fields) are replaceable for tests.

    Args:
        cost: the estimate said before the sweep (None: no estimate, e.g. a resumed sweep).
        searched: the searched parameter names, in table order.
        label: what a trial is, from its Tune config (an ensemble's members: their seed).
        what: the work, in the closing line ("sweep", "training members").
    """

    cost: SweepCost | None
    searched: Sequence[str]
    label: Callable[[Mapping[str, Any]], str] = config_label
    what: str = "sweep"
    say: Callable[[str], None] | None = None
    clock: Callable[[], float] = time.monotonic
    table_every_s: float = TABLE_EVERY_S
    trials: dict[str, _Trial] = field(default_factory=dict)
    corrected_s: float | None = None       # the estimate after the first check
    revised_s: float | None = None         # ... after every trial of the first wave checked, where it moved
    nodes_lost: int = 0
    redone_s: float = 0.0                  # training lost to restores: since each restored trial's last check
    replayed: int = 0                      # checks reported again after a restore

    def __post_init__(self) -> None:
        self.started = self.clock()
        self._said = self.started            # when the last line was written
        self._table_at = self.started
        self._changed = False                # a trial ended since the last table

    # --- events ---------------------------------------------------------------------------------

    def trial_started(self, trial_id: str, params: Mapping[str, Any]) -> None:
        if trial_id in self.trials and self.trials[trial_id].state == "running":
            return                                  # a restarted or resumed trial
        self.trials[trial_id] = _Trial(dict(params), self.clock())
        self._say(f"{trial_said(trial_id)} started: {self.label(params)}", "trial_started", trial=trial_id,
                  params=dict(params))

    def trial_continued(self, trial_id: str, params: Mapping[str, Any], from_check: int) -> None:
        """A resumed sweep's unfinished trial, restored from the checkpoint of check ``from_check``."""
        if trial_id in self.trials and self.trials[trial_id].state == "running":
            return                                  # restarted in this process: its restore was told
        t = self.trials.setdefault(trial_id, _Trial(dict(params), self.clock()))
        t.checks = max(t.checks, from_check)
        self._say(f"{trial_said(trial_id)} continues from check {from_check}: {self.label(params)}", "trial_continued",
                  trial=trial_id, check=from_check, params=dict(params))

    def trial_checked(self, trial_id: str, metrics: Mapping[str, Any]) -> None:
        t = self.trials.setdefault(trial_id, _Trial({}, self.clock()))
        checks = int(metrics.get("checks", t.checks + 1))
        self.replayed += checks <= t.checks
        t.checks, t.checked_at = checks, self.clock()
        t.epoch = float(metrics.get("epoch", t.epoch))
        t.valid_acc = _float(metrics.get("valid_acc"))
        t.best = _float(metrics.get("best_valid_acc")) or t.valid_acc
        if t.valid_acc is not None:
            t.values[checks] = t.valid_acc
        first = self.corrected_s is None
        if first:
            self.corrected_s = self._estimate_total()
        self._say(f"{trial_said(trial_id)} check {t.checks} (epoch {t.epoch:.2f}): valid_acc {_acc(t.valid_acc)}, "
                  f"best {_acc(t.best)}", "trial_checked", trial=trial_id, check=t.checks, epoch=t.epoch,
                  valid_acc=t.valid_acc, best_valid_acc=t.best)
        if first and self.corrected_s is not None and self.cost is not None:
            probe = f" (the probe said at most {duration(self.cost.wall_s)})" if self.cost.wall_s else ""
            ends = self._budget_end_s()
            budget = (f"; its time budget ends it at about {duration(ends)}"
                      if ends is not None and ends < self.corrected_s else "")
            self._say(f"estimate from the first check: about {duration(self.corrected_s)} in all{probe}{budget}")
        elif self.revised_s is None and self.corrected_s is not None and self._first_wave_checked():
            self._revise()

    def _first_wave(self) -> int:
        """The trials of the first wave: as many as run at once, at most the sweep's (0 without an estimate)."""
        return min(max(self.cost.concurrency, 1), self.cost.trials) if self.cost is not None else 0

    def _first_wave_checked(self) -> bool:
        """Whether every trial of the first wave (the first trials to start) has made a check."""
        wave = sorted(self.trials.values(), key=lambda t: t.started)[:self._first_wave()]
        return 0 < len(wave) == self._first_wave() and all(t.checks for t in wave)

    def _revise(self) -> None:
        """Say the estimate from the first wave's checks, where it moved from the first check's."""
        estimate = self._estimate_total()
        assert self.corrected_s is not None
        if estimate is None or abs(estimate - self.corrected_s) <= REVISE_BY * self.corrected_s:
            self.revised_s = self.corrected_s
            return
        self.revised_s = estimate
        self._say(f"estimate from the first {self._first_wave()} trials' checks: about {duration(estimate)} in all "
                  "(the first check came from the quickest of them)")

    def trial_ended(self, trial_id: str, reason: str, error: str | None = None) -> None:
        """``reason``: ``asha`` (stopped by the scheduler), ``time-budget`` (the sweep's budget was
        spent), the loop's stop reason, or ``error``."""
        t = self.trials.setdefault(trial_id, _Trial({}, self.clock()))
        if t.state != "running":
            return
        self._changed = True
        after = f"after {t.checks} check{'s' * (t.checks != 1)}, best valid_acc {_acc(t.best)}"
        if reason == "asha":
            t.state, t.stopped_by_asha = "stopped", True
            line = f"{trial_said(trial_id)} stopped by ASHA {after}"
        elif reason == TIME_BUDGET:
            t.state = "stopped"
            line = f"{trial_said(trial_id)} stopped by the time budget {after}"
        elif reason == "error":
            t.state = "failed"
            last = (error or "").strip().splitlines()[-1:]
            line = f"{trial_said(trial_id)} failed {after}" + (f": {last[0][:200]}" if last else "")
        else:
            t.state = "finished"
            line = f"{trial_said(trial_id)} finished ({reason or 'done'}) {after}"
        self._say(line, "trial_ended", trial=trial_id, state=t.state, reason=reason or "done", checks=t.checks,
                  best_valid_acc=t.best)

    def first_comparison(self, grace_period: int) -> dict[str, Any]:
        """:func:`iaa.jobs.sweeps.comparison.first_comparison` of the trials that ended here, by
        their checks as they were reported (a failed trial's are left out)."""
        return comparison.first_comparison(
            [comparison.Checked(dict(t.values), t.stopped_by_asha)
             for t in self.trials.values() if t.state in ("finished", "stopped")], grace_period)

    def node_lost(self, node: str, detail: str = "") -> None:
        """A node of the cluster died (its trials are restored, each on its own line)."""
        self.nodes_lost += 1
        self._say(f"node {node} lost" + (f": {detail}" if detail else ""), "node_lost", node=node)

    def trial_restored(self, trial_id: str, from_check: int) -> None:
        """A trial failed (its node died) and restarts from the checkpoint of check ``from_check``
        (0: from the start); the training since that check is done again."""
        t = self.trials.setdefault(trial_id, _Trial({}, self.clock()))
        now = self.clock()
        t.restores += 1
        self.redone_s += max(now - (t.checked_at if t.checked_at is not None else t.started), 0.0)
        t.state = "running"
        where = f"check {from_check}" if from_check else "check 0 (the start)"
        self._say(f"{trial_said(trial_id)} restored from {where}, restore {t.restores}; it goes on once the cluster "
                  "has room for it", "trial_restored", trial=trial_id, check=from_check, restores=t.restores)

    def restores(self) -> str | None:
        """How many trials were restored and what that cost; None when none was."""
        restored = [t for t in self.trials.values() if t.restores]
        if not restored:
            return None
        count = sum(t.restores for t in restored)
        line = (f"{len(restored)} trial{'s' * (len(restored) != 1)} restored ({count} restore{'s' * (count != 1)} "
                f"after {self.nodes_lost} lost node{'s' * (self.nodes_lost != 1)}); work redone: at most "
                f"{duration(self.redone_s)} of training since their last checkpoints")
        return line + (f", {self.replayed} check{'s' * (self.replayed != 1)} reported again" if self.replayed else "")

    def tick(self) -> None:
        """Called often by the scheduler: the standings, once nothing was said for ``table_every_s``
        after a trial ended (each check has its own line; an unchanged table is not repeated)."""
        now = self.clock()
        if self._changed and now - self._said >= self.table_every_s and now - self._table_at >= self.table_every_s:
            self._table_at, self._changed = now, False
            self._say(self.table())

    # --- what is printed ------------------------------------------------------------------------

    def table(self) -> str:
        """The trials, best first, with the searched values as columns, and the time left."""
        head = ["trial", "state", "checks", "valid_acc", "best", *[short_name(k) for k in self.searched]]
        rows = [head]
        ranked = sorted(self.trials.items(), key=lambda kv: -(kv[1].best if kv[1].best is not None else -1.0))
        for trial_id, t in ranked:
            rows.append([trial_id, t.state, str(t.checks), _acc(t.valid_acc), _acc(t.best),
                         *[short_value(t.params[k]) if k in t.params else "" for k in self.searched]])
        widths = [max(len(r[c]) for r in rows) for c in range(len(head))]
        lines = ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        left = self.left_s()
        done = sum(t.state != "running" for t in self.trials.values())
        trials = self.cost.trials if self.cost is not None else len(self.trials)
        lines.insert(0, f"{done}/{trials} trials done" + ("" if left is None else f", about {duration(left)} left"))
        return "\n".join(lines)

    def summary(self, wall_s: float) -> str:
        """The sweep's time against the estimates said before and during it."""
        parts = [f"{self.what} took {duration(wall_s)}"]
        if self.cost is not None and self.cost.wall_s:
            parts.append(f"estimated at most {duration(self.cost.wall_s)} before it started")
        if self.corrected_s is not None:
            parts.append(f"about {duration(self.corrected_s)} after the first check")
        if self.revised_s is not None and self.revised_s != self.corrected_s:
            parts.append(f"about {duration(self.revised_s)} after the first wave's")
        restores = self.restores()
        return "; ".join(parts + ([restores] if restores else []))

    # --- the estimate ---------------------------------------------------------------------------

    def placed(self, concurrency: int) -> None:
        """How many trials run at once, once the cluster is known (the estimate's waves)."""
        if self.cost is not None:
            self.cost = replace(self.cost, concurrency=concurrency)

    def _epochs_per_s(self) -> float | None:
        """A trial's speed in epochs per second, start-up and validation included: the mean over
        trials that made a check of the epochs to its last check over the time it took."""
        rates = [t.epoch / (t.checked_at - t.started) for t in self.trials.values()
                 if t.checks and t.epoch > 0 and t.checked_at is not None and t.checked_at > t.started]
        return sum(rates) / len(rates) if rates else None

    def _estimate_total(self) -> float | None:
        """The sweep's wall time if ASHA stops no trial, at the speed of the checks so far."""
        rate = self._epochs_per_s()
        if rate is None or self.cost is None:
            return None
        waves = -(-self.cost.trials // max(self.cost.concurrency, 1))
        return (self.trials_started_at() - self.started) + waves * self.cost.epochs / rate

    def trials_started_at(self) -> float:
        return min((t.started for t in self.trials.values()), default=self.started)

    def _budget_end_s(self) -> float | None:
        """When the time budget ends the sweep, in seconds from its start (the budget counts from
        the first trial's start); None without a budget."""
        if self.cost is None or self.cost.budget_s is None:
            return None
        return self.trials_started_at() - self.started + self.cost.budget_s

    def left_s(self) -> float | None:
        """Seconds left if ASHA stops no more trials: epochs still to train over the sweep's speed."""
        rate = self._epochs_per_s()
        if rate is None or self.cost is None:
            return None
        running = [t for t in self.trials.values() if t.state == "running"]
        epochs = sum(max(self.cost.epochs - t.epoch, 0.0) for t in running)
        epochs += max(self.cost.trials - len(self.trials), 0) * self.cost.epochs
        left = epochs / (rate * max(min(self.cost.concurrency, max(len(running), 1)), 1))
        ends = self._budget_end_s()
        return left if ends is None else max(min(left, ends - (self.clock() - self.started)), 0.0)

    def _say(self, text: str, event: str | None = None, **fields: Any) -> None:
        """Say ``text`` after the time since the start; ``event``: its name for programs, with ``fields``."""
        now = self.clock()
        line = f"[{duration(now - self.started)}] {printable(text, keep_lines=True)}"
        if self.say is not None:
            self.say(line)
        elif event is not None:
            logs.event(_log, event, line, **fields)
        else:
            _log.info(line)
        self._said = now


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _acc(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
