"""A run folder belongs to one run at a time, and a finished run is never replaced by accident.

``claim`` takes an exclusive ``fcntl`` lock on ``RUN_DIR/.lock`` for as long as the run lasts
(the kernel drops it when the process dies, so a killed run leaves no stale lock) and writes the
holder's pid into the file for the message a second run gets. A folder that already holds a run
(checkpoints or metrics) is only reused with ``resume`` (continue it) or ``overwrite`` (start
afresh, replacing it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from pathlib import Path
from typing import Iterator

from iaa.errors import IaaError
from iaa.files import writing
from iaa.jobs.workdir.paths import RunFolder

LOCK = ".lock"


class RunDirError(IaaError):
    """The run folder is in use, or holds a run that the command would replace."""


@contextlib.contextmanager
def claim(run_dir: Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[Path]:
    """Hold ``run_dir`` for one run; raises RunDirError when another run holds it or it would be replaced."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirError("give --resume (continue the run) or --overwrite (replace it), not both")
    fd = _open_lock(run_dir)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise
            raise RunDirError(f"{run_dir} is in use by another run (pid {_holder(fd)}); wait for it to end, "
                              "or give another --run-dir") from None
        if RunFolder(run_dir).holds_run() and not (resume or overwrite):
            held = ", ".join(n for n in RunFolder.RUN_FILES if (run_dir / n).exists())
            raise RunDirError(f"{run_dir} already holds a run ({held}); "
                              "add --resume to continue it, --overwrite to replace it, or give another --run-dir")
        with writing(run_dir):
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        with writing(run_dir):      # a full or read-only disk met by the run: one message naming its folder
            yield run_dir
    finally:
        os.close(fd)  # releases the lock


def _open_lock(run_dir: Path) -> int:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        return os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        raise RunDirError(f"{run_dir}: cannot use it as a run folder ({err.strerror}); "
                          "give a writable --run-dir or --workdir") from None


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    except OSError:
        return "unknown"
