"""A sweep's trial events on the console, told by a Tune callback in the driver, and the nodes Ray saw die.

:class:`ConsoleCallback` forwards each trial's start, checks, restores and end to the console
(:class:`~iaa.jobs.ports.SweepEvents`) that the running process bound to the Tune run's name. Tune
pickles its callbacks into the run (``tuner.pkl``) and brings them back on ``--resume``, so it
holds only that name and finds the console through :mod:`~iaa.platform.sweeps.driver_side`; the
trials' names are those :class:`~iaa.platform.sweeps.trials.trial_runs.TrialRuns` gave their runs.
:class:`NodeWatch` asks Ray which nodes died, so that each lost node is told once: on a line of its
own, or in the line of a trial that lost its worker with it and had no restores left.
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

import ray
import ray.tune as tune

from iaa.jobs.config.presets import TIME_ATTR
from iaa.jobs.ports import TIME_BUDGET, SweepEvents
from iaa.platform.cluster.lost import worker_lost
from iaa.platform.ray_train import MAX_FAILURES_ENV, max_failures
from iaa.platform.sweeps import driver_side
from iaa.platform.sweeps.trials.lost_trials import keep_tune_records_off_the_console, last_error

NODE_POLL_S = 1.0           # how often the console's callback asks Ray which nodes are alive
NODE_CLAIM_S = 5.0          # how long a dead node waits for its trials' failures to name it, before its own line


class ConsoleCallback(tune.Callback):
    """Forwards every trial event to the console that the running process bound to the Tune run
    ``sweep`` (:class:`iaa.jobs.sweeps.console.SweepConsole`; none: silence).

    A trial whose run had finished before this process met it (``DriverSide.finished_before``,
    which :class:`~iaa.platform.sweeps.trials.trial_runs.TrialRuns`, called before this callback, fills as the trial starts) was kept by
    the sweep's earlier run: Tune restored it from its final checkpoint and ends it at once. It
    is neither started nor finished again on the console, where it would have no checks; only
    checks it reports in this process are told, and then its end, with them.

    A trial that lost its worker with no restores left is one line, naming the node that died with
    it (which then has no line of its own); Tune's own records of it stay off the console
    (:mod:`~iaa.platform.sweeps.trials.lost_trials`).
    """

    def __init__(self, sweep: str) -> None:
        self.sweep = sweep
        self._nodes = NodeWatch()
        self._cut_told: set[str] = set()     # the trials the time budget stopped, told to the console
        self._checked: set[str] = set()      # the trials that reported a check in this process

    def __getstate__(self) -> dict[str, Any]:
        return {"sweep": self.sweep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state.get("sweep", ""))  # older saves held no name: they stay silent

    @property
    def console(self) -> SweepEvents | None:
        return driver_side.of(self.sweep).console if driver_side.is_bound(self.sweep) else None

    def name(self, trial: Any) -> str:
        """The trial's one name (``trial-0003``, ``seed-7``), which :class:`~iaa.platform.sweeps.trials.trial_runs.TrialRuns` gave its run."""
        return driver_side.of(self.sweep).names.get(trial.trial_id, trial.trial_id)

    def _kept_before(self, trial: Any) -> bool:
        """The trial was finished and kept before this process, and reported nothing here."""
        return (trial.trial_id in driver_side.of(self.sweep).finished_before
                and trial.trial_id not in self._checked)

    def setup(self, **info: Any) -> None:
        if self.console is not None:
            keep_tune_records_off_the_console()

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if self.console is None or self._kept_before(trial):
            return
        done = int((getattr(trial, "last_result", None) or {}).get(TIME_ATTR) or 0)
        if done and getattr(trial, "checkpoint", None) is not None:      # a resumed sweep's, restored
            self.console.trial_continued(self.name(trial), trial.config, done)
        else:
            self.console.trial_started(self.name(trial), trial.config)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                        **info: Any) -> None:
        self._checked.add(trial.trial_id)
        if self.console is not None:
            self.console.trial_checked(self.name(trial), result)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        if self.console is not None and not self._kept_before(trial):
            self.console.trial_ended(self.name(trial), stop_reason(trial.last_result))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        console = self.console
        if console is None:
            return
        error = last_error(trial)
        if worker_lost(error):
            console.trial_ended(self.name(trial), "error", lost_worker_text(self._nodes.claim(str(error))))
        else:
            console.trial_ended(self.name(trial), "error", str(error) if error is not None else None)

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        console = self.console
        if console is not None:
            self._nodes.tell(console, now=True)       # the node's loss first, when Ray knows it already
            console.trial_restored(self.name(trial), int((trial.last_result or {}).get("checks") or 0))

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        console = self.console
        if console is None:
            return
        self._nodes.tell(console)
        side = driver_side.of(self.sweep)
        for trial_id in sorted(side.budget.cut - self._cut_told):
            self._cut_told.add(trial_id)
            if trial_id in side.names:         # it started: the console knows it
                console.trial_ended(side.names[trial_id], TIME_BUDGET)
        console.tick()

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        console = self.console
        if console is not None:
            self._nodes.tell(console, now=True)       # a node lost as the last trials ended


