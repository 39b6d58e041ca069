"""Paths in records: a work folder means the same after it is copied or moved.

The records iaa keeps in a work folder (``sweeps/NAME/sweep.json``, ``ensembles/NAME/ensemble.json``,
an ensemble's ``trained.json``) store a path inside the work folder relative to the work folder
(``sweeps/NAME/checkpoints/...``; a SQLite store as ``sqlite:///mlflow.db``) and any other path
as it was given (absolute, or a URI such as ``s3://...``). A reader finds each path against the
work folder the record is in now, so a copy of the folder reads its own files and never its
original's.

Records written before paths were stored relative hold absolute paths. Such a path is used as it
is while it exists; once it does not (the folder moved), its part from the first of the work
folder's own names (:data:`ANCHORS`) on is looked for under the record's work folder.
"""

from __future__ import annotations

import os
from pathlib import Path

SQLITE = "sqlite:///"
ANCHORS = frozenset({"data", "runs", "sweeps", "ensembles", "evaluations", "distill", "ray", "mlartifacts",
                     "mlflow.db", "optuna.db"})   # what a work folder holds at its top level


def workdir_of(record_folder: Path, kind: str) -> Path | None:
    """The work folder of a record kept in ``WORKDIR/KIND/NAME/`` (``kind``: sweeps | ensembles);
    None when the folder is not in such a place (its paths are then kept absolute)."""
    folder = Path(record_folder)
    return folder.parent.parent if folder.parent.name == kind else None


def stored(text: str | os.PathLike[str] | None, workdir: Path | None) -> str | None:
    """``text`` (a path from the current folder, or a URI) as a record keeps it: relative to
    ``workdir`` when it names a place inside it, else absolute; a URI other than SQLite's unchanged.
    A SQLite URI keeps its scheme (``sqlite:///mlflow.db``)."""
    if not text or workdir is None:
        return None if text is None else str(text)
    text = str(text)
    if text.startswith(SQLITE):
        return SQLITE + (stored(text[len(SQLITE):], workdir) or "")
    if "://" in text:
        return text
    path = Path(text).resolve()                  # a relative path names a place from the current folder
    try:
        return path.relative_to(Path(workdir).resolve()).as_posix()
    except ValueError:
        return str(path)


def located(text: str | None, workdir: Path | None, *also: Path) -> str | None:
    """The place ``text`` of a record names now: a relative path under ``workdir`` (else under the
    first folder of ``also`` that holds it); an absolute path that no longer exists, at its part
    from a work folder's own name on under ``workdir`` where that exists; anything else unchanged."""
    if not text:
        return text
    if text.startswith(SQLITE):
        return SQLITE + (located(text[len(SQLITE):], workdir, *also) or "")
    if "://" in text:
        return text
    path = Path(text)
    if not path.is_absolute():
        bases = [b for b in (workdir, *also) if b is not None]
        found = next((base / path for base in bases if (base / path).exists()), None)
        chosen = found if found is not None else (bases[0] / path if bases else path)
        return os.path.normpath(Path(chosen).absolute())
    if path.exists() or workdir is None:
        return text
    parts = path.parts
    for i, part in enumerate(parts[1:], 1):
        if part in ANCHORS and (Path(workdir) / Path(*parts[i:])).exists():
            return os.path.normpath((Path(workdir) / Path(*parts[i:])).absolute())
    return text
