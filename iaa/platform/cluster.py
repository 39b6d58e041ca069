"""Ray clusters: connecting, checking shared storage, and fitting trials to the resources.

A sweep deadlocks when its trials hold the CPUs that their own Train workers wait for (a
trial driver taking 1 CPU on a 2-CPU machine leaves nothing for the workers). :func:`plan`
avoids this by construction:

- a trial with one worker trains inside the trial actor, which holds the worker's CPUs (and GPU);
- a trial with N > 1 workers runs a TorchTrainer from a trial driver that holds only
  ``DRIVER_CPU`` (0.01) CPU, and each Train worker asks for its threads minus that share, so a
  driver and its workers together need exactly ``N x threads`` CPUs;
- ``max_concurrent`` is the number of whole trials that the nodes can host at once.

Multi-node clusters need shared storage for checkpoints (Ray stopped syncing to the head node
in 2.7): :func:`check_storage` fails early unless the storage path is a cloud URI or a network
file system, or all nodes run on this machine (``ray.cluster_utils.Cluster`` in tests).
"""

from __future__ import annotations

import logging
import math
import os
import socket
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.errors import IaaError
from iaa.files import REMOTE_SCHEMES, is_remote_uri  # noqa: F401 - is_remote_uri: callers use cluster.is_remote_uri
from iaa.platform import resources

DRIVER_CPU = 0.01           # what a trial driver holds while its TorchTrainer workers train
DRIVER_RESOURCE = "trial_driver"  # a custom resource of the head (or on-demand) nodes: drivers run there
NETWORK_FS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "ceph", "cephfs", "beegfs",
              "glusterfs", "fuse.glusterfs", "fuse.gcsfuse", "fuse.s3fs", "fuse.mountpoint-s3", "fuse.juicefs",
              "fuse.ceph", "fuse.sshfs", "9p", "virtiofs", "wekafs", "panfs")
ASSUME_SHARED_ENV = "IAA_ASSUME_SHARED_STORAGE"   # set to 1 for a shared file system not detected here


@dataclass(frozen=True)
class Node:
    """One alive Ray node's logical resources."""

    address: str
    cpus: float
    gpus: float = 0.0
    driver: float = 0.0                     # its DRIVER_RESOURCE: trial drivers may run here


@dataclass(frozen=True)
class ClusterInfo:
    nodes: tuple[Node, ...]
    address: str | None                     # None: a local Ray started by this process
    dashboard: str | None = None            # host:port of the dashboard this process started

    @property
    def cpus(self) -> float:
        return sum(n.cpus for n in self.nodes)

    @property
    def gpus(self) -> float:
        return sum(n.gpus for n in self.nodes)


@dataclass(frozen=True)
class TrialPlan:
    """How many trials run at once, and what each trial and each Train worker asks Ray for.

    ``trial_resources`` uses Tune's lower-case keys (``cpu``, ``gpu``); ``worker_resources``
    uses Ray Train's ``CPU``/``GPU`` and is empty when the trial trains in its own actor.
    """

    workers: int
    threads: int                            # torch threads per worker (= whole CPUs it holds)
    gpus_per_worker: float
    max_concurrent: int
    trial_resources: dict[str, float] = field(default_factory=dict)
    worker_resources: dict[str, float] = field(default_factory=dict)

    @property
    def in_actor(self) -> bool:
        """True when the trial trains inside its own actor (one worker, no TorchTrainer)."""
        return self.workers == 1


# --- connecting ------------------------------------------------------------------------------------

DASHBOARD_HOST_ENV = "IAA_DASHBOARD_HOST"      # where a local cluster's dashboard listens (127.0.0.1)
DASHBOARD_PORT_ENV = "IAA_DASHBOARD_PORT"      # its port (8265, or a free one when 8265 is taken)
CONNECT_TIMEOUT_ENV = "IAA_RAY_CONNECT_TIMEOUT"  # seconds to reach a --address before giving up (10)
DEFAULT_DASHBOARD_PORT = 8265
DEFAULT_CONNECT_TIMEOUT_S = 10.0


class ClusterError(IaaError, ValueError):
    """The cluster cannot run what was asked (no such node, unreachable address, no shared storage)."""