def lost_worker_text(nodes: Sequence[str] = ()) -> str:
    """How a trial that lost its worker with no restores left ended: with ``nodes`` (``id
    (address)``) when Ray saw them die as it failed, else its process or its node."""
    lost = f"node{'s' * (len(nodes) > 1)} {', '.join(nodes)} died" if nodes else "its process or node died"
    return f"its worker was lost ({lost}) with no restores left ({MAX_FAILURES_ENV})"


class NodeWatch:
    """The cluster's live nodes, asked at most every ``NODE_POLL_S``: a node that was alive and is
    no longer is told to the console once (``node_lost``), unless the failure of a trial that lost
    its worker with no restores left names it (:meth:`claim`): that trial's line is then the
    node's. Ray may show a node dead a moment before its trials' failures reach Tune, so a dead
    node waits up to ``NODE_CLAIM_S`` for them; a restored trial has it told at once."""

    def __init__(self) -> None:
        self._alive: dict[str, str] | None = None          # node id -> its address, as last seen
        self._asked = 0.0
        self._dead: dict[str, tuple[str, float]] = {}      # seen dead, not yet told: id -> (address, when seen)
        self._claimed: dict[str, tuple[str, float]] = {}   # named by a failed trial's line: the same

    def _poll(self, now: bool) -> None:
        """Ask Ray (at once when ``now``, else at most every ``NODE_POLL_S``) which nodes died."""
        at = time.monotonic()
        if (not now and at - self._asked < NODE_POLL_S) or not ray.is_initialized():
            return
        self._asked = at
        try:
            nodes = ray.nodes()
        except Exception:  # noqa: BLE001 - the GCS is busy or gone: ask again at the next poll
            return
        alive = {n["NodeID"]: str(n.get("NodeManagerAddress") or "") for n in nodes if n.get("Alive")}
        if self._alive is not None:
            for node_id, address in self._alive.items():
                if node_id not in alive:
                    self._dead[node_id] = (address, at)
        self._alive = alive

    def tell(self, console: SweepEvents, now: bool = False) -> None:
        """Ask Ray and tell the nodes that died: all of them when ``now`` (Ray is asked at once),
        else those that no trial's failure named within ``NODE_CLAIM_S``."""
        self._poll(now)
        at = time.monotonic()
        due = [(node_id, address) for node_id, (address, seen) in self._dead.items()
               if now or at - seen >= NODE_CLAIM_S]
        then = (f"restores are off ({MAX_FAILURES_ENV}=0): its trials end" if max_failures(1) == 0
                else "its trials restart from their last checkpoints")
        for node_id, address in due:
            del self._dead[node_id]
            console.node_lost(_node(node_id, address), then)

    def claim(self, error: str) -> list[str]:
        """The nodes (``id (address)``) that died with a trial whose worker was lost, for its line;
        none of them is told on a line of its own. Ray is asked at once. ``error``: the trial's
        error, which names its node's id where Ray knows it (only that node is claimed then); else
        every node seen dead and not yet told, or claimed within ``NODE_CLAIM_S`` (by another
        trial of the same node)."""
        self._poll(now=True)
        at = time.monotonic()
        recent = {node_id: seen for node_id, seen in self._claimed.items() if at - seen[1] < NODE_CLAIM_S}
        recent.update(self._dead)
        named = {node_id: seen for node_id, seen in recent.items() if node_id in error} or recent
        for node_id, seen in named.items():
            self._dead.pop(node_id, None)
            self._claimed[node_id] = seen
        return [_node(node_id, address) for node_id, (address, _) in named.items()]


def _node(node_id: str, address: str) -> str:
    """A node as its lines name it: the start of its id and its address."""
    return f"{node_id[:8]} ({address})"


def stop_reason(last_result: Mapping[str, Any] | None) -> str:
    """Why a trial ended: the loop names its own reason in its last report; none means ASHA stopped it."""
    return str((last_result or {}).get("stop_reason") or "asha")
