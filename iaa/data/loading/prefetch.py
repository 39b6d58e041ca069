"""Batches prepared ahead in a background thread, so that a GPU never waits for the host.

The training thread hands the GPU a step's kernels and goes on at once (nothing in a step reads
back from the device). Meanwhile the loader cuts and pads the next batches in numpy: that work
runs here, in a thread, ``depth`` batches ahead, and on CUDA each batch is copied to page-locked
memory so that its copy to the device is asynchronous (``non_blocking``) and overlaps the step
before it. numpy and torch release the GIL in their loops, so the thread overlaps the training
thread's own Python too.
"""

from __future__ import annotations

import queue
import threading
from typing import Iterable, Iterator

import torch

from iaa.data.loading.batch import Batch

_DONE = object()


def prefetch(batches: Iterable[Batch], device: torch.device | str, depth: int = 2) -> Iterator[Batch]:
    """``batches`` on ``device``, produced up to ``depth`` ahead by a background thread.

    The order is unchanged. An error in the source is raised here, at the batch where it
    happened. Closing the generator (or leaving a ``for`` loop early and dropping it) stops the
    thread. ``depth`` 0 moves each batch in this thread, with nothing ahead.
    """
    device = torch.device(device)
    pin = device.type == "cuda"
    if depth <= 0:
        for batch in batches:
            yield batch.to(device)
        return
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in batches:
                if not put(batch.pin_memory() if pin else batch):
                    return
            put(_DONE)
        except BaseException as err:  # noqa: BLE001 - handed to the consumer, raised there
            put(err)

    thread = threading.Thread(target=produce, name="iaa-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item = ready.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item.to(device, non_blocking=pin)
    finally:
        stop.set()
        thread.join(timeout=5)
