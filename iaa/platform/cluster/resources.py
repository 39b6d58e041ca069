"""What a trial asks Ray for: how trials fit the nodes, the device, and waiting for nodes.

- :func:`plan` sizes the trials on a cluster's nodes. A sweep deadlocks when its trials hold
  the CPUs that their own Train workers wait for (a trial driver taking 1 CPU on a 2-CPU machine
  leaves nothing for the workers); :func:`plan` avoids this by construction:

  - a trial with one worker trains inside the trial actor, which holds the worker's CPUs (and GPU);
  - a trial with N > 1 workers runs a TorchTrainer from a trial driver that holds only
    ``DRIVER_CPU`` (0.01) CPU, and each Train worker asks for its threads minus that share, so a
    driver and its workers together need exactly ``N x threads`` CPUs;
  - ``max_concurrent`` is the number of whole trials that the nodes can host at once.
- :func:`train_device` is the one place that turns the GPUs Ray assigned to a worker into a torch
  device. Ray sets ``CUDA_VISIBLE_DEVICES`` to the assigned GPUs, so ``cuda:0`` inside a trial
  actor is its own GPU; Train workers use ``ray.train.torch.get_device()``. ``IAA_TRAIN_DEVICE=cpu``
  forces the CPU whatever Ray assigned (a cluster with fake GPU resources in tests, debugging).
- :func:`wait_for` asks the autoscaler for the bundles one trial needs
  (``ray.autoscaler.sdk.request_resources``) and waits until the cluster holds them, so a sweep
  submitted to a cluster whose GPU nodes have not started yet waits instead of failing
  (:func:`iaa.platform.cluster.connect.fit_trials`).
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from iaa.errors import IaaError

_log = logging.getLogger(__name__)

TRAIN_DEVICE_ENV = "IAA_TRAIN_DEVICE"          # cpu: train on the CPU even on GPU workers
AUTOSCALE_WAIT_ENV = "IAA_AUTOSCALE_WAIT_S"    # how long to wait for the first node that fits a trial
DEFAULT_AUTOSCALE_WAIT_S = 900.0
POLL_S = 2.0
DRIVER_CPU = 0.01           # what a trial driver holds while its TorchTrainer workers train
DRIVER_RESOURCE = "trial_driver"  # a custom resource of the head (or on-demand) nodes: drivers run there


class ClusterError(IaaError, ValueError):
    """The cluster cannot run what was asked (no such node, unreachable address, no shared storage)."""


@dataclass(frozen=True)
class Node:
    """One alive Ray node's logical resources."""

    address: str
    cpus: float
    gpus: float = 0.0
    driver: float = 0.0                     # its DRIVER_RESOURCE: trial drivers may run here


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
    fits_now: int | None = None             # trials today's nodes run at once (a cluster that may grow
                                            # admits more: they wait); None: ``max_concurrent``

    @property
    def in_actor(self) -> bool:
        """True when the trial trains inside its own actor (one worker, no TorchTrainer)."""
        return self.workers == 1


def forced_device() -> str | None:
    """``IAA_TRAIN_DEVICE`` (``cpu`` or ``cuda``), or None when unset."""
    value = os.environ.get(TRAIN_DEVICE_ENV, "").strip().lower()
    if value and value not in ("cpu", "cuda"):
        raise IaaError(f"{TRAIN_DEVICE_ENV}={value!r}: use cpu or cuda")
    return value or None


def train_device(gpus: float) -> torch.device:
    """The device of a worker that Ray gave ``gpus`` GPUs (its own GPU is ``cuda:0``)."""
    forced = forced_device()
    if forced == "cpu" or (forced is None and gpus <= 0):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise IaaError(f"this worker was given {gpus:g} GPU(s) but CUDA is not available here (torch "
                       f"{torch.__version__}); install a CUDA build of torch on the GPU nodes, or set "
                       f"{TRAIN_DEVICE_ENV}=cpu to train on the CPU")
    return torch.device("cuda", 0)


# Ray Serve kills a proxy that does not answer its ready check within 5 s (10 s for a health
# check), and starts another: on a loaded machine none ever starts. Its controller reads these
# when it starts, from the job's environment; a value set in this process wins.
SERVE_PATIENCE = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "60"}


