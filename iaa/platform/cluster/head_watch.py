"""A lost head node, said and acted on before Ray ends the process its own way.

When the head node of the cluster a driver joined dies (its GCS with it), the driver waits 60 s in
silence, then Ray's core worker ends the process with a C++ line ("Failed to connect to GCS within
60 seconds ... The program will terminate"): no run is marked, no trial is told, and no line says
how to continue. Where the program asks for it (:func:`stop_on_loss`; ``iaa-cli`` does), a thread
checks every :data:`CHECK_EVERY_S` that the head's GCS port still takes a connection. After
:data:`LOST_AFTER_S` without one it says so in one line and stops the command as a SIGTERM does
(:mod:`iaa.jobs.interrupt`: its runs end KILLED, its trials FAIL, and it says what was kept and
the exact command that resumes), with a second SIGTERM :data:`FORCE_AFTER_S` later where the
first did not end it (a main thread waiting on the dead head). A library that did not ask, or a
command whose stop is not armed (one already on its way out with an error of its own), is sent no
signal: the lost head is only said.

Standard library only: the command line turns it on before Ray is imported.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time

_log = logging.getLogger(__name__)

CHECK_EVERY_S = 2.0
LOST_AFTER_S = 15.0        # Ray's driver gives up on its GCS after 60 s
FORCE_AFTER_S = 10.0

_stop_on_loss = False
_watch: _HeadWatch | None = None


def stop_on_loss() -> None:
    """From now on, a lost head node stops this process's command (see the module)."""
    global _stop_on_loss
    _stop_on_loss = True


def watch(gcs_address: str) -> None:
    """Watch the head whose GCS listens at ``gcs_address`` (``host:port``), instead of any
    watched before."""
    global _watch
    unwatch()
    host, sep, port = gcs_address.rpartition(":")
    if sep and port.isdigit():
        _watch = _HeadWatch(host.strip("[]"), int(port), stop=_stop_on_loss)
        _watch.start()


def unwatch() -> None:
    """Stop watching (this driver leaves the cluster)."""
    global _watch
    if _watch is not None:
        _watch.done.set()
        _watch = None


def answers(host: str, port: int, timeout_s: float) -> bool:
    """Whether something takes a TCP connection at ``host:port`` within ``timeout_s``."""
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


class _HeadWatch(threading.Thread):
    def __init__(self, host: str, port: int, stop: bool) -> None:
        super().__init__(name="iaa-head-watch", daemon=True)
        self.host, self.port, self.stop = host, port, stop
        self.done = threading.Event()

    def run(self) -> None:
        answered = time.monotonic()
        while not self.done.wait(CHECK_EVERY_S):
            if answers(self.host, self.port, CHECK_EVERY_S):
                answered = time.monotonic()
                continue
            if time.monotonic() - answered < LOST_AFTER_S or self.done.is_set():
                continue
            lost = (f"the Ray cluster's head node ({self.host}:{self.port}) has not answered for "
                    f"{LOST_AFTER_S:g} s: it is lost")
            if not (self.stop and callable(signal.getsignal(signal.SIGTERM))):   # no stop armed: a SIGTERM
                # would end the process unsaid (a command already on its way out with an error)
                _log.warning(f"{lost}, and Ray ends this process within a minute")
                return
            _log.warning(f"{lost}; stopping, so that the work can be resumed once the cluster runs again")
            os.kill(os.getpid(), signal.SIGTERM)
            if not self.done.wait(FORCE_AFTER_S):
                os.kill(os.getpid(), signal.SIGTERM)
            return
