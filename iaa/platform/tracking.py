"""MLflow tracking: the store, runs, nested runs and what each run logs.

The default store is embedded: a SQLite file under the work directory. ``--tracking-uri`` or
``MLFLOW_TRACKING_URI`` selects a server instead (required on multi-node clusters, whose
workers cannot reach a SQLite file on the head node's disk).
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

import mlflow
from mlflow.tracking import MlflowClient

PARENT_TAG = "mlflow.parentRunId"

logging.getLogger("mlflow").setLevel(logging.WARNING)  # keep table-creation chatter off stderr


def resolve_uri(tracking_uri: str | None, workdir: Path) -> str:
    """``tracking_uri``, else ``MLFLOW_TRACKING_URI``, else ``sqlite:///WORKDIR/mlflow.db``."""
    uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{workdir / 'mlflow.db'}"


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
    if uri.startswith("sqlite:///"):
        return (Path(uri.removeprefix("sqlite:///")).resolve().parent / "mlartifacts").as_uri()
    return None


@functools.lru_cache(maxsize=None)
def ensure_store(uri: str) -> None:
    """Create (or migrate) a SQLite store once, under a file lock.

    MLflow builds a new SQLite store's tables on first use. Two processes doing that at once
    (two ``iaa-cli train`` started together on a fresh workdir) race, and one fails with
    "duplicate column name". The lock makes the second wait and then find the tables made.
    """
    if not uri.startswith("sqlite:///"):
        return
    db = Path(uri.removeprefix("sqlite:///"))
    with open(db.parent / f"{db.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            MlflowClient(uri).search_experiments(max_results=1)   # builds the tables
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def open_client(uri: str) -> MlflowClient:
    """An ``MlflowClient`` for ``uri``, once its store exists (``ensure_store``). Every client of
    the platform comes from here: MLflow opens, and on first use creates, the store as soon as a
    client is made."""
    ensure_store(uri)
    return MlflowClient(uri)


def experiment_id(uri: str, name: str) -> str:
    """The id of experiment ``name`` in the store at ``uri``, created if needed."""
    client = open_client(uri)
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location(uri))
    except mlflow.exceptions.MlflowException:  # created concurrently by another process
        found = client.get_experiment_by_name(name)
        assert found is not None
        return found.experiment_id


class Run:
    """One MLflow run driven through ``MlflowClient``, so it never touches global run state.

    Keeping to the client (no ``mlflow.start_run``) means no ``MLFLOW_RUN_ID`` leaks from a
    parent's environment into child processes.
    """

    def __init__(self, uri: str, run_id: str) -> None:
        self.uri, self.run_id = uri, run_id
        self.client = open_client(uri)

    @classmethod
    def start(cls, uri: str, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
              parent_run_id: str | None = None) -> "Run":
        all_tags = {"git_commit": git_commit(), **(tags or {})}
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        client = open_client(uri)
        run = client.create_run(experiment_id(uri, experiment), run_name=name, tags=all_tags)
        return cls(uri, run.info.run_id)

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric
        import time

        now = int(time.time() * 1000)
        items = [Metric(k, v, now, step or 0) for k, v in numeric(metrics).items()]
        if items:
            self.client.log_batch(self.run_id, metrics=items)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        for key, value in tags.items():
            self.client.set_tag(self.run_id, key, str(value))

    def log_artifact(self, path: Path) -> None:
        self.client.log_artifact(self.run_id, str(path))

    def end(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


@contextmanager
def run_context(uri: str, experiment: str, name: str, **kwargs: Any) -> Iterator[Run]:
    """A run that ends FINISHED, or FAILED / KILLED when its block raises."""
    run = Run.start(uri, experiment, name, **kwargs)
    try:
        yield run
    except KeyboardInterrupt:
        run.end("KILLED")
        raise
    except BaseException:
        run.end("FAILED")
        raise
    run.end("FINISHED")
