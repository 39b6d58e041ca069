"""Which process owns a run: a token of host, pid and process start time.

A run still marked running whose owner is gone was killed (kill -9, a lost machine) and never
closed. The start time tells a pid that the system reused apart from the process that had it.
"""

from __future__ import annotations

import os
import socket

import psutil


def _process_start(pid: int) -> str:
    """The start time of process ``pid`` in clock ticks since boot ('' where it cannot be read), as
    Linux's ``/proc/PID/stat`` gives it (and tokens written before psutil carry). Both epoch times
    move with the system clock, so their difference, unlike either, never changes."""
    try:
        since_boot = psutil.Process(pid).create_time() - psutil.boot_time()
        return str(round(since_boot * os.sysconf("SC_CLK_TCK")))
    except (psutil.Error, OSError, ValueError, AttributeError):      # gone; no clock ticks (Windows)
        return ""


def owner() -> str:
    """This process: ``host:pid:start`` (the start time tells a reused pid apart)."""
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def owner_alive(token: str) -> bool:
    """Whether the process of ``token`` still runs; a process on another host counts as alive."""
    host, _, rest = token.partition(":")
    pid, _, start = rest.partition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not start or _process_start(int(pid)) == start
