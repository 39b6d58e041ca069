"""Small file-system helpers shared by every layer: atomic writes, writable folders, remote-URI detection,
and one-line errors for a disk that cannot take a write."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Iterator

from iaa.errors import IaaError

# errnos of a disk or folder that cannot take a write: an expected failure, not a bug
UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
                        errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG})
REMOTE_SCHEMES = ("s3://", "gs://", "gcs://", "abfs://", "abfss://", "az://", "hdfs://", "viewfs://")


def is_remote_uri(path: object) -> bool:
    """True for a cloud or HDFS URI (``s3://...``); False for local paths and ``file://`` URIs."""
    return str(path).startswith(REMOTE_SCHEMES) if path else False


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    A reader never sees a half-written file, and a failed write leaves the old file untouched.
    """
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name, not mkstemp: the writer creates the file, so it gets the usual mode (umask), not 0600
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with writing(path):
            yield Path(tmp)
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Call ``write(tmp_path)`` and move the result to ``path`` atomically; returns ``path``."""
    with atomic_path(path) as tmp:
        write(tmp)
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def ensure_writable(folder: str | os.PathLike[str], what: str, todo: str) -> Path:
    """``folder``, created if needed; IaaError saying ``what`` it is and ``todo`` when it cannot be written."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise IaaError(f"{folder}: {what} is not writable ({err.strerror}); {todo}") from None
    return folder


class UnwritableError(IaaError):
    """A full disk, a read-only folder or a missing permission stopped a write."""


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a full disk, a read-only folder or a missing permission into one UnwritableError naming the file."""
    try:
        yield
    except OSError as err:
        if err.errno not in UNWRITABLE and not _looks_unwritable(err):
            raise
        raise UnwritableError(unwritable_message(err, path)) from None


def unwritable_message(err: OSError, path: str | os.PathLike[str]) -> str:
    """``FILE: cannot write it (reason); what to do`` for an OSError met while writing ``path``."""
    reason = err.strerror or str(err).strip().splitlines()[0]
    return (f"{path}: cannot write it ({reason}); free some space or choose a writable output "
            "(nothing was replaced)")


def _looks_unwritable(err: OSError) -> bool:
    """pyarrow's and torch's write errors carry no errno, only the C library's text."""
    text = str(err)
    return any(s in text for s in ("No space left", "Read-only file system", "Permission denied",
                                   "Disk quota exceeded", "File too large"))


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user's counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


def remove_dead_leftovers(folder: str | os.PathLike[str], pattern: str) -> list[Path]:
    """Delete the entries of ``folder`` whose whole name matches ``pattern`` (a regex with a group
    ``pid``) and whose process no longer runs: what a killed run left half-written. An entry of a
    live process, or of a name that does not match, is never touched. Returns what was removed."""
    removed = []
    try:
        entries = list(Path(folder).iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = re.fullmatch(pattern, entry.name)
        if match is None or pid_alive(int(match["pid"])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed
