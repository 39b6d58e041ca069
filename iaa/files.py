"""Small file-system helpers shared by every layer: atomic writes, writable folders, remote-URI detection."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Callable, Iterator

from iaa.errors import IaaError

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
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name, not mkstemp: the writer creates the file, so it gets the usual mode (umask), not 0600
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
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