def _alive_nodes() -> tuple[Node, ...]:
    import ray

    return node_summary(ray.nodes())


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def dashboard_port(host: str = "127.0.0.1") -> int:
    """The port of a local cluster's dashboard: ``IAA_DASHBOARD_PORT``, else 8265 when free, else any free port.

    Each local cluster gets its own port, so two sweeps (or test runs) on one machine do not collide,
    and its workers are told exactly that port (see :func:`connect`).
    """
    wanted = os.environ.get(DASHBOARD_PORT_ENV)
    if wanted:
        try:
            return int(wanted)
        except ValueError:
            raise ClusterError(f"{DASHBOARD_PORT_ENV}={wanted!r} is not a port number") from None
    if _port_free(host, DEFAULT_DASHBOARD_PORT):
        return DEFAULT_DASHBOARD_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def connect_timeout() -> float:
    raw = os.environ.get(CONNECT_TIMEOUT_ENV, str(DEFAULT_CONNECT_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError:
        raise ClusterError(f"{CONNECT_TIMEOUT_ENV}={raw!r} is not a number of seconds") from None
    if not value > 0:
        raise ClusterError(f"{CONNECT_TIMEOUT_ENV}={raw!r} must be > 0 seconds")
    return value


def _host_port(address: str) -> tuple[str, int] | None:
    """``host:port`` of a GCS (``10.0.0.1:6379``) or Ray Client (``ray://head:10001``) address, else None."""
    rest = address.split("://", 1)[1] if "://" in address else address
    host, sep, port = rest.rstrip("/").rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def check_reachable(address: str, timeout_s: float | None = None) -> None:
    """Fail within ``timeout_s`` with a message naming ``address`` when nothing listens there.

    Ray itself retries an unreachable GCS for minutes before it gives up.
    """
    target = _host_port(address)
    if target is None:
        return                                  # "auto", "local": Ray looks for a cluster on this machine
    timeout_s = connect_timeout() if timeout_s is None else timeout_s
    try:
        socket.create_connection(target, timeout=timeout_s).close()
    except OSError as err:
        raise ClusterError(
            f"Ray cluster at {address} is not reachable within {timeout_s:g} s ({err.strerror or err}); "
            f"check --address / RAY_ADDRESS and that the head node runs (`ray status --address {address}`), "
            f"or raise {CONNECT_TIMEOUT_ENV}"
        ) from None


def connect(address: str | None = None, storage_path: str | None = None, *, num_cpus: int | None = None,
            num_gpus: int | None = None, log_to_driver: bool | None = None) -> ClusterInfo:
    """Connect to the Ray cluster at ``address`` (or ``RAY_ADDRESS``), else start a local one.

    A local cluster runs Ray's dashboard on ``IAA_DASHBOARD_HOST`` (default 127.0.0.1) and a port
    of its own (:func:`dashboard_port`). Its workers get that dashboard's URL in
    ``RAY_API_SERVER_ADDRESS``: Ray Train frees the placement group of a Train run whose controller
    died (a trial stopped by ASHA) through the State API, which otherwise looks for "the" local
    cluster and fails when a machine runs two. A Ray already initialised in this process (tests,
    notebooks) is reused. On a cluster with more than one node, ``storage_path`` must be shared
    storage (see :func:`check_storage`). Raises :class:`ClusterError` for an unreachable address
    or unusable storage.
    """
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if address == "local":          # Ray's word for "a new local cluster": the default here anyway
        address = None
    if log_to_driver is None:
        log_to_driver = os.environ.get("IAA_RAY_LOG_TO_DRIVER", "0") == "1"
    dashboard = None
    if ray.is_initialized() and address and "://" not in address and _host_port(address) and \
            ray.get_runtime_context().gcs_address != address:
        ray.shutdown()              # joined to another cluster earlier in this process
    if not ray.is_initialized():
        os.environ.setdefault("RAY_DEDUP_LOGS", "1")
        os.environ.setdefault("RAY_TRAIN_ENABLE_PRINT_PATCH", "0")
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": log_to_driver,
                                  "configure_logging": True}
        env = resources.job_env()
        if address:
            check_reachable(address)
            if _host_port(address) and "://" not in address:
                env["RAY_ADDRESS"] = address
            try:
                ray.init(address=address, runtime_env={"env_vars": env} if env else None, **kwargs)
            except (ConnectionError, ray.exceptions.AuthenticationError) as err:
                raise ClusterError(f"cannot join the Ray cluster at {address}: {str(err).splitlines()[-1]} (a cluster "
                                   "with token authentication needs RAY_AUTH_MODE=token and its token here, see "
                                   "`ray get-auth-token`)") from err
        else:
            host = os.environ.get(DASHBOARD_HOST_ENV, "127.0.0.1")
            port = dashboard_port(host)
            env["RAY_API_SERVER_ADDRESS"] = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
            # address="local": without it, ray.init joins the latest `ray start` cluster on this machine
            context = ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=num_gpus, include_dashboard=True,
                               dashboard_host=host, dashboard_port=port, runtime_env={"env_vars": env}, **kwargs)
            dashboard = context.dashboard_url or None
        _quiet_ray_data()
    info = ClusterInfo(_alive_nodes(), address, dashboard)
    check_storage(storage_path, info.nodes)
    return info


