"""MLflow tracking: the store, runs and what they log.

With :mod:`iaa.platform.mlflow_model` (the pyfunc model, which builds on this module and never
the other way round) and :mod:`iaa.platform.tracking.tracker` (the jobs' Tracker on both) this is the
only code that talks to MLflow.

The default store is embedded: a SQLite file under the work directory. ``--tracking-uri`` or
``MLFLOW_TRACKING_URI`` selects a server instead (required on multi-node clusters, whose
workers cannot reach a SQLite file on the head node's disk).

- **At start** (:func:`open_store`) the store is checked within ``IAA_SERVICE_TIMEOUT_S``
  seconds (default 5): an unreachable server, a server whose API fails, a damaged SQLite file, a
  SQLite path in no writable folder, a SQLite database of something else, a file-store folder
  (MLflow 3 keeps that store in maintenance mode) or an unknown scheme is an :class:`IaaError`
  naming the URI. MLflow's own HTTP retries are shortened (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
  ``MLFLOW_HTTP_REQUEST_TIMEOUT``, ``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``; values set in the
  environment win), so that a server lost later costs seconds, not minutes.
- **During a run** metrics are buffered when the store fails and retried every
  ``RETRY_EVERY_S``; training never stops for tracking. A run that ends with metrics still
  unlogged says which on stderr.
- **Owners**: every run carries the ``iaa.owner`` tag (host, pid, process start). A later start
  on the same host marks ``KILLED`` the runs still ``RUNNING`` whose process is gone.
"""

from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import logging
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
import contextlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import mlflow
import requests
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient

from iaa.errors import IaaError, brief
from iaa.data.manifest import MANIFEST
from iaa.jobs.ports import MetricPoint, RunRecord
from iaa.jobs.workdir.paths import sqlite_file
from iaa.platform.cluster.owner import owner, owner_alive

PARENT_TAG = "mlflow.parentRunId"
OWNER_TAG = "iaa.owner"
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}   # MLflow 3's training-runs view
TIMEOUT_ENV, DEFAULT_TIMEOUT_S = "IAA_SERVICE_TIMEOUT_S", 5.0
MLFLOW_HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
                        "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
RETRY_EVERY_S = 30.0
TRANSIENT = (mlflow.exceptions.MlflowException, requests.exceptions.RequestException, OSError)

FILE_STORE_SCHEMES = ("", "file")
DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")   # with an optional +driver
OTHER_SCHEMES = ("http", "https", "databricks", "databricks-uc", "uc")
MLFLOW_TABLES = {"alembic_version", "experiments"}              # what marks a SQLite file as MLflow's

logging.getLogger("mlflow").setLevel(logging.WARNING)  # keep table-creation chatter off stderr
if os.environ.get("IAA_DEBUG", "") in ("", "0"):
    # A failing store logs each error with its traceback (MLflow's session helper, SQLAlchemy's
    # pool, alembic) and then raises it; the raised error is what a command reports, in one line.
    for _name in ("mlflow.store", "sqlalchemy", "alembic"):
        logging.getLogger(_name).setLevel(logging.CRITICAL)


def open_store(uri: str) -> str:
    """The store at ``uri`` (from :meth:`iaa.jobs.workdir.paths.Workdir.tracking_uri`), once checked; runs
    left ``RUNNING`` by dead processes are marked ``KILLED``."""
    for key, value in MLFLOW_HTTP_DEFAULTS.items():
        os.environ.setdefault(key, value)
    check(uri)
    try:
        close_orphans(uri)                   # the first real request: tables built, API answering
    except TRANSIENT as err:
        if uri.startswith(("http://", "https://")):
            raise IaaError(f"MLflow tracking server {uri} answers /health but its API fails ({brief(err)}); see the "
                           "server's log, or fix --tracking-uri / MLFLOW_TRACKING_URI") from err
        raise IaaError(f"the MLflow store {uri} cannot be used ({brief(err)}); fix it or pass another "
                       "--tracking-uri") from err
    return uri


