"""Joining or starting Ray, and sizing trials on the cluster it finds.

:func:`connect` joins the cluster at ``--address`` (failing fast, with a message, when nothing
listens there) or starts a local one with Ray's dashboard on 127.0.0.1 (and, unless the dashboard
is asked to listen elsewhere, every HTTP endpoint of Ray on loopback), and checks that
checkpoints can go to storage every node sees (:mod:`iaa.platform.cluster.storage`).
:func:`fit_trials` plans the trials on the live nodes (:func:`iaa.platform.cluster.resources.plan`);
a cluster reached by ``--address`` may first be asked to grow.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import socket
from dataclasses import dataclass, replace
from typing import Any, Collection, Iterator

from iaa.platform import listeners
from iaa.platform.cluster import driver_lines, head_watch, ray_internals, resources
from iaa.platform.cluster.resources import ClusterError, Node, TrialPlan, node_summary, plan
from iaa.platform.cluster.storage import check_storage

DASHBOARD_HOST_ENV = "IAA_DASHBOARD_HOST"      # where a local cluster's dashboard listens (127.0.0.1)
DASHBOARD_PORT_ENV = "IAA_DASHBOARD_PORT"      # its port (8265, or a free one when 8265 is taken)
CONNECT_TIMEOUT_ENV = "IAA_RAY_CONNECT_TIMEOUT"  # seconds to reach a --address before giving up (10)
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"   # 0: Ray's node address is loopback
DEFAULT_DASHBOARD_PORT = 8265
LOCAL_START_TRIES = 3        # starts of a local Ray whose dashboard port another process took first
DEFAULT_CONNECT_TIMEOUT_S = 10.0


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


def dashboard_host() -> str:
    """Where a local cluster's dashboard listens: ``IAA_DASHBOARD_HOST`` (default 127.0.0.1), checked."""
    host = os.environ.get(DASHBOARD_HOST_ENV, "127.0.0.1")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except (OSError, UnicodeError) as err:
        raise ClusterError(f"{DASHBOARD_HOST_ENV}={host!r}: cannot listen there ({getattr(err, 'strerror', None) or err}); "
                           "give an address of this machine, such as 127.0.0.1 (the default) or 0.0.0.0") from None
    return host


@contextlib.contextmanager
def _loopback_only(wanted: bool) -> Iterator[None]:
    """Start a local cluster whose every port listens on loopback only (when ``wanted``).

    Ray binds its Prometheus endpoints (metrics agent, dashboard, autoscaler), which answer
    without a token, and its gRPC ports to all interfaces, unless the node's address is a
    loopback one. Ray takes the loopback address when ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
    (its switch for single-machine Ray on Windows and macOS): set for the processes the new
    cluster starts, and restored after, so that a later ``--address`` join uses the real address.
    """
    from iaa.platform.cluster.ray_internals import ray_constants as internals

    ray_constants = internals()
    if not wanted or ray_constants is None:
        yield
        return

    saved_env, saved = os.environ.get(SINGLE_MACHINE_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[SINGLE_MACHINE_ENV], ray_constants.ENABLE_RAY_CLUSTER = "0", False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved
        if saved_env is None:
            os.environ.pop(SINGLE_MACHINE_ENV, None)
        else:
            os.environ[SINGLE_MACHINE_ENV] = saved_env


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError, UnicodeError):
        return False


def dashboard_port(host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """The port of a local cluster's dashboard: ``IAA_DASHBOARD_PORT``, else 8265 when free, else any free port
    (never one of ``avoid``, ports that were taken when Ray tried them).

    Each local cluster gets its own port, so two sweeps (or test runs) on one machine do not collide,
    and its workers are told exactly that port (see :func:`connect`).
    """
    wanted = os.environ.get(DASHBOARD_PORT_ENV)
    if wanted:
        try:
            return int(wanted)
        except ValueError:
            raise ClusterError(f"{DASHBOARD_PORT_ENV}={wanted!r} is not a port number") from None
    if DEFAULT_DASHBOARD_PORT not in avoid and _port_free(host, DEFAULT_DASHBOARD_PORT):
        return DEFAULT_DASHBOARD_PORT
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
            port = int(probe.getsockname()[1])
        if port not in avoid:
            return port


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
            f"check `address` / RAY_ADDRESS and that the head node runs (`ray status --address {address}`), "
            f"or raise {CONNECT_TIMEOUT_ENV}"
        ) from None