def _quiet_ray_data() -> None:
    try:
        from ray.data import DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
    except Exception:  # noqa: BLE001 - progress bars are cosmetic
        pass


# --- shared storage --------------------------------------------------------------------------------


def filesystem_type(path: Path, mounts: str | None = None) -> str:
    """The type of the file system holding ``path`` (longest matching mount point in /proc/mounts)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text(encoding="utf-8")
        except OSError:
            return "unknown"
    path = Path(os.path.realpath(path))     # symlinks resolved; the path need not exist yet
    best, best_type = "", "unknown"
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mount_point = parts[1].replace("\\040", " ")
        inside = str(path) == mount_point or str(path).startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best):
            best, best_type = mount_point, parts[2]
    return best_type


def check_storage(storage_path: str | None, nodes: Sequence[Node], *, mounts: str | None = None) -> None:
    """Fail early when a multi-node cluster has no shared checkpoint storage.

    Accepted on more than one node: a cloud URI (``s3://``, ``gs://``, ...), a path on a network
    file system (NFS, Lustre, CephFS, a FUSE bucket mount, ...), any path when every node runs on
    this machine, or any path when ``IAA_ASSUME_SHARED_STORAGE=1``.
    """
    hosts = {n.address for n in nodes}
    if len(nodes) <= 1:
        return
    where = f"the cluster has {len(nodes)} nodes ({len(hosts)} hosts)"
    if not storage_path:
        raise ClusterError(
            f"{where}: --storage-path is required so that every node can write and read checkpoints; "
            "give a shared NFS path mounted at the same place on all nodes, or a bucket such as s3://bucket/iaa"
        )
    if "://" in str(storage_path) and not str(storage_path).startswith("file://"):
        if not is_remote_uri(storage_path):
            raise ClusterError(f"--storage-path {storage_path}: unsupported scheme; use one of {', '.join(REMOTE_SCHEMES)}")
        return
    if len(hosts) == 1 or os.environ.get(ASSUME_SHARED_ENV) == "1":
        return
    fs_type = filesystem_type(Path(str(storage_path).removeprefix("file://")), mounts)
    if fs_type not in NETWORK_FS and not fs_type.startswith("fuse."):
        raise ClusterError(
            f"{where}, but --storage-path {storage_path} is on a local {fs_type} file system that the other "
            "nodes cannot see; use an NFS mount shared by all nodes or s3://bucket/path "
            f"(set {ASSUME_SHARED_ENV}=1 if this file system is shared after all)"
        )


# --- fitting trials to the cluster -----------------------------------------------------------------


def _slots(nodes: Sequence[Node], cpu: float, gpu: float) -> int:
    """How many workers asking for ``cpu`` CPUs and ``gpu`` GPUs the nodes hold at once."""
    total = 0
    for node in nodes:
        by_cpu = math.floor(node.cpus / cpu + 1e-9) if cpu > 0 else 10**9
        by_gpu = math.floor(node.gpus / gpu + 1e-9) if gpu > 0 else 10**9
        total += min(by_cpu, by_gpu)
    return total


def default_threads(nodes: Sequence[Node], workers: int, gpus_per_worker: float, *, sweep: bool) -> int:
    """Torch threads per worker when the config does not set ``train.threads``.

    A sweep on CPUs gives each worker one thread, so more trials run side by side; a single
    run shares the cluster among its workers; GPU workers get the CPUs of their GPU's share.
    """
    biggest = max((n.cpus for n in nodes), default=1.0)
    total = sum(n.cpus for n in nodes)
    if gpus_per_worker > 0:   # the CPUs of one GPU share on the smallest GPU node
        per_slot = [n.cpus / math.floor(n.gpus / gpus_per_worker + 1e-9) for n in nodes
                    if n.gpus + 1e-9 >= gpus_per_worker]
        return max(1, min(int(min(per_slot, default=1.0)), 8))
    if sweep:
        return 1
    return max(1, min(int(biggest), int(total // max(workers, 1))))


def plan(nodes: Sequence[Node], workers: int, *, threads: int | None = None, gpus_per_worker: float = 0.0,
         max_concurrent: int | None = None, num_trials: int | None = None, sweep: bool = True,
         queue: bool = False) -> TrialPlan:
    """Resources per trial and how many trials fit at once; :class:`ClusterError` when none fits.

    Args:
        nodes: the cluster's alive nodes.
        workers: Train workers per trial (1 trains inside the trial actor).
        threads: torch threads (= CPUs) per worker; default from :func:`default_threads`.
        gpus_per_worker: GPUs per worker (fractions share a GPU).
        max_concurrent: the user's cap; larger than what fits is an error, not a hang (unless ``queue``).
        num_trials: no more trials run at once than there are.
        sweep: False for a single ``iaa-cli train`` run (no trial driver).
        queue: a cluster that may grow (reached by ``--address``): trials beyond what fits today wait
            in Tune's queue, and their pending resources make the autoscaler add nodes; the
            default concurrency is then ``num_trials``.
    """
    if workers < 1:
        raise ClusterError(f"workers per trial must be >= 1, got {workers}")
    if gpus_per_worker < 0:
        raise ClusterError(f"--gpus-per-worker must be >= 0, got {gpus_per_worker}")
    if not nodes:
        raise ClusterError("the Ray cluster has no alive nodes")
    if threads is None or threads <= 0:
        threads = default_threads(nodes, workers, gpus_per_worker, sweep=sweep)
    total_cpus, total_gpus = sum(n.cpus for n in nodes), sum(n.gpus for n in nodes)
    if gpus_per_worker > 0 and total_gpus == 0:
        raise ClusterError(f"--gpus-per-worker {gpus_per_worker} asks for GPUs, but the cluster has none")
    if gpus_per_worker > 1 and gpus_per_worker != int(gpus_per_worker):
        raise ClusterError(f"--gpus-per-worker above 1 must be a whole number, got {gpus_per_worker}")
    if workers > 1 and 0 < gpus_per_worker < 1:
        raise ClusterError(f"--gpus-per-worker {gpus_per_worker:g} with {workers} workers per trial: NCCL cannot "
                           "put two ranks of one run on a GPU; use --gpus-per-worker 1, or one worker per trial "
                           "(--workers-per-trial 1) to share GPUs between trials")

    in_actor = sweep and workers == 1
    driver_cpu = DRIVER_CPU if sweep and not in_actor else 0.0
    worker_cpu = threads - driver_cpu
    slots = _slots(nodes, threads, gpus_per_worker)
    if slots < workers:
        need = f"{workers} worker(s) x {threads} CPU" + (f" x {gpus_per_worker:g} GPU" if gpus_per_worker else "")
        biggest = max(n.cpus for n in nodes)
        hint = (f"no node has {threads} CPUs (the largest has {biggest:g}); lower train.threads"
                if threads > biggest else f"use at most {slots} worker(s) per trial or fewer threads (train.threads)")
        raise ClusterError(f"a trial needs {need}, but the cluster ({total_cpus:g} CPUs, {total_gpus:g} GPUs on "
                         f"{len(nodes)} node(s)) fits only {slots} such worker(s): {hint}")
    fits = slots // workers
    if queue and not (max_concurrent and max_concurrent > 0):
        max_concurrent = max(fits, num_trials or 0)
    if max_concurrent is not None and max_concurrent > 0:
        if max_concurrent > fits and not queue:
            raise ClusterError(f"--max-concurrent {max_concurrent}: only {fits} trial(s) of {workers} worker(s) x "
                             f"{threads} CPU fit this cluster ({total_cpus:g} CPUs, {total_gpus:g} GPUs); "
                             f"more would wait for each other's CPUs and stall")
        fits = max_concurrent
    if num_trials is not None and num_trials > 0:
        fits = min(fits, num_trials)

    gpu_res = {"gpu": gpus_per_worker} if gpus_per_worker else {}
    if in_actor:
        trial = {"cpu": float(threads), **gpu_res}
        worker: dict[str, float] = {}
    else:
        trial = {"cpu": driver_cpu} if sweep else {}
        if sweep and any(n.driver > 0 for n in nodes):
            trial[DRIVER_RESOURCE] = DRIVER_CPU
        worker = {"CPU": round(worker_cpu, 4), **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
    return TrialPlan(workers=workers, threads=threads, gpus_per_worker=gpus_per_worker, max_concurrent=max(fits, 1),
                     trial_resources=trial, worker_resources=worker)


def fit_trials(info: ClusterInfo, workers: int, *, threads: int | None = None, gpus_per_worker: float = 0.0,
               max_concurrent: int | None = None, num_trials: int | None = None,
               sweep: bool = True) -> tuple[ClusterInfo, TrialPlan]:
    """:func:`plan` on the connected cluster; a cluster reached by ``--address`` may grow first.

    On such a cluster, when not even one trial fits yet (no GPU node has started, say), the
    autoscaler is asked for one trial's workers and the sweep waits for them (see
    :func:`iaa.platform.resources.wait_for`); then concurrency is planned with ``queue=True``.
    A local cluster cannot grow: what does not fit is refused at once.
    """
    args = {"threads": threads, "gpus_per_worker": gpus_per_worker, "sweep": sweep}
    if info.address is None:
        return info, plan(info.nodes, workers, max_concurrent=max_concurrent, num_trials=num_trials, **args)
    plan((Node("any node", cpus=1e6, gpus=1e6),), workers, **args)   # a request no cluster fits fails now
    holder: list[ClusterInfo] = [info]

    def one_fits() -> bool:
        holder[0] = replace(info, nodes=_alive_nodes())
        try:
            plan(holder[0].nodes, workers, **args)
        except ClusterError:
            return False
        return True

    if not one_fits():
        bundle = {"CPU": float(threads or 1), **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
        gpu = f" x {gpus_per_worker:g} GPU" if gpus_per_worker else ""
        resources.wait_for([bundle] * workers, one_fits, f"{workers} worker(s) of {bundle['CPU']:g} CPU{gpu}")
    info = holder[0]
    return info, plan(info.nodes, workers, max_concurrent=max_concurrent, num_trials=num_trials, queue=True, **args)


def describe(info: ClusterInfo, trial_plan: TrialPlan) -> str:
    """One line for the log: the cluster and what each trial holds."""
    where = "local Ray" if info.address is None else f"Ray at {info.address}"
    if info.dashboard:
        where += f" (dashboard http://{info.dashboard})"
    mode = "in the trial actor" if trial_plan.in_actor else f"{trial_plan.workers} Train workers"
    gpu = f", {trial_plan.gpus_per_worker:g} GPU" if trial_plan.gpus_per_worker else ""
    return (f"{where}: {len(info.nodes)} node(s), {info.cpus:g} CPUs, {info.gpus:g} GPUs; each trial trains {mode} "
            f"with {trial_plan.threads} thread(s){gpu} per worker; up to {trial_plan.max_concurrent} trial(s) at once")


def node_summary(nodes: Sequence[Mapping[str, Any]]) -> tuple[Node, ...]:
    """Nodes from ``ray.nodes()``-shaped dicts (for tests and tools)."""
    return tuple(Node(n.get("NodeManagerAddress", "?"), float(n.get("Resources", {}).get("CPU", 0)),
                      float(n.get("Resources", {}).get("GPU", 0)), float(n.get("Resources", {}).get(DRIVER_RESOURCE, 0)))
                 for n in nodes if n.get("Alive", True))
