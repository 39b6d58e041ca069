"""The one place that touches Ray's private modules:

- its switch for a single-machine cluster, by which a local cluster binds every port to loopback
  (see :func:`iaa.platform.cluster.connect._loopback_only`);
- the address of the gRPC server each Ray Serve replica starts for calls between deployments,
  which Serve hard-codes as ``[::]:0`` (every interface), whatever the node's address
  (:func:`bind_serve_replica_grpc`);
- the loggers of its private modules whose start-up messages iaa says otherwise
  (:data:`QUIETED_LOGGERS`);
- the log folder of the session this driver joined (:func:`logs_dir`), where Serve's driver-side
  lines are written instead of the terminal;
- Serve's deploy call without its own wait for the application to run, which has no bound
  (:func:`deploy_without_waiting`);
- the storage of the experiment that Tune's search generator restores with a resumed run, from
  which it creates the run's new trials (:func:`relocate_experiment`);
- the logger of Tune's syncer, which copies a run's state into its storage and says in a warning
  when a copy failed (:data:`SYNC_LOGGER`: a full disk there ends a sweep,
  :mod:`iaa.platform.sweeps.trials.full_disk`), and the driver's logger of the errors of tasks whose result
  nobody fetched (:data:`UNHANDLED_LOGGER`: the trials Tune stopped, whose full disk is said once).
- the name of the driver's thread that prints what the cluster publishes to every driver (a dead
  raylet's last 20 log lines, ``[state-dump] ...``) on the driver's stdout, with no option to turn
  it off (:data:`ERROR_LISTENER_THREAD`): a sweep sends its lines to its log file instead;
- the lines that thread held back as repeats of one it printed (Ray's log deduplication), which
  ``ray.shutdown`` prints on stdout from the main thread (:func:`drain_held_lines`).

``tests/test_private_apis.py`` checks every name used here against the installed Ray, so an
upgrade that moves one fails there, by name; at run time a missing name only loses the loopback
binding (Ray's default binding is used, as the caller says).
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

NAMES = (("ray._private.ray_constants", "ENABLE_RAY_CLUSTER"),
         ("ray.train._internal.storage", "StorageContext"),
         ("ray.serve._private.replica", "add_port_to_grpc_server"),
         ("ray._private.worker", "_global_node"),
         ("ray._private.worker", "stdout_deduplicator"),
         ("ray._private.worker", "stderr_deduplicator"),
         ("ray.serve", "_run"))

# Loggers of Ray's private modules, and the level below which their messages are held back
# while a cluster starts (``iaa.platform.cluster.connect``).
QUIETED_LOGGERS = {
    "ray._private.services": logging.CRITICAL,      # a failed dashboard start as twenty lines of its log:
                                                    # the raised error, made one line, says it instead
    "ray._private.authentication.authentication_token_setup": logging.ERROR,   # "Token authentication is
                                                    # enabled", on every start: explained in docs/network.md
}
SYNC_LOGGER = "ray.train._internal.syncer"          # "Last sync command failed ...", with the error's text
UNHANDLED_LOGGER = "ray._private.worker"            # "Unhandled error (suppress with ...)", with the error's text
MODULES = (*QUIETED_LOGGERS, SYNC_LOGGER, UNHANDLED_LOGGER)   # each must still exist

# ray._private.worker.connect starts it for every driver (SCRIPT_MODE), log_to_driver or not
ERROR_LISTENER_THREAD = "ray_listen_error_messages"

ANY_INTERFACE = "[::]:"            # how Serve's replica asks for its inter-deployment gRPC port


def ray_constants() -> ModuleType | None:
    """Ray's constants module, whose ``ENABLE_RAY_CLUSTER`` a local start reads; None when it is gone."""
    try:
        from ray._private import ray_constants as constants
    except ImportError:
        return None
    return constants if hasattr(constants, "ENABLE_RAY_CLUSTER") else None


def logs_dir() -> Path | None:
    """The log folder of the Ray session this driver joined (``.../session_*/logs``); None when
    Ray is not initialized here or the name has moved."""
    try:
        from ray._private import worker
    except ImportError:
        return None
    node = getattr(worker, "_global_node", None)
    get = getattr(node, "get_logs_dir_path", None)
    return Path(get()) if get is not None else None


def drain_held_lines(stream: Any | None) -> None:
    """Write to ``stream`` (None: nowhere) the lines this driver holds back as repeats of a line it
    printed; ``ray.shutdown`` would otherwise print them on stdout, after the command's own output
    (two agents of a dead node publish the same ``Raylet is terminated`` dump)."""
    try:
        from ray._private import worker
    except ImportError:
        return
    for name in ("stdout_deduplicator", "stderr_deduplicator"):
        held = getattr(worker, name, None)
        for batch in held.flush() if held is not None else ():
            if stream is not None:                  # as Ray prints them, less its colours
                stream.writelines(f"({batch.get('pid')}, ip={batch.get('ip')}) {line}\n" for line in batch["lines"])


def bind_serve_replica_grpc(node_address: str) -> bool:
    """In a Serve replica's process, on a node whose address is loopback (a local cluster started
    by iaa), have the replica's inter-deployment gRPC server listen on that address rather than on
    every interface. Callers reach the server at the node's address, so nothing else changes.
    Must run before the replica starts that server: in the deployment's constructor. Returns
    whether the binding is in place."""
    try:
        if not ipaddress.ip_address(node_address).is_loopback:
            return False
        from ray.serve._private import replica
    except (ImportError, ValueError):
        return False
    add_port: Callable[[Any, str], int] | None = getattr(replica, "add_port_to_grpc_server", None)
    if add_port is None:
        return False
    if getattr(add_port, "bound_to", None) == node_address:
        return True
    host = f"[{node_address}]" if ":" in node_address else node_address

    def add_port_on_node(server: Any, address: str) -> int:
        if address.startswith(ANY_INTERFACE):
            address = f"{host}:{address[len(ANY_INTERFACE):]}"
        return add_port(server, address)

    add_port_on_node.bound_to = node_address  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port_on_node
    return True


def deploy_without_waiting(app: Any, name: str, route_prefix: str) -> None:
    """Deploy a Serve application and return once the controller has it, not once it runs:
    ``serve.run`` waits without a bound for replicas that may never be placed, so the caller
    waits instead, with its own deadline."""
    from ray import serve

    serve._run(app, name=name, route_prefix=route_prefix, _blocking=False)


def relocate_experiment(experiment: Any, storage: str) -> None:
    """Point ``experiment`` (a ``ray.tune.Experiment`` that Tune's ``SearchGenerator`` saved with
    a run's state) at ``storage``, the run's storage now, so that the trials it creates after a
    resume write there.

    ``Tuner.restore`` moves a run's restored trials to the folder it is restored from (Ray's
    pull request 40647), but the search generator's saved experiment, from which every *new*
    trial takes its storage, keeps the absolute path of the folder the run started in: resumed
    from a copy, new trials would checkpoint into the original. The experiment's spec holds the
    same ``StorageContext`` (a class of Ray's private ``ray.train._internal.storage``), so setting
    its file system and path in place moves both.
    """
    import pyarrow.fs

    context = getattr(experiment, "storage", None)
    if context is None or not hasattr(context, "storage_fs_path"):
        return
    filesystem, path = pyarrow.fs.FileSystem.from_uri(storage)
    context.storage_filesystem, context.storage_fs_path = filesystem, path