def connect(address: str | None = None, storage_path: str | None = None, *, num_cpus: int | None = None,
            num_gpus: int | None = None, log_to_driver: bool | None = None, dashboard: bool = True) -> ClusterInfo:
    """Connect to the Ray cluster at ``address`` (or ``RAY_ADDRESS``), else start a local one.

    A local cluster runs Ray's dashboard on ``IAA_DASHBOARD_HOST`` (default 127.0.0.1) and a port
    of its own (:func:`dashboard_port`). Its workers get that dashboard's URL in
    ``RAY_API_SERVER_ADDRESS``: Ray Train frees the placement group of a Train run whose controller
    died (a trial stopped by ASHA) through the State API, which otherwise looks for "the" local
    cluster and fails when a machine runs two. A Ray already initialised in this process (tests,
    notebooks) is reused. On a cluster with more than one node, ``storage_path`` must be shared
    storage (see :func:`check_storage`). ``dashboard=False`` starts a local cluster without Ray's
    dashboard (``iaa-cli serve``: Ray Serve does not use it, and it costs seconds to start).
    Raises :class:`ClusterError` for an unreachable address or unusable storage.
    """
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if address == "local":          # Ray's word for "a new local cluster": the default here anyway
        address = None
    if log_to_driver is None:
        log_to_driver = os.environ.get("IAA_RAY_LOG_TO_DRIVER", "0") == "1"
    with _keeps_sigterm():          # ray.init sets its own, which would bypass the command's stop
        return _connect(ray, address, storage_path, num_cpus=num_cpus, num_gpus=num_gpus,
                        log_to_driver=log_to_driver, dashboard=dashboard)


@contextlib.contextmanager
def _keeps_sigterm() -> Iterator[None]:
    """Give SIGTERM back to the handler it had (the command's stop, :mod:`iaa.jobs.interrupt`)."""
    import signal
    import threading

    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main and callable(before):
            signal.signal(signal.SIGTERM, before)


def _connect(ray: Any, address: str | None, storage_path: str | None, *, num_cpus: int | None,
             num_gpus: int | None, log_to_driver: bool, dashboard: bool) -> ClusterInfo:
    dashboard_url = None
    if ray.is_initialized() and address and "://" not in address and _host_port(address) and \
            ray.get_runtime_context().gcs_address != address:
        head_watch.unwatch()
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
            if "://" not in address:        # a driver of the cluster (not a Ray Client): its head may die
                head_watch.watch(ray.get_runtime_context().gcs_address)
        else:
            dashboard_url = _start_local(num_cpus, num_gpus, env, kwargs, dashboard)
        _quiet_ray_data()
    driver_lines.off_the_console()       # at every connect: sys.stdout may have been replaced since
    info = ClusterInfo(_alive_nodes(), address, dashboard_url)
    check_storage(storage_path, info.nodes)
    return info


def _start_local(num_cpus: int | None, num_gpus: int | None, env: dict[str, str], kwargs: dict[str, Any],
                 dashboard: bool = True) -> str | None:
    """Start a local cluster; returns its dashboard's ``host:port``.

    The dashboard's port is picked here (its workers must be told it before they start), so
    another process may bind it first, in the seconds a loaded machine takes to start Ray: then
    Ray is started again on another port, up to :data:`LOCAL_START_TRIES` times. Any failure is a
    :class:`ClusterError` of one line; Ray's own log of it stays in its session's ``logs/``.
    Ray turns token authentication on for a new local cluster with a warning on every start;
    docs/network.md explains it once instead.
    """
    import ray

    if not dashboard:
        try:
            with _loopback_only(True), _ray_start_log_quiet():
                ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=num_gpus,
                         include_dashboard=False, runtime_env={"env_vars": env} if env else None, **kwargs)
        except Exception as err:  # noqa: BLE001 - as below
            ray.shutdown()
            raise ClusterError(f"could not start a local Ray: {_one_line(err)}; see Ray's logs under "
                               "/tmp/ray/session_latest/logs") from None
        return None
    host = dashboard_host()
    fixed = bool(os.environ.get(DASHBOARD_PORT_ENV))
    taken: set[int] = set()
    for attempt in range(1, LOCAL_START_TRIES + 1):
        port = dashboard_port(host, avoid=taken)
        env["RAY_API_SERVER_ADDRESS"] = listeners.url(host, port)
        try:
            # address="local": without it, ray.init joins the latest `ray start` cluster on this machine
            with _loopback_only(_loopback(host)), _ray_start_log_quiet():
                context = ray.init(address="local", num_cpus=num_cpus or os.cpu_count() or 1, num_gpus=num_gpus,
                                   include_dashboard=True, dashboard_host=host, dashboard_port=port,
                                   runtime_env={"env_vars": env}, **kwargs)
            return context.dashboard_url or None
        except Exception as err:  # noqa: BLE001 - Ray raises bare Exceptions here; each becomes one line
            ray.shutdown()
            if _port_taken(err) and not fixed and attempt < LOCAL_START_TRIES:
                taken.add(port)
                continue
            hint = (f"; free port {port} or set {DASHBOARD_PORT_ENV} to another" if _port_taken(err) and fixed else
                    "; see Ray's logs under /tmp/ray/session_latest/logs")
            raise ClusterError(f"could not start a local Ray (dashboard on {host}:{port}, try {attempt}): "
                               f"{_one_line(err)}{hint}") from None
    raise AssertionError("unreachable")


