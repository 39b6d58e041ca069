"""Small file-system helpers shared by every layer: atomic writes, writable folders, remote-URI detection,
and one-line errors for a disk that cannot take a write."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import traceback
import uuid
from pathlib import Path
from typing import Callable, Iterator

from iaa.errors import IaaError

# errnos of a disk or folder that cannot take a write: an expected failure, not a bug
UNWRITABLE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG,
                        errno.ENOTDIR, errno.EISDIR, errno.ENAMETOOLONG})
DISK_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})
FULL_TEXTS = ("No space left", "Disk quota exceeded", "database or disk is full")
TORCH_SHORT_WRITE = ("unexpected pos", "file write failed")    # torch's zip writer after a failed write
REMOTE_SCHEMES = ("s3://", "gs://", "gcs://", "abfs://", "abfss://", "az://", "hdfs://", "viewfs://")


def is_remote_uri(path: object) -> bool:
    """True for a cloud or HDFS URI (``s3://...``); False for local paths and ``file://`` URIs."""
    return str(path).startswith(REMOTE_SCHEMES) if path else False


def spellings(path: str | os.PathLike[str]) -> list[str]:
    """The ways a tag may have recorded ``path``: as given, absolute, resolved, and relative to the
    working folder (a run started as ``iaa-work/runs/x`` and resumed by its absolute path)."""
    given = Path(path)
    forms = [str(given), str(given.absolute()), str(given.resolve())]
    with contextlib.suppress(ValueError, OSError):     # another drive; a working folder removed
        forms.append(os.path.relpath(given.resolve()))
    return list(dict.fromkeys(forms))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], needs: int | None = None,
                shown_as: str | os.PathLike[str] | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path`` in one rename.

    A reader never sees a half-written file, and a failed write leaves the old file untouched and
    no temporary file behind. ``needs``: the bytes the file will take, when known, for the message
    of a full disk; ``shown_as``: the file that messages name (default ``path``).
    """
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name, not mkstemp: the writer creates the file, so it gets the usual mode (umask), not 0600
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    with writing(shown_as or path, needs):      # around the clean-up: the free space is told without tmp
        try:
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
    data = text.encode("utf-8")
    with atomic_path(path, needs=len(data)) as tmp:
        tmp.write_bytes(data)
    return Path(path)


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


class DiskFullError(UnwritableError):
    """A write met a full disk or a full quota (ENOSPC, EDQUOT)."""


@contextlib.contextmanager
def writing(path: str | os.PathLike[str], needs: int | None = None) -> Iterator[None]:
    """Turn a full disk, a read-only folder or a missing permission into one UnwritableError naming the file
    (a :class:`DiskFullError` with the free space, and ``needs`` bytes when known, for a full disk).

    torch's writer reports a full disk as a RuntimeError (``unexpected pos``, ``file write failed``),
    which is turned too.
    """
    try:
        yield
    except (OSError, RuntimeError) as err:
        if disk_full(err):
            _release(err)
            raise DiskFullError(disk_full_message(path, needs)) from None
        if not isinstance(err, OSError) or (err.errno not in UNWRITABLE and not _looks_unwritable(err)):
            raise
        raise UnwritableError(unwritable_message(err, path)) from None


def disk_full(err: BaseException | None) -> bool:
    """Whether ``err``, or an error it was raised from or while handling, says that a disk or a
    quota is full: errno ENOSPC or EDQUOT, a library's text of them (SQLite's "database or disk is
    full"), or torch's short write of a zip file."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in DISK_FULL:
            return True
        if any(text in str(err) for text in FULL_TEXTS):
            return True
        if isinstance(err, RuntimeError) and any(text in str(err) for text in TORCH_SHORT_WRITE):
            return True
        err = err.__cause__ or err.__context__
    return False


def _release(err: BaseException | None) -> None:
    """Clear the frames of ``err``'s chain: a writer that failed (torch's zip writer) closes its file
    there, so that the free space told is what the disk has once the partial file is gone."""
    while err is not None:
        traceback.clear_frames(err.__traceback__)
        err = err.__cause__ or err.__context__


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes (for this user) on the file system of ``path`` or of its nearest existing folder."""
    for folder in (Path(path), *Path(path).parents):
        with contextlib.suppress(OSError):
            if folder.exists():
                return shutil.disk_usage(folder).free
    return None


def size_text(n: int) -> str:
    """``n`` bytes in MiB, or in KiB below one MiB."""
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{max(1, round(n / 1024))} KiB" if n else "0 KiB"


def disk_full_message(path: str | os.PathLike[str], needs: int | None = None) -> str:
    """``no space left on device writing PATH (N free; it needs about M); what to do``."""
    free = free_bytes(path)
    space = [f"{size_text(free)} free"] if free is not None else []
    if needs:
        space.append(f"{Path(path).name} needs about {size_text(needs)}")
    told = f" ({'; '.join(space)})" if space else ""
    return (f"no space left on device writing {path}{told}; free some space or choose another output "
            "(nothing was replaced)")


def unwritable_message(err: OSError, path: str | os.PathLike[str]) -> str:
    """``FILE: cannot write it (reason); what to do`` for an OSError met while writing ``path``."""
    if disk_full(err):
        return disk_full_message(path)
    reason = err.strerror or str(err).strip().splitlines()[0]
    return f"{path}: cannot write it ({reason}); choose a writable output (nothing was replaced)"


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
