"""A file that one process at a time holds: an exclusive ``fcntl`` lock for as long as the holder
runs (the kernel drops it when the process dies, so a killed holder leaves no stale lock), with
the holder's pid written into the file for the message another process gets.

:func:`held` holds one for a block: a run folder's (:mod:`~iaa.jobs.workdir.rundir`), or
:func:`beside` a sweep's or an ensemble's folder, held before the folder is made; :func:`holder`
tells who holds one now without waiting.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Callable, Iterator

from iaa.errors import IaaError
from iaa.files import writing


def beside(folder: Path) -> Path:
    """The lock file of the job whose folder is ``folder``: ``.NAME.lock`` next to it, so that a
    start holds it before the folder exists, and a resume holds the same one."""
    return folder.parent / f".{folder.name}.lock"


def open_lock(path: Path) -> int:
    """The lock file ``path`` opened for holding, made (with its folder) when missing; OSError as met."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


def take(fd: int) -> bool:
    """Hold the lock of ``fd`` without waiting: False when another process holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            raise
        return False
    return True


def pid_in(fd: int) -> str:
    """The pid its holder wrote into the lock file, or ``unknown``."""
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    except OSError:
        return "unknown"


def write_pid(fd: int, folder: Path) -> None:
    """This process's pid into the held lock file (a full or read-only disk: one message naming ``folder``)."""
    with writing(folder):
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())


@contextlib.contextmanager
def held(path: Path, busy: Callable[[str], IaaError]) -> Iterator[None]:
    """Hold the lock file ``path`` while the block runs; ``busy(pid)`` is raised when another
    process holds it."""
    try:
        fd = open_lock(path)
    except OSError as err:
        raise IaaError(f"{path}: cannot make the lock file ({err.strerror}); give a writable `workdir`") from None
    try:
        if not take(fd):
            raise busy(pid_in(fd))
        write_pid(fd, path.parent)
        yield
    finally:
        os.close(fd)                      # releases the lock


def holder(path: Path) -> str | None:
    """The pid of the process that holds the lock file ``path`` now (``unknown`` when it wrote
    none); None when nobody does or there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        if take(fd):
            return None                   # free: closing the file below lets it go at once
        return pid_in(fd)
    finally:
        os.close(fd)