def _port_taken(err: BaseException) -> bool:
    text = str(err).lower()
    return any(words in text for words in ("address already in use", "already occupied", "valid port"))


def _one_line(err: BaseException) -> str:
    """The telling line of a (multi-line) Ray error: one naming a taken port, else the last."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()] or [type(err).__name__]
    telling = [line for line in lines if _port_taken(Exception(line))]
    line = (telling or lines)[-1]
    return line if len(line) <= 240 else line[:237] + "..."


QUIETED_LOGGERS = ray_internals.QUIETED_LOGGERS


@contextlib.contextmanager
def _ray_start_log_quiet() -> Iterator[None]:
    """Ray's start-up messages that iaa says otherwise (:data:`QUIETED_LOGGERS`) are held back."""
    loggers = {logging.getLogger(name): level for name, level in QUIETED_LOGGERS.items()}
    saved = {log: log.level for log in loggers}
    for log, level in loggers.items():
        log.setLevel(level)
    try:
        yield
    finally:
        for log, level in saved.items():
            log.setLevel(level)


def _quiet_ray_data() -> None:
    try:
        from ray.data import DataContext

        ctx = DataContext.get_current()
        ctx.enable_progress_bars = False
        ctx.print_on_execution_start = False
    except Exception:  # noqa: BLE001 - progress bars are cosmetic
        pass


# --- trials on the cluster ------------------------------------------------------------------------


def fit_trials(info: ClusterInfo, workers: int, *, threads: int | None = None, gpus_per_worker: float = 0.0,
               max_concurrent: int | None = None, num_trials: int | None = None,
               sweep: bool = True) -> tuple[ClusterInfo, TrialPlan]:
    """:func:`plan` on the connected cluster; a cluster reached by ``--address`` may grow first.

    On such a cluster, when not even one trial fits yet (no GPU node has started, say), the
    autoscaler is asked for one trial's workers and the sweep waits for them (see
    :func:`iaa.platform.cluster.resources.wait_for`); then concurrency is planned with ``queue=True``.
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


def describe(info: ClusterInfo, trial_plan: TrialPlan, one_run: bool = False) -> str:
    """One line for the log: the cluster and what each trial holds (``one_run``: what the one run
    of ``train`` on workers holds; it runs no trials)."""
    where = "local Ray" if info.address is None else f"Ray at {info.address}"
    if info.dashboard:
        token = "; it asks for the token `ray get-auth-token` prints" if os.environ.get("RAY_AUTH_MODE") == "token" else ""
        where += f" (dashboard http://{info.dashboard}{token})"
    holds = _count(trial_plan.threads, "thread") + (f" and {trial_plan.gpus_per_worker:g} GPU"
                                                    if trial_plan.gpus_per_worker else "")
    mode = (f"in the trial actor with {holds}" if trial_plan.in_actor
            else f"on {_count(trial_plan.workers, 'Train worker')} with {holds} each")
    now = trial_plan.fits_now or trial_plan.max_concurrent
    at_once = (f"{_count(now, 'trial')} at once on today's nodes, up to {trial_plan.max_concurrent} as nodes join"
               if now < trial_plan.max_concurrent else f"up to {_count(now, 'trial')} at once")
    cluster = (f"{where}: {_count(len(info.nodes), 'node')}, {info.cpus:g} CPU{'' if info.cpus == 1 else 's'}, "
               f"{info.gpus:g} GPU{'' if info.gpus == 1 else 's'}")
    if one_run:
        return f"{cluster}; the run trains {mode}"
    return f"{cluster}; each trial trains {mode}; {at_once}"


def _count(n: int, thing: str) -> str:
    """``1 thread``, ``2 threads``."""
    return f"{n} {thing}{'' if n == 1 else 's'}"
