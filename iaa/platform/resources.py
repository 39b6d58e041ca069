"""What a trial trains on, and waiting for an autoscaling cluster to grow.

- :func:`train_device` is the one place that turns the GPUs Ray assigned to a worker into a torch
  device. Ray sets ``CUDA_VISIBLE_DEVICES`` to the assigned GPUs, so ``cuda:0`` inside a trial
  actor is its own GPU; Train workers use ``ray.train.torch.get_device()``. ``IAA_TRAIN_DEVICE=cpu``
  forces the CPU whatever Ray assigned (a cluster with fake GPU resources in tests, debugging).
- :func:`wait_for` asks the autoscaler for the bundles one trial needs
  (``ray.autoscaler.sdk.request_resources``) and waits until the cluster holds them, so a sweep
  submitted to a cluster whose GPU nodes have not started yet waits instead of failing.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Callable, Sequence

import torch

from iaa.errors import IaaError

TRAIN_DEVICE_ENV = "IAA_TRAIN_DEVICE"          # cpu: train on the CPU even on GPU workers
AUTOSCALE_WAIT_ENV = "IAA_AUTOSCALE_WAIT_S"    # how long to wait for the first node that fits a trial
DEFAULT_AUTOSCALE_WAIT_S = 900.0
POLL_S = 2.0


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


def job_env() -> dict[str, str]:
    """Settings of this process that every worker of the job must see (passed in the runtime env)."""
    return {TRAIN_DEVICE_ENV: os.environ[TRAIN_DEVICE_ENV]} if os.environ.get(TRAIN_DEVICE_ENV) else {}


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
    print(f"waiting up to {timeout_s:g} s for the autoscaler to add nodes for {what}", file=sys.stderr)
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