def check(uri: str, timeout_s: float | None = None) -> None:
    """Fail fast with a message naming the store when it cannot be used."""
    timeout_s = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S)) if timeout_s is None else timeout_s
    scheme = urllib.parse.urlsplit(uri).scheme.lower()
    if scheme in FILE_STORE_SCHEMES or (len(scheme) == 1 and uri[1:2] == ":"):     # a path (C:\ too)
        raise IaaError(f"{uri}: MLflow's file store (a folder such as ./mlruns) is in maintenance mode in MLflow 3 "
                       "and refused; use a SQLite store: --tracking-uri sqlite:///PATH/mlflow.db, or leave "
                       "--tracking-uri and MLFLOW_TRACKING_URI unset for WORKDIR/mlflow.db (`mlflow "
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
                           "start it, fix --tracking-uri / MLFLOW_TRACKING_URI, or leave both unset to use a "
                           f"SQLite store under the workdir ({TIMEOUT_ENV} sets the wait)") from err


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the installed source tree, or ``unknown`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"model": {"steps": 8}}`` -> ``{"model.steps": 8}``."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def artifact_location(uri: str) -> str | None:
    """Artifacts of a SQLite store go beside it (MLflow's default, ``./mlruns``, follows the cwd)."""
    db = sqlite_file(uri)
    return (db.resolve().parent / "mlartifacts").as_uri() if db is not None else None


@functools.lru_cache(maxsize=None)
def ensure_store(uri: str) -> None:
    """Create (or migrate) a SQLite store once, under a file lock.

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
            MlflowClient(uri).search_experiments(max_results=1)   # builds the tables
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


def _client(uri: str) -> MlflowClient:
    ensure_store(uri)
    return MlflowClient(uri)


def experiment_id(uri: str, name: str) -> str:
    """The id of experiment ``name`` in the store at ``uri``, created if needed."""
    client = _client(uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri), tags=EXPERIMENT_KIND)
    except mlflow.exceptions.MlflowException:  # created concurrently by another process
        found = client.get_experiment_by_name(name)
        assert found is not None
        return found.experiment_id


# --- runs left running by killed processes ------------------------------------------------------


def close_orphans(uri: str) -> list[str]:
    """Mark ``KILLED`` the runs left ``RUNNING`` by a process of this host that is gone."""
    client = _client(uri)
    ids = [e.experiment_id for e in client.search_experiments()]
    if not ids:
        return []
    closed = []
    for run in client.search_runs(ids, filter_string="attributes.status = 'RUNNING'", max_results=1000):
        token = run.data.tags.get(OWNER_TAG)
        if token and not owner_alive(token):
            client.set_tag(run.info.run_id, "iaa.killed", f"process {token} ended without closing this run")
            client.set_terminated(run.info.run_id, status="KILLED")
            closed.append(run.info.run_id)
    return closed


# --- finding runs ----------------------------------------------------------------------------------


def find_runs(uri: str, experiment: str, tags: Mapping[str, str] | None = None,
              status: str | None = None) -> list[RunRecord]:
    """Runs of ``experiment`` carrying every tag of ``tags`` (and ``status``), newest first."""
    tags = tags or {}
    if any("'" in str(v) for v in tags.values()):
        return []
    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    terms = [f"tags.`{k}` = '{v}'" for k, v in tags.items()] + ([f"attributes.status = '{status}'"] if status else [])
    runs = client.search_runs([found.experiment_id], filter_string=" and ".join(terms),
                              order_by=["attributes.start_time DESC"], max_results=5000)
    return [_record(r) for r in runs]


def find_by_tag(uri: str, key: str, values: Sequence[str]) -> str | None:
    """The newest run of any experiment whose tag ``key`` is one of ``values``."""
    client = _client(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    for value in values:
        if "'" in value or not experiments:
            continue
        runs = client.search_runs(experiments, filter_string=f"tags.`{key}` = '{value}'", max_results=1,
                                  order_by=["attributes.start_time DESC"])
        if runs:
            return runs[0].info.run_id
    return None


# --- runs ------------------------------------------------------------------------------------------


class TrackingIncomplete(IaaError):
    """The work finished, but the tracking store refused part of its record."""


class Run:
    """One MLflow run driven through ``MlflowClient``, so it never touches global run state.

    Keeping to the client (no ``mlflow.start_run``) means no ``MLFLOW_RUN_ID`` leaks from a
    parent's environment into child processes. Metrics the store refuses are kept and sent
    again at the next call after ``RETRY_EVERY_S``; :meth:`end` reports those it never could.
    Everything the store refused for good is kept in :attr:`lost` (see :func:`run_context`).
    """

    def __init__(self, uri: str, run_id: str) -> None:
        self.uri, self.run_id = uri, run_id
        self._client = _client(uri)
        self._pending: list[Metric] = []
        self._retry_at = 0.0
        self._failure: str | None = None
        self.lost: list[str] = []          # what the store refused for good, with why

    @classmethod
    def start(cls, uri: str, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
              parent_run_id: str | None = None) -> "Run":
        all_tags = {"git_commit": git_commit(), OWNER_TAG: owner(), **(tags or {})}
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        run = _client(uri).create_run(experiment_id(uri, experiment), run_name=name, tags=all_tags)
        return cls(uri, run.info.run_id)

    @classmethod
    def reopen(cls, uri: str, run_id: str) -> "Run":
        """Continue run ``run_id`` (a resumed job): ``RUNNING`` again, owned by this process."""
        run = cls(uri, run_id)
        run.mark_running()
        return run

    def mark_running(self) -> None:
        self._client.set_tag(self.run_id, OWNER_TAG, owner())
        self._client.update_run(self.run_id, status="RUNNING")

    def status(self) -> str:
        return self._client.get_run(self.run_id).info.status

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self._tolerant(f"log {len(items[i : i + 100])} params", self._client.log_batch, self.run_id,
                           params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        self._pending += [Metric(k, v, now, step or 0) for k, v in numeric(metrics).items()]
        self._flush()

    def _flush(self, force: bool = False) -> None:
        if not self._pending or (not force and time.monotonic() < self._retry_at):
            return
        try:
            while self._pending:
                self._client.log_batch(self.run_id, metrics=self._pending[:1000])
                del self._pending[:1000]
        except TRANSIENT as err:
            if self._failure is None:
                print(f"warning: MLflow at {self.uri} failed ({brief(err)}); keeping metrics and retrying every "
                      f"{RETRY_EVERY_S:g} s", file=sys.stderr)
            self._failure = brief(err)
            self._retry_at = time.monotonic() + RETRY_EVERY_S

    def unlogged(self) -> list[Metric]:
        """Metrics kept because the store refused them."""
        return list(self._pending)

    def lose(self, what: str, err: BaseException | str) -> None:
        """Record that ``what`` was not logged, and why."""
        self.lost.append(f"{what} ({brief(err)[:200]})")

    def _tolerant(self, what: str, call: Any, *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except TRANSIENT as err:
            print(f"warning: MLflow at {self.uri}: could not {what} of run {self.run_id} ({brief(err)})",
                  file=sys.stderr)
            self.lose(what, err)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self._tolerant(f"set tag {key}", self._client.set_tag, self.run_id, key, str(value))

    def log_dataset(self, prepared: Path, context: str = "train") -> None:
        """Record the prepared data as the run's input: name, source folder and manifest digest
        (the UI's Dataset column)."""
        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        info = dataset_summary(prepared)
        with warnings.catch_warnings():  # "can be interpreted in multiple ways": all local folders
            warnings.simplefilter("ignore")
            source = resolve_dataset_source(info["source"])
        dataset = MetaDataset(source, name=info["name"], digest=info["digest"])
        self._tolerant("log the dataset", self._client.log_inputs, self.run_id, [_input(dataset, context)])

    def log_file_input(self, path: Path, context: str) -> None:
        """Record a file (e.g. a distillation teacher's Parquet) as an input of the run: its name,
        path and the sha256 of its bytes (first 12 hex digits) as the digest."""
        import hashlib

        from mlflow.data.dataset_source_registry import resolve_dataset_source
        from mlflow.data.meta_dataset import MetaDataset

        sha = hashlib.sha256()
        with Path(path).open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                sha.update(block)
        with warnings.catch_warnings():  # "can be interpreted in multiple ways": a local file
            warnings.simplefilter("ignore")
            source = resolve_dataset_source(str(Path(path).resolve()))
        dataset = MetaDataset(source, name=Path(path).stem, digest=sha.hexdigest()[:12])
        self._tolerant(f"log the {context} input", self._client.log_inputs, self.run_id, [_input(dataset, context)])

    def log_artifact(self, path: Path, folder: str | None = None) -> None:
        self._tolerant(f"store {Path(path).name}", self._client.log_artifact, self.run_id, str(path), folder)

    def end(self, status: str = "FINISHED") -> None:
        """Send what is kept, then close the run; what could not be sent is named on stderr."""
        self._flush(force=True)
        if self._pending:
            names = sorted({m.key for m in self._pending})
            steps = sorted({m.step for m in self._pending})
            print(f"warning: {len(self._pending)} metric values of run {self.run_id} were not logged to MLflow at "
                  f"{self.uri}: {', '.join(names)} at steps {steps[0]}..{steps[-1]} ({self._failure})", file=sys.stderr)
            self.lose(f"{len(self._pending)} metric values ({', '.join(names)} at steps {steps[0]}..{steps[-1]})",
                      self._failure or "refused")
            self._pending.clear()
        self._tolerant(f"mark {status}", self._client.set_terminated, self.run_id, status=status)


@contextmanager
def run_context(uri: str, experiment: str, name: str, *, resume_id: str | None = None,
                **kwargs: Any) -> Iterator[Run]:
    """A run (``resume_id``: continued) that ends FINISHED, or FAILED / KILLED when its block raises.

    A block that finishes while the store refused something for good (a full disk, a locked
    database) ends the run FAILED and raises :class:`TrackingIncomplete` naming what was not
    logged: the work itself is done, but the record of it is not whole.
    """
    run = Run.reopen(uri, resume_id) if resume_id else Run.start(uri, experiment, name, **kwargs)
    try:
        yield run
    except KeyboardInterrupt:
        run.end("KILLED")
        raise
    except BaseException:
        run.end("FAILED")
        raise
    run._flush(force=True)
    run.end("FAILED" if run.lost or run.unlogged() else "FINISHED")
    if run.lost:
        marked = "could not be marked FAILED either" if any(w.startswith("mark ") for w in run.lost) else "is marked FAILED"
        raise TrackingIncomplete(f"{uri}: the store did not record everything of run {run.run_id}, which {marked}; "
                                 f"not logged: {'; '.join(w for w in run.lost if not w.startswith('mark '))}. The work "
                                 "itself finished and its files are written; free the store's disk (or unlock it, or "
                                 "restart it) and run again to log it")


VIEW_KEY = "iaa-sweep"   # the experiment's saved runs view (``viewStateShareKey``)


def show_columns(uri: str, experiment: str, columns: Sequence[str]) -> str | None:
    """Save a runs view of ``experiment`` showing ``columns`` (``metrics.valid_acc``,
    ``params.train.lr``), and mark the experiment a training-runs one; returns the view's URL in the UI
    (:func:`ui_url`, ``http://127.0.0.1:5000/#/experiments/ID/runs?...``).

    MLflow's UI opens an experiment with the columns the browser last chose; a view saved as the
    experiment tag ``mlflow.sharedViewState.KEY`` opens with its own columns from a link. The UI
    nests child runs under their parent only while the table is sorted by start time (any other
    sort lists the parent among its children), so the view keeps that order. (A shared view
    cannot open a parent: the UI drops ``runsExpanded`` from it.)
    (``mlflow.experimentKind`` is what older 3.x UIs read; 3.17's follows the link's ``workflowType``.)
    """
    def canonical(name: str) -> str:
        kind, _, key = name.partition(".")
        return f"{kind}.`{key}`"

    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    state = {"selectedColumns": [canonical(c) for c in columns], "orderByKey": "attributes.start_time",
             "orderByAsc": False, "hideEmptyCharts": True}
    for key, value in {**EXPERIMENT_KIND, f"mlflow.sharedViewState.{VIEW_KEY}": json.dumps(state)}.items():
        client.set_experiment_tag(found.experiment_id, key, value)
    # The UI shows every experiment as GenAI or as model training after a global switch (kept per
    # browser, GenAI by default); ``workflowType`` in the link picks model training.
    return (f"{ui_url(uri)}/#/experiments/{found.experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}")


UI_URL = "http://127.0.0.1:5000"     # where ``mlflow ui`` serves a file store by default


def ui_url(uri: str) -> str:
    """The address of the UI showing the store ``uri``: a tracking server is its own UI; a SQLite
    or file store is shown by ``mlflow ui --backend-store-uri URI`` (``MLFLOW_UI_URL`` if it runs
    elsewhere)."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return os.environ.get("MLFLOW_UI_URL", UI_URL).rstrip("/")


# --- reading runs back (reports) -------------------------------------------------------------------


def _record(run: Any) -> RunRecord:
    return RunRecord(run.info.run_id, run.info.run_name or run.info.run_id, run.info.status,
                     int(run.info.start_time or 0), dict(run.data.params), dict(run.data.tags),
                     run.data.tags.get(PARENT_TAG))


def experiment_records(uri: str, experiment: str) -> list[RunRecord] | None:
    """Every run of ``experiment``, oldest first; None when the store has no such experiment."""
    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time ASC"], max_results=5000)
    return [_record(r) for r in runs]


def experiment_names(uri: str) -> list[str]:
    """The names of the store's experiments."""
    return sorted(e.name for e in _client(uri).search_experiments())


def metric_history(uri: str, run_id: str, key: str) -> list[MetricPoint]:
    """Every logged value of metric ``key`` of run ``run_id``, in logging order."""
    history = _client(uri).get_metric_history(run_id, key)
    return [MetricPoint(int(m.step), float(m.value), int(m.timestamp)) for m in history]


def manifest_digest(prepared: Path) -> str:
    """A short digest of the prepared data's manifest (which holds every shard's sha256)."""
    return hashlib.sha256((Path(prepared) / MANIFEST).read_bytes()).hexdigest()[:16]


def _input(dataset: Any, context: str) -> Any:
    """A run input of ``dataset`` (an ``mlflow.data.Dataset``) in ``context`` (``train``, ``teacher``),
    built from the dataset's public ``to_dict``."""
    from mlflow.entities import Dataset, DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    info = dataset.to_dict()
    entity = Dataset(name=info["name"], digest=info["digest"], source_type=info["source_type"],
                     source=info["source"], schema=info.get("schema"), profile=info.get("profile"))
    return DatasetInput(entity, tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)])


def dataset_summary(prepared: Path) -> dict[str, Any]:
    """The prepared data as MLflow records it: name, source folder and manifest digest."""
    manifest = json.loads((Path(prepared) / MANIFEST).read_text(encoding="utf-8"))
    return {"name": manifest.get("dataset", Path(prepared).name), "source": str(Path(prepared).resolve()),
            "digest": manifest_digest(prepared)}
