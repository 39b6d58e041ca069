"""A run folder belongs to one run at a time, and a finished run is never replaced by accident.

``claim`` holds ``RUN_DIR/.lock`` (:mod:`~iaa.jobs.workdir.lock`) for as long as the run lasts. A
folder that already holds a run (checkpoints or metrics) is only reused with ``resume`` (continue
it) or ``overwrite`` (start afresh, replacing it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

from iaa.errors import IaaError
from iaa.files import writing
from iaa.jobs.workdir import lock
from iaa.jobs.workdir.paths import RunFolder

LOCK = ".lock"


class RunDirError(IaaError):
    """The run folder is in use, or holds a run that the command would replace."""


@contextlib.contextmanager
def claim(run_dir: Path, *, resume: bool = False, overwrite: bool = False) -> Iterator[Path]:
    """Hold ``run_dir`` for one run; raises RunDirError when another run holds it or it would be
    replaced, and with ``resume`` when it holds no run to continue (no checkpoint).

    A run that fails leaves no ``.lock`` and no empty ``checkpoints/`` (which would make the
    folder look like a started run); a folder this call created is removed when it holds no
    checkpoint.
    """
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise RunDirError("give `resume` (continue the run) or `overwrite` (replace it), not both")
    if resume and not RunFolder(run_dir).resumable():
        raise RunDirError(f"{run_dir}: nothing to resume: {_not_resumable(run_dir)}; "
                          "give the folder of the run to continue, or leave out `resume` to start a run")
    created = not run_dir.exists()
    fd = _open_lock(run_dir)
    try:
        if not lock.take(fd):
            raise RunDirError(f"{run_dir} is in use by another run (pid {lock.pid_in(fd)}); wait for it to end, "
                              "or give another `run_dir`")
        _check_free(run_dir, resume or overwrite)
        try:
            lock.write_pid(fd, run_dir)
            with writing(run_dir):      # a full or read-only disk met by the run: one message naming its folder
                yield run_dir
        except Exception:
            _tidy(run_dir, created)     # while the lock is held
            raise
    finally:
        os.close(fd)  # releases the lock


def _not_resumable(run_dir: Path) -> str:
    """Why ``run_dir`` holds no run to resume."""
    if not run_dir.exists():
        return "the folder does not exist"
    if not run_dir.is_dir():
        return "it is not a folder"
    folder = RunFolder(run_dir)
    if folder.metrics.is_file():
        return (f"it holds {folder.metrics.name} but no checkpoint ({folder.checkpoints.name}/ has neither "
                f"{folder.last.name} nor {folder.best.name}); `overwrite` starts it afresh")
    return f"it holds no checkpoint ({folder.checkpoints.name}/{folder.last.name} or {folder.best.name})"


def _check_free(run_dir: Path, reuse: bool) -> None:
    if RunFolder(run_dir).holds_run() and not reuse:
        held = ", ".join(n for n in RunFolder.RUN_FILES if (run_dir / n).exists())
        raise RunDirError(f"{run_dir} already holds a run ({held}); "
                          "add `resume` to continue it, `overwrite` to replace it, or give another `run_dir`")


def _tidy(run_dir: Path, created: bool) -> None:
    """After a failed run: remove the lock file, a ``checkpoints/`` without a checkpoint, and the
    folder itself when this run created it and kept no checkpoint to resume from."""
    folder = RunFolder(run_dir)
    complete = folder.resumable()
    if not complete and folder.checkpoints.is_dir() and not folder.metrics.exists():
        shutil.rmtree(folder.checkpoints, ignore_errors=True)
    (run_dir / LOCK).unlink(missing_ok=True)
    if created and not complete:
        shutil.rmtree(run_dir, ignore_errors=True)


def _open_lock(run_dir: Path) -> int:
    try:
        return lock.open_lock(run_dir / LOCK)
    except OSError as err:
        raise RunDirError(f"{run_dir}: cannot use it as a run folder ({err.strerror}); "
                          "give a writable `run_dir` or `workdir`") from None
