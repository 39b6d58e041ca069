"""A Ray cluster on this machine that loses worker nodes hard, for the node-failure tests and
``benchmarks/chaos.py``.

- :class:`ChaosCluster`: a head with no CPUs (the driver's node, never killed) and N one-CPU
  worker nodes, each a ``ray start --block`` in its own process group. :meth:`ChaosCluster.kill`
  kills a worker node without a graceful stop (SIGKILL to its process group: raylet, agents and
  workers at once) and optionally starts a fresh one, as a spot replacement would; :meth:`ChaosCluster.kill_every`
  does that every K seconds up to M times from a thread.
- :func:`marking_fit`: the job's loop (``fit_on_worker``) with a link that leaves a marker file
  per check (trial, check, node), so a test can kill the node of a trial at a chosen check; and
  that, when asked, holds one checkpoint write open (the state file written, not yet handed to
  Ray's storage) long enough for the node to be killed in the middle of it.

No ``ray._private`` helper is used here; ``Cluster`` uses them itself.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from tests._platform import ray_command

# Node death is noticed by the GCS health check (Ray's defaults: every 3 s, 5 misses); a test
# cluster checks every 0.5 s and gives up after 3 misses, so a lost node is seen within ~2 s.
FAST_DEATH = {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
              "health_check_timeout_ms": 1000}
HOLD_S = 60.0      # how long a held checkpoint write waits for its node to die
NODE_START_S = 120.0   # how long one start of a worker node may take
NODE_START_TRIES = 3


@dataclass
class Kill:
    node_id: str
    at: float                      # time.monotonic() of the kill
    replaced_by: str | None = None
    reason: str = ""


@dataclass
class _Worker:
    name: str
    process: subprocess.Popen
    node_id: str = ""


@dataclass
class ChaosCluster:
    """A head (0 CPUs, the driver's) and ``workers`` one-CPU worker nodes; kills and replaces workers.

    The head is ``ray.cluster_utils.Cluster``'s; each worker node is a ``ray start --block``
    process in a process group of its own (its raylet, agents and workers with it), so a kill is
    one ``SIGKILL`` to that group, from any thread, and a replacement is a new ``ray start``.
    The test process joins the cluster as the CLI does (``iaa.platform.cluster.connect``).
    """

    workers: int = 2
    cpus_per_worker: int = 1
    logs: Path | None = None
    system_config: dict[str, Any] = field(default_factory=lambda: dict(FAST_DEATH))
    kills: list[Kill] = field(default_factory=list)

    def __post_init__(self) -> None:
        from ray.cluster_utils import Cluster

        from iaa.platform.cluster.connect import connect

        self._lock = threading.Lock()
        self._started = 0
        self._workers: list[_Worker] = []
        self.logs = Path(self.logs or tempfile.mkdtemp(prefix="iaa-chaos-"))
        self.logs.mkdir(parents=True, exist_ok=True)
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False, "_system_config": self.system_config})
        try:
            connect(self.address)
            for _ in range(self.workers):
                self._add()
        except BaseException:
            self.shutdown()      # a head with no CPUs left up would hold every later ray.init() of the process
            raise

    @property
    def address(self) -> str:
        return self.cluster.address

    def _alive(self) -> dict[str, str]:
        import ray

        return {n["NodeName"]: n["NodeID"] for n in ray.nodes() if n["Alive"]}

    def _add(self) -> _Worker:
        """A fresh worker node. A start that gives up (Ray's node start times out when a busy
        machine keeps its raylet from registering in time) is made again, as a replacement would be."""
        for _ in range(NODE_START_TRIES):
            worker = self._start_node()
            if worker is not None:
                self._workers.append(worker)
                return worker
        raise TimeoutError(f"no worker node came up in {NODE_START_TRIES} starts; their logs: {self.logs}")

    def _start_node(self) -> _Worker | None:
        """One ``ray start`` of a worker node: the node once it is alive, or None when its start
        ended without it or took over ``NODE_START_S`` (its process group is then killed)."""
        self._started += 1
        name = f"chaos-{self._started}"
        with open(self.logs / f"{name}.log", "wb") as log:
            process = subprocess.Popen(
                [ray_command(), "start", f"--address={self.address}", f"--num-cpus={self.cpus_per_worker}", "--num-gpus=0",
                 f"--node-name={name}", "--object-store-memory=100000000", "--block", "--disable-usage-stats"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + NODE_START_S
        while time.monotonic() < deadline and process.poll() is None:    # --block: the process lives with its node
            node_id = self._alive().get(name)
            if node_id:
                return _Worker(name, process, node_id)
            time.sleep(0.5)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        return None

    def worker_ids(self) -> list[str]:
        return [w.node_id for w in self._workers]

    def kill(self, node_id: str | None = None, replace: bool = True, reason: str = "") -> Kill:
        """Kill worker node ``node_id`` (default: the oldest) with SIGKILL to its process group;
        start a fresh node when ``replace``."""
        with self._lock:
            found = [w for w in self._workers if node_id is None or w.node_id == node_id]
            if not found:
                raise LookupError(f"no live worker node {node_id}")
            worker = found[0]
            kill = Kill(worker.node_id, time.monotonic(), reason=reason)
            os.killpg(worker.process.pid, signal.SIGKILL)
            worker.process.wait()
            self._workers.remove(worker)
            self.kills.append(kill)
            if replace:
                kill.replaced_by = self._add().node_id
            return kill

    def kill_every(self, seconds: float, times: int, replace: bool = True,
                   stop: threading.Event | None = None) -> threading.Thread:
        """A thread that kills a worker node every ``seconds`` up to ``times`` times, until ``stop``
        is set (join it)."""
        stop = stop or threading.Event()

        def loop() -> None:
            for _ in range(times):
                if stop.wait(seconds):
                    return
                self.kill(replace=replace, reason=f"every {seconds:g}s")
        thread = threading.Thread(target=loop, name="chaos", daemon=True)
        thread.start()
        return thread

    def restore_workers(self) -> list[str]:
        """Back to ``workers`` worker nodes (after kills without replacement): the new nodes' ids,
        each recorded as the replacement of the oldest kill that has none."""
        added = []
        with self._lock:
            while len(self._workers) < self.workers:
                added.append(self._add().node_id)
                open_kills = [k for k in self.kills if k.replaced_by is None]
                if open_kills:
                    open_kills[0].replaced_by = added[-1]
        return added

    def shutdown(self) -> None:
        import ray

        ray.shutdown()
        for worker in self._workers:
            try:
                os.killpg(worker.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            worker.process.wait()
        self.cluster.shutdown()


# --- where trials are: markers written by the trials themselves ------------------------------------


@dataclass(frozen=True)
class Mark:
    trial_id: str
    check: int
    node_id: str


def marks(folder: Path) -> list[Mark]:
    """Every check reported so far (a replayed check appears once per attempt), oldest first."""
    out = []
    for path in sorted(folder.glob("mark-*"), key=lambda p: p.stat().st_mtime_ns):
        try:
            trial_id, check, node_id = path.read_text(encoding="utf-8").split()
        except (OSError, ValueError):
            continue                                   # being written
        out.append(Mark(trial_id, int(check), node_id))
    return out


def wait_for(what: Callable[[], Any], timeout_s: float, poll_s: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = what()
        if found:
            return found
        time.sleep(poll_s)
    raise TimeoutError(f"nothing came within {timeout_s:g}s")


def hold_at(folder: Path, check: int, when: str = "writing") -> None:
    """The next trial to reach check ``check`` holds there until its node dies (see
    :func:`marking_fit`): ``writing`` its checkpoint (the state file written, not yet handed to
    Ray's storage), or ``after`` the check was reported with its checkpoint (mid-trial)."""
    (folder / f"hold-{check}-{when}").write_text("", encoding="utf-8")


def kill_when_held(chaos: "ChaosCluster", folder: Path, check: int, reason: str,
                   timeout_s: float = 300) -> tuple[threading.Thread, dict[str, BaseException]]:
    """In the background: once a worker holds at ``check`` (:func:`hold_at`), kill its node hard and
    put a fresh one in its place. Returns the thread and where a failure of it is kept (``error``)."""
    outcome: dict[str, BaseException] = {}

    def inject() -> None:
        try:
            worker = wait_for(lambda: held(folder, check), timeout_s)
            chaos.kill(worker.node_id, replace=False, reason=f"{reason} {worker.trial_id} after check {check}")
            chaos.restore_workers()
        except BaseException as err:  # noqa: BLE001 - reported by the caller
            outcome["error"] = err

    thread = threading.Thread(target=inject, daemon=True)
    thread.start()
    return thread, outcome


def held(folder: Path, check: int) -> Mark | None:
    """The trial held at check ``check``, once one is."""
    try:
        trial_id, at, node_id = (folder / f"holding-{check}").read_text(encoding="utf-8").split()
    except (OSError, ValueError):
        return None
    return Mark(trial_id, int(at), node_id)


class _MarkingLink:
    """A trial's WorkerLink that marks each check and may hold one checkpoint write open."""

    def __init__(self, link: Any, folder: Path) -> None:
        self._link, self._folder = link, folder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._link, name)

    def publish(self, metrics: dict[str, Any], folder: Path | None) -> None:
        import ray

        try:
            trial_id = ray.tune.get_context().get_trial_id() or f"rank{self._link.rank}"
        except Exception:  # noqa: BLE001 - a Ray Train worker, not a Tune trial
            trial_id = f"rank{self._link.rank}"
        node_id = ray.get_runtime_context().get_node_id()
        check = int(metrics.get("checks", 0))
        line = f"{trial_id} {check} {node_id}"
        self._hold(check, "writing", line)      # the state file is written (``folder``), not yet in Ray's storage
        self._link.publish(metrics, folder)
        mark = self._folder / f"mark-{trial_id}-{check:03d}-{time.time_ns()}"
        tmp = mark.with_suffix(".tmp")
        tmp.write_text(line, encoding="utf-8")
        tmp.rename(mark)
        self._hold(check, "after", line)

    def _hold(self, check: int, when: str, line: str) -> None:
        if not (self._folder / f"hold-{check}-{when}").exists():
            return
        try:
            fd = os.open(self._folder / f"holding-{check}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return                              # another trial held there already
        os.write(fd, line.encode())
        os.close(fd)
        time.sleep(HOLD_S)                      # the node dies here


def _marked_fit(folder: str, cfg: Any, link: Any, data: Any, *, threads: int) -> Any:
    from iaa.jobs.training.loop import fit_on_worker

    return fit_on_worker(cfg, _MarkingLink(link, Path(folder)), data, threads=threads)


def marking_fit(folder: Path) -> Any:
    """The job's loop, marking every check in ``folder`` (a WorkerFit, picklable by reference)."""
    folder.mkdir(parents=True, exist_ok=True)
    return functools.partial(_marked_fit, str(folder))


def chaos_launcher(address: str, storage_path: str, folder: Path, callbacks: tuple = ()) -> Any:
    """The Ray launcher of ``iaa-cli tune|train --address``, its trials (or Train workers) running
    :func:`marking_fit`."""
    from dataclasses import replace

    from iaa.platform.sweeps.launch import RayLauncher

    class MarkingLauncher(RayLauncher):
        def sweep(self, request: Any) -> Any:
            return super().sweep(replace(request, trials=replace(request.trials, fit=marking_fit(folder))))

        def train_workers(self, request: Any) -> Any:
            return super().train_workers(replace(request, fit=marking_fit(folder)))

    return MarkingLauncher(address, storage_path, callbacks)
