"""What the cluster publishes to every driver, kept off the command's console.

When a node dies, its agents publish the last 20 lines of its raylet's log (``Raylet is
terminated ... [state-dump] ...``) and the GCS a "marked dead" notice to every driver, and Ray
prints them on the driver's stdout from a thread of its own, whether ``log_to_driver`` is on or
not (Ray has no option to turn it off). :func:`cluster_lines_to` sends what that thread writes to
a log file instead (a sweep's ``tune.log``, a ``train --workers`` run's ``ray-driver.log``);
everything else written to stdout and stderr passes as before, and what Ray held back as repeats
of those lines goes there too, not to stdout when Ray shuts down. The console says the node's
loss in a line of its own (:meth:`iaa.jobs.sweeps.console.SweepConsole.node_lost`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

from iaa.platform.cluster.ray_internals import ERROR_LISTENER_THREAD, drain_held_lines


class RoutedStream:
    """``stream``, except for what Ray's error-listener thread writes: that goes to the file of
    ``sink`` (a ``logging.FileHandler``, under its lock; None: nowhere)."""

    def __init__(self, stream: Any, sink: logging.FileHandler | None) -> None:
        self._stream, self._sink = stream, sink

    @staticmethod
    def _diverted() -> bool:
        return threading.current_thread().name == ERROR_LISTENER_THREAD

    def write(self, text: str) -> int:
        if not self._diverted():
            return self._stream.write(text)
        if self._sink is not None:
            with self._sink.lock or contextlib.nullcontext():
                self._sink.stream.write(text)
                self._sink.stream.flush()
        return len(text)

    def flush(self) -> None:
        if not self._diverted():
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def off_the_console() -> None:
    """From now on in this process, what Ray's listener thread prints reaches neither stdout nor
    stderr, also outside the blocks that send it to a file (:func:`cluster_lines_to`): a node lost
    while a command ends (logging its models, printing its ``--json``) leaves the command's
    output as it is. Ray's session logs keep the lines. What Ray held back as repeats of them is
    dropped at exit, before Ray's own exit hook (run after this one) would print it on stdout."""
    if not isinstance(sys.stdout, RoutedStream) and not isinstance(sys.stderr, RoutedStream):
        atexit.register(drain_held_lines, None)
    if not isinstance(sys.stdout, RoutedStream):
        sys.stdout = RoutedStream(sys.stdout, None)
    if not isinstance(sys.stderr, RoutedStream):
        sys.stderr = RoutedStream(sys.stderr, None)


@contextlib.contextmanager
def cluster_lines_to(sink: logging.FileHandler | Path | None) -> Iterator[None]:
    """While the block runs, the lines Ray prints for the cluster go to ``sink`` (a handler, or a
    file opened for appending; None: dropped)."""
    handler = logging.FileHandler(sink, encoding="utf-8") if isinstance(sink, Path) else sink
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = RoutedStream(streams[0], handler), RoutedStream(streams[1], handler)
    try:
        yield
    finally:
        if handler is not None:
            with handler.lock or contextlib.nullcontext():
                drain_held_lines(handler.stream)
        sys.stdout, sys.stderr = streams
        if isinstance(sink, Path) and handler is not None:
            handler.close()
