"""A SQLite MLflow store that moved with its work folder: its artifact locations follow it.

MLflow keeps an absolute artifact location per experiment, and per run, logged model and model
version (each derived from its experiment's when it was made). iaa makes every experiment of a
SQLite store with its artifacts beside the database (``DB_FOLDER/mlartifacts``,
:func:`iaa.platform.tracking.connection.artifact_location`). When the database is opened in another
folder than the one its locations name (the work folder was copied or moved), every location
under the old ``.../mlartifacts`` is rewritten to the new one, in the database being opened, so
that nothing is read from or written to the old place. Locations elsewhere (another artifact
store, MLflow's own default experiment) are left as they are.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path

_log = logging.getLogger(__name__)

ARTIFACTS = "mlartifacts"     # the folder of a SQLite store's artifacts, beside the database
# (table, column, extra condition): every place MLflow 3 keeps an artifact location
LOCATIONS = (("experiments", "artifact_location", ""), ("runs", "artifact_uri", ""),
             ("logged_models", "artifact_location", ""), ("model_versions", "storage_location", ""),
             ("model_versions", "source", ""), ("trace_tags", "value", " AND key = 'mlflow.artifactLocation'"))


def artifact_root(db: Path) -> str:
    """The artifact root of the SQLite store ``db``: ``file:///DB_FOLDER/mlartifacts``."""
    return (Path(db).resolve().parent / ARTIFACTS).as_uri()


def old_roots(con: sqlite3.Connection, root: str) -> list[str]:
    """The experiments' artifact roots that are a SQLite store's ``mlartifacts`` but not ``root``."""
    found = {loc.rstrip("/") for (loc,) in con.execute("SELECT DISTINCT artifact_location FROM experiments") if loc}
    return sorted(loc for loc in found if loc.startswith("file:") and loc.rsplit("/", 1)[-1] == ARTIFACTS
                  and loc != root)


def relocate(db: Path) -> list[str]:
    """Rewrite the artifact locations of ``db`` that name another folder's ``mlartifacts`` to its own;
    returns the old roots (none when the store has not moved). Says so on stderr when it rewrote."""
    root = artifact_root(db)
    with contextlib.closing(sqlite3.connect(str(db), timeout=30)) as con:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'experiments'").fetchone():
            return []
        moved = old_roots(con, root)
        if not moved:
            return []
        with con:                                           # one transaction: all or nothing
            for old in moved:
                for table, column, extra in LOCATIONS:
                    if column in _columns(con, table):
                        con.execute(f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                                    f"WHERE ({column} = ? OR substr({column}, 1, ?) = ?){extra}",
                                    (root, len(old) + 1, old, len(old) + 1, old + "/"))
    _log.info(f"MLflow store {db}: its artifacts were at {', '.join(moved)}; the store was moved or copied with its "
              f"work folder, so they are now found at {root}")
    return moved


def _columns(con: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in con.execute(f"PRAGMA table_info({table})")}