def job_env() -> dict[str, str]:
    """Settings of this process that every worker of the job must see (passed in the runtime env),
    and Ray Serve's patience with a slow proxy (:data:`SERVE_PATIENCE`)."""
    env = {key: os.environ.get(key, value) for key, value in SERVE_PATIENCE.items()}
    if os.environ.get(TRAIN_DEVICE_ENV):
        env[TRAIN_DEVICE_ENV] = os.environ[TRAIN_DEVICE_ENV]
    return env


def wait_seconds() -> float:
    raw = os.environ.get(AUTOSCALE_WAIT_ENV, str(DEFAULT_AUTOSCALE_WAIT_S))
    try:
        return max(0.0, float(raw))
    except ValueError:
        raise IaaError(f"{AUTOSCALE_WAIT_ENV}={raw!r} is not a number of seconds") from None


def wait_for(bundles: Sequence[dict[str, float]], fits: Callable[[], bool], what: str,
             timeout_s: float | None = None) -> None:
    """Ask the autoscaler for ``bundles`` and wait until ``fits()``; :class:`IaaError` after ``timeout_s``.

    The request is withdrawn afterwards (an explicit request is a floor the autoscaler keeps until
    replaced): from then on the sweep's own pending trials tell the autoscaler what they need.
    """
    from ray.autoscaler.sdk import request_resources

    timeout_s = wait_seconds() if timeout_s is None else timeout_s
    _log.info(f"waiting up to {timeout_s:g} s for the autoscaler to add nodes for {what}")
    request_resources(bundles=[dict(b) for b in bundles])
    deadline = time.monotonic() + timeout_s
    try:
        while not fits():
            if time.monotonic() >= deadline:
                raise IaaError(f"no node for {what} joined the Ray cluster within {timeout_s:g} s; check the "
                               f"autoscaler's node types and limits (`ray status`), or raise {AUTOSCALE_WAIT_ENV}")
            time.sleep(POLL_S)
    finally:
        request_resources(bundles=[])


