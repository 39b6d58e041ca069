"""Whether the cluster can place the reader replicas, and a bounded wait for them.

Serve waits without end for replicas the cluster cannot place. :func:`check_fits` refuses at
once, from ``ray.cluster_resources()``, the replicas a local cluster can never hold (it cannot
grow), and from ``ray.available_resources()`` those it cannot hold now (a caller's own actors
hold its CPUs); :func:`wait_running` waits for the application and fails, naming what is short, when
replicas are still unplaced after Serve's slow-start notice (a local cluster) or after
``IAA_AUTOSCALE_WAIT_S`` (a cluster reached by ``--address``, which may be adding nodes).
Neither touches any other application.
"""

from __future__ import annotations

import time
from typing import Any

from iaa.errors import IaaError
from iaa.jobs.ports import ServeConfig
from iaa.platform.cluster.resources import wait_seconds

INGRESS_CPUS = 0.1                   # it only reads HTTP and forwards bytes
POLL_S = 1.0
_UNPLACED = "to be scheduled"        # Serve's status message for replicas no node can take yet


def first_replicas(cfg: ServeConfig) -> int:
    """The reader replicas Serve starts first: the fixed count, or the autoscaler's initial one."""
    return max(cfg.autoscale[0], 1) if cfg.autoscale is not None else cfg.replicas


def ingresses(cfg: ServeConfig) -> int:
    """Ingress replicas at least: two as soon as there may be two readers, so that a lost node (a
    spot node taken back) costs its requests in flight, not every request until Serve has put a
    new ingress in place (with one: 5 to 31 of 600 answered 500 in tests/test_chaos.py)."""
    return 2 if (cfg.autoscale[1] if cfg.autoscale is not None else cfg.replicas) >= 2 else 1


def _need(cfg: ServeConfig) -> str:
    count = first_replicas(cfg)
    need = count * cfg.cpus_per_replica
    return (f"{count} replica{'s' if count > 1 else ''} x {cfg.cpus_per_replica:g} CPU need {need:g} CPUs "
            f"(+{INGRESS_CPUS * ingresses(cfg):g} for the ingress)")


def check_fits(cfg: ServeConfig, total: dict[str, float], free: dict[str, float] | None = None) -> None:
    """Raise :class:`IaaError` when ``total`` (a local cluster's ``ray.cluster_resources()``)
    cannot hold the first replicas and the ingress, or when ``free`` (its
    ``ray.available_resources()``: what a caller's own actors leave) cannot hold them now."""
    cpus, need = float(total.get("CPU", 0.0)), first_replicas(cfg) * cfg.cpus_per_replica + INGRESS_CPUS * ingresses(cfg)
    if need > cpus + 1e-9:
        raise IaaError(f"{_need(cfg)}; the cluster has {cpus:g} (lower `replicas` or `cpus_per_replica`)")
    if free is not None and need > float(free.get("CPU", 0.0)) + 1e-9:
        raise _unplaced(cfg, total, free)


def _status(app: str) -> tuple[str, list[str]]:
    from ray import serve

    status = serve.status().applications.get(app)
    if status is None:
        return "NOT_STARTED", []
    return str(getattr(status.status, "value", status.status)), [d.message for d in status.deployments.values() if d.message]


def _unplaced(cfg: ServeConfig, total: dict[str, float], free: dict[str, float]) -> IaaError:
    return IaaError(f"{_need(cfg)}; the cluster has {total.get('CPU', 0.0):g} ({free.get('CPU', 0.0):g} free) and "
                    "could not place them (lower `replicas` or `cpus_per_replica`, or free the cluster)")


def wait_running(cfg: ServeConfig, local: bool, failure: Any) -> None:
    """Return once ``cfg.app_name`` runs. Raise :class:`IaaError` when a replica's constructor
    failed (``failure()``: its last line) or the replicas stay unplaced (see the module)."""
    deadline = None if local else time.monotonic() + wait_seconds()
    while True:
        state, messages = _status(cfg.app_name)
        if state == "RUNNING":
            return
        if state == "DEPLOY_FAILED":
            raise IaaError(f"the model could not be served: {failure() or 'a replica failed to start'}")
        if any(_UNPLACED in m for m in messages) and (deadline is None or time.monotonic() > deadline):
            import ray

            raise _unplaced(cfg, ray.cluster_resources(), ray.available_resources())
        time.sleep(POLL_S)
