"""Opening and checking an MLflow tracking store: the checks at start, the SQLite file's creation
under a lock, the client of a store, experiments, and the runs left running by killed processes.

The default store is embedded: a SQLite file under the work directory. ```tracking_uri``` or
``MLFLOW_TRACKING_URI`` selects a server instead (required on multi-node clusters, whose
workers cannot reach a SQLite file on the head node's disk).

- **At start** (:func:`open_store`) the store is checked within ``IAA_SERVICE_TIMEOUT_S``
  seconds (default 5): an unreachable server, a server whose API fails, a damaged SQLite file, a
  SQLite path in no writable folder, a SQLite database of something else, a file-store folder
  (MLflow 3 keeps that store in maintenance mode) or an unknown scheme is an :class:`IaaError`
  naming the URI. MLflow's own HTTP retries are shortened (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
  ``MLFLOW_HTTP_REQUEST_TIMEOUT``, ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``; values set in the
  environment win), so that a server lost later costs seconds, not minutes.
- **Owners**: every run carries the ``iaa.owner`` tag (host, pid, process start). A later start
  on the same host marks ``KILLED`` the runs still ``RUNNING`` whose process is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import mlflow
import requests
from mlflow.tracking import MlflowClient

from iaa.errors import IaaError, brief
from iaa.files import DiskFullError, disk_full, free_bytes, size_text
from iaa.jobs.ports import INTERRUPTED_TAG
from iaa.jobs.workdir.paths import sqlite_file
from iaa.platform.cluster.owner import owner_alive
from iaa.platform.tracking import relocate
from iaa.platform.tracking.mlflow_internals import forget_artifact_repositories

PARENT_TAG = "mlflow.parentRunId"
OWNER_TAG = "iaa.owner"
KILLED_TAG = "iaa.killed"               # set when a later command closes a run whose process died
STOP_TAGS = (KILLED_TAG, INTERRUPTED_TAG)   # how a run stopped: removed when a resume runs it again
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}   # MLflow 3's training-runs view
TIMEOUT_ENV, DEFAULT_TIMEOUT_S = "IAA_SERVICE_TIMEOUT_S", 5.0
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                        # a tracking server's client writes a link to stdout at each run's end and each
                        # model's creation; stdout is the commands' (their answers, their JSON line)
                        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
                        "MLFLOW_PRINT_MODEL_URLS_ON_CREATION": "false"}
TRANSIENT = (mlflow.exceptions.MlflowException, requests.exceptions.RequestException, OSError)

FILE_STORE_SCHEMES = ("", "file")
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")   # with an optional +driver
OTHER_SCHEMES = ("http", "https", "databricks", "databricks-uc", "uc")
MLFLOW_TABLES = {"alembic_version", "experiments"}              # what marks a SQLite file as MLflow's

STORE_LOGGERS = ("mlflow.store", "sqlalchemy", "alembic")


def quiet_store_logs() -> None:
    """Keep MLflow's table-creation chatter off stderr and, unless ``IAA_DEBUG`` is set, the
    tracebacks that a failing store logs (MLflow's session helper, SQLAlchemy's pool, alembic)
    before it raises: the raised error is what a command reports, in one line. Called where a
    store is opened, not on import, so that a program that imports the package keeps its own
    logging as it set it."""
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    if os.environ.get("IAA_DEBUG", "") in ("", "0"):
        for name in STORE_LOGGERS:
            logging.getLogger(name).setLevel(logging.CRITICAL)


def open_store(uri: str) -> str:
    """The store at ``uri`` (from :meth:`iaa.jobs.workdir.paths.Workdir.tracking_uri`), once checked; runs
    left ``RUNNING`` by dead processes are marked ``KILLED``."""
    quiet_store_logs()
    for key, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    check(uri)
    try:
        close_orphans(uri)                   # the first real request: tables built, API answering
    except TRANSIENT as err:
        if uri.startswith(("http://", "https://")):
            raise IaaError(f"MLflow tracking server {uri} answers /health but its API fails ({brief(err)}); see the "
                           "server's log, or fix `tracking_uri` / MLFLOW_TRACKING_URI") from err
        if disk_full(err):
            raise store_full(uri, "be opened") from None
        raise IaaError(f"the MLflow store {uri} cannot be used ({brief(err)}); fix it or pass another "
                       "`tracking_uri`") from err
    return uri


def store_full(uri: str, failed: str) -> DiskFullError:
    """The one error of a store whose disk is full: ``failed`` says what it could not do."""
    db = sqlite_file(uri)
    free = free_bytes(db) if db is not None else None
    told = f" ({size_text(free)} free)" if free is not None else ""
    return DiskFullError(f"no space left on device for the MLflow store {db or uri}{told}: it could not {failed}; "
                         "free some space on its disk or pass another `tracking_uri`")


def check(uri: str, timeout_s: float | None = None) -> None:
    """Fail fast with a message naming the store when it cannot be used."""
    timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)) if timeout_s is None else timeout_s
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme in FILE_STORE_SCHEMES or (len(scheme) == 1 and uri[1:2] == ":"):     # a path (C:\ too)
        raise IaaError(f"{uri}: MLflow's file store (a folder such as ./mlruns) is in maintenance mode in MLflow 3 "
                       "and refused; use a SQLite store: `tracking_uri` sqlite:///PATH/mlflow.db, or leave "
                       "`tracking_uri` and MLFLOW_TRACKING_URI unset for WORKDIR/mlflow.db (`mlflow "
                       "migrate-filestore` moves existing runs into one)")
    if scheme.split("+")[0] not in DATABASE_SCHEMES and scheme not in OTHER_SCHEMES:
        raise IaaError(f"{uri}: unknown tracking URI scheme {scheme + ':'!r}; give http(s)://HOST:PORT of an MLflow "
                       "server, sqlite:///PATH/mlflow.db, or a database URL (postgresql://, mysql://, mssql://)")
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(f"{uri.rstrip('/')}/health", timeout=timeout_s).close()
        except urllib.error.HTTPError:
            pass                                    # it answered: reachable
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise IaaError(f"MLflow tracking server {uri} is not reachable within {timeout_s:g} s ({reason}); "
                           "start it, fix `tracking_uri` / MLFLOW_TRACKING_URI, or leave both unset to use a "
                           f"SQLite store under the workdir ({TIMEOUT_ENV} sets the wait)") from err


def artifact_location(uri: str) -> str | None:
    """Artifacts of a SQLite store go beside it (MLflow's default, ``./mlruns``, follows the cwd);
    a store found in another folder than its artifacts' is rewritten when opened
    (:mod:`iaa.platform.tracking.relocate`)."""
    db = sqlite_file(uri)
    return relocate.artifact_root(db) if db is not None else None


@functools.lru_cache(maxsize=None)
def ensure_store(uri: str) -> None:
    """Create (or migrate) a SQLite store once, under a file lock, and point its artifact locations
    at the folder it is in now (:func:`iaa.platform.tracking.relocate.relocate`).

    MLflow builds a new SQLite store's tables on first use. Two processes doing that at once
    race, and one fails with "duplicate column name". The lock makes the second wait (and the
    check that the file is MLflow's runs under it, so that it never sees half-built tables).
    MLflow would add its tables to any SQLite file: one of another program is refused.
    """
    db = sqlite_file(uri)
    if db is None:
        return
    for folder in (db.parent, *db.parent.parents):
        if folder.exists() and not folder.is_dir():
            raise IaaError(f"{uri}: {folder} is a file, not a folder, so the MLflow store cannot be made there; give a "
                           "SQLite path in a writable folder (sqlite:///PATH/mlflow.db)")
    if not db.parent.is_dir():
        raise IaaError(f"{uri}: the folder {db.parent} does not exist; create it or give a SQLite path in a writable "
                       "folder (sqlite:///PATH/mlflow.db)")
    try:
        lock = open(db.parent / f"{db.name}.lock", "a")
    except OSError as err:
        raise IaaError(f"{uri}: cannot create files in {db.parent} ({err.strerror}), so the MLflow store cannot be made "
                       "there; give a SQLite path in a writable folder (sqlite:///PATH/mlflow.db)") from err
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            foreign = foreign_tables(db)
            if foreign:
                raise IaaError(f"{uri}: {db} is a SQLite database of something else (tables {', '.join(foreign[:5])}"
                               f"{', ...' if len(foreign) > 5 else ''}), not an MLflow store, and is left as it is; "
                               "give a new or MLflow file (sqlite:///PATH/mlflow.db)")
            new = not db.is_file() or db.stat().st_size == 0
            try:
                MlflowClient(uri).search_experiments(max_results=1)   # builds the tables
                relocate.relocate(db)                                  # a copied or moved work folder
            except Exception as err:  # noqa: BLE001 - MLflow, SQLAlchemy and alembic errors share no base
                if not disk_full(err):
                    raise
                if new:                  # a half-built store would be taken for a damaged one next time
                    for leftover in (db, db.with_name(f"{db.name}-journal")):
                        leftover.unlink(missing_ok=True)
                raise store_full(uri, "be created" if new else "be opened") from None
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def foreign_tables(db: Path) -> list[str]:
    """The tables of SQLite file ``db`` when it holds some but not MLflow's; [] for MLflow's, an
    empty database, an empty file or no file."""
    if not db.is_file() or db.stat().st_size == 0:
        return []
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=20)) as con:
            rows = con.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")
            tables = sorted(name for (name,) in rows)
    except sqlite3.Error:
        return []                      # unreadable: MLflow's own error says why
    return [] if not tables or MLFLOW_TABLES <= set(tables) else tables


_last_store: list[str] = []   # the store this process used last


def store_client(uri: str) -> MlflowClient:
    """A client of the store ``uri``; MLflow's artifact repositories of another store are forgotten
    first (they are cached by run id alone, and a copied store has the same ids)."""
    ensure_store(uri)
    if _last_store != [uri]:
        forget_artifact_repositories()
        _last_store[:] = [uri]
    return MlflowClient(uri)


NOTE_TAG = "mlflow.note.content"     # an experiment's (and a run's) description in the UI
# What made each experiment, by the prefix the jobs name it with (``tune-demo``, ``train-cbt-ne`` ...)
MADE_BY = {"tune": ("iaa-cli tune", "each sweep is a parent run; click + beside it to see its trials and ensembles"),
           "train": ("iaa-cli train", "one run per training run"),
           "ensemble": ("iaa-cli ensemble", "one run per ensemble, its trained members nested under it"),
           "distill": ("iaa-cli distill", "one run per student trained on the soft targets of the ensemble {rest}")}


def experiment_note(name: str, tags: dict[str, str] | None = None) -> str:
    """A one-line description of experiment ``name``: the dataset (the ``dataset`` tag of the run
    that creates it) and the command that made it."""
    prefix, _, rest = name.partition("-")
    command, layout = MADE_BY.get(prefix, ("iaa-cli", "one run per job"))
    dataset = (tags or {}).get("dataset") or (rest if prefix in MADE_BY and prefix != "distill" else "")
    on = f" on the {dataset} dataset" if dataset else ""
    return f"Runs of `{command}`{on}: {layout.format(rest=rest)}."


def experiment_id(uri: str, name: str, note: str | None = None) -> str:
    """The id of experiment ``name`` in the store at ``uri``, created if needed with the
    description ``note`` (:func:`experiment_note`); an experiment without one is given it."""
    client = store_client(uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        if note and not found.tags.get(NOTE_TAG):
            client.set_experiment_tag(found.experiment_id, NOTE_TAG, note)
        return found.experiment_id
    tags = {**EXPERIMENT_KIND, **({NOTE_TAG: note} if note else {})}
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri), tags=tags)
    except mlflow.exceptions.MlflowException:  # created concurrently by another process
        found = client.get_experiment_by_name(name)
        assert found is not None
        return found.experiment_id


# --- runs left running by killed processes ------------------------------------------------------


def close_orphans(uri: str) -> list[str]:
    """Mark ``KILLED`` the runs left ``RUNNING`` by a process of this host that is gone, and FAIL
    the Optuna trials that such processes left in the studies of those runs' sweeps
    (:mod:`iaa.platform.sweeps.studies.orphans`)."""
    client = store_client(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    if not ids:
        return []
    closed = []
    for run in client.search_runs(ids, filter_string="attributes.status = 'RUNNING'", max_results=1000):
        token = run.data.tags.get(OWNER_TAG)
        if token and not owner_alive(token):
            client.set_tag(run.info.run_id, KILLED_TAG, f"process {token} ended without closing this run")
            client.set_terminated(run.info.run_id, status="KILLED")
            closed.append(run)
    if any(run.data.tags.get("sweep") for run in closed):
        from iaa.platform.sweeps.studies.orphans import fail_orphaned_trials

        fail_orphaned_trials(client, uri, closed)
    return [run.info.run_id for run in closed]