# --- fitting trials to the nodes ------------------------------------------------------------------


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
    _check_request(nodes, workers, gpus_per_worker)
    if threads is None or threads <= 0:
        threads = default_threads(nodes, workers, gpus_per_worker, sweep=sweep)
    _check_gpus(nodes, workers, gpus_per_worker)
    slots = _slots(nodes, threads, gpus_per_worker)
    if slots < workers:
        raise _too_few_slots(nodes, workers, threads, gpus_per_worker, slots)
    fits = _concurrent_trials(nodes, workers, threads, slots // workers, max_concurrent=max_concurrent,
                              num_trials=num_trials, queue=queue)
    now = min(slots // workers, fits)
    trial, worker = _trial_and_worker_resources(nodes, workers, threads, gpus_per_worker, sweep=sweep)
    return TrialPlan(workers=workers, threads=threads, gpus_per_worker=gpus_per_worker, max_concurrent=max(fits, 1),
                     trial_resources=trial, worker_resources=worker, fits_now=max(now, 1))


def _totals(nodes: Sequence[Node]) -> tuple[float, float]:
    """(CPUs, GPUs) of all the nodes together."""
    return sum(n.cpus for n in nodes), sum(n.gpus for n in nodes)


def _check_request(nodes: Sequence[Node], workers: int, gpus_per_worker: float) -> None:
    """:class:`ClusterError` for fewer than one worker, negative GPUs, or a cluster without nodes."""
    if workers < 1:
        raise ClusterError(f"workers per trial must be >= 1, got {workers}: ask for at least one worker")
    if gpus_per_worker < 0:
        raise ClusterError(f"`gpus_per_worker` must be >= 0, got {gpus_per_worker}: use 0 to train on CPUs")
    if not nodes:
        raise ClusterError("the Ray cluster has no alive nodes; check that its head node runs (`ray status`)")


def _check_gpus(nodes: Sequence[Node], workers: int, gpus_per_worker: float) -> None:
    """:class:`ClusterError` for GPUs the cluster lacks, or GPU shares a worker or NCCL cannot use."""
    if gpus_per_worker > 0 and _totals(nodes)[1] == 0:
        raise ClusterError(f"`gpus_per_worker` {gpus_per_worker} asks for GPUs, but the cluster has none; use "
                           "`gpus_per_worker` 0 to train on CPUs, or `address` a cluster with GPU nodes")
    if gpus_per_worker > 1 and gpus_per_worker != int(gpus_per_worker):
        raise ClusterError(f"`gpus_per_worker` above 1 must be a whole number, got {gpus_per_worker}: a worker "
                           "shares one GPU (below 1) or holds whole GPUs")
    if workers > 1 and 0 < gpus_per_worker < 1:
        raise ClusterError(f"`gpus_per_worker` {gpus_per_worker:g} with {workers} workers per trial: NCCL cannot "
                           "put two ranks of one run on a GPU; use `gpus_per_worker` 1, or one worker per trial "
                           "(`workers_per_trial` 1) to share GPUs between trials")


def _too_few_slots(nodes: Sequence[Node], workers: int, threads: int, gpus_per_worker: float,
                   slots: int) -> ClusterError:
    """The error for a trial of ``workers`` workers on a cluster that holds only ``slots`` of them."""
    total_cpus, total_gpus = _totals(nodes)
    need = f"{workers} worker(s) x {threads} CPU" + (f" x {gpus_per_worker:g} GPU" if gpus_per_worker else "")
    biggest = max(n.cpus for n in nodes)
    hint = (f"no node has {threads} CPUs (the largest has {biggest:g}); lower train.threads"
            if threads > biggest else f"use at most {slots} worker(s) per trial or fewer threads (train.threads)")
    return ClusterError(f"a trial needs {need}, but the cluster ({total_cpus:g} CPUs, {total_gpus:g} GPUs on "
                        f"{len(nodes)} node(s)) fits only {slots} such worker(s): {hint}")


def _concurrent_trials(nodes: Sequence[Node], workers: int, threads: int, fits: int, *,
                       max_concurrent: int | None, num_trials: int | None, queue: bool) -> int:
    """Trials to run at once, from the ``fits`` whole trials the nodes hold, the user's cap and the trial count.

    A cap above ``fits`` is a :class:`ClusterError` unless ``queue`` (the cluster may grow).
    """
    if queue and not (max_concurrent and max_concurrent > 0):
        max_concurrent = max(fits, num_trials or 0)
    if max_concurrent is not None and max_concurrent > 0:
        if max_concurrent > fits and not queue:
            total_cpus, total_gpus = _totals(nodes)
            raise ClusterError(f"`max_concurrent` {max_concurrent}: only {fits} trial(s) of {workers} worker(s) x "
                               f"{threads} CPU fit this cluster ({total_cpus:g} CPUs, {total_gpus:g} GPUs); "
                               f"more would wait for each other's CPUs and stall")
        fits = max_concurrent
    if num_trials is not None and num_trials > 0:
        fits = min(fits, num_trials)
    return fits


def _trial_and_worker_resources(nodes: Sequence[Node], workers: int, threads: int, gpus_per_worker: float, *,
                                sweep: bool) -> tuple[dict[str, float], dict[str, float]]:
    """(Tune's per-trial resources, Ray Train's per-worker resources; empty when the trial trains in its actor).

    A trial in its actor holds its worker's ``threads`` CPUs and GPUs; otherwise a sweep's trial driver
    holds :data:`DRIVER_CPU` and each worker the rest of its ``threads``.
    """
    in_actor = sweep and workers == 1
    driver_cpu = DRIVER_CPU if sweep and not in_actor else 0.0
    gpu_res = {"gpu": gpus_per_worker} if gpus_per_worker else {}
    if in_actor:
        return {"cpu": float(threads), **gpu_res}, {}
    trial = {"cpu": driver_cpu} if sweep else {}
    if sweep and any(n.driver > 0 for n in nodes):
        trial[DRIVER_RESOURCE] = DRIVER_CPU
    worker = {"CPU": round(threads - driver_cpu, 4), **({"GPU": gpus_per_worker} if gpus_per_worker else {})}
    return trial, worker


def node_summary(nodes: Sequence[Mapping[str, Any]]) -> tuple[Node, ...]:
    """Nodes from ``ray.nodes()``-shaped dicts (for tests and tools)."""
    return tuple(Node(n.get("NodeManagerAddress", "?"), float(n.get("Resources", {}).get("CPU", 0)),
                      float(n.get("Resources", {}).get("GPU", 0)), float(n.get("Resources", {}).get(DRIVER_RESOURCE, 0)))
                 for n in nodes if n.get("Alive", True))
