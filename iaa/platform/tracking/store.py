"""MLflow runs written by the jobs: a :class:`Run` driven through the client, with its params,
metrics, tags, inputs and artifacts, and :func:`run_context`, which ends it with its block.

The store is opened and checked by :mod:`iaa.platform.tracking.connection` and read back by
:mod:`iaa.platform.tracking.queries`. With :mod:`iaa.platform.mlflow_model` (the pyfunc model,
which builds on these modules and never the other way round) and
:mod:`iaa.platform.tracking.tracker` (the jobs' Tracker on both) they are the only code that
talks to MLflow.

**During a run** metrics are buffered when the store fails and retried every
``RETRY_EVERY_S``; training never stops for tracking. A run that ends with metrics still
unlogged says which on stderr.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import re
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping

from mlflow.entities import Metric, Param

from iaa import signals
from iaa.errors import IaaError, brief
from iaa.data.prepared.manifest import MANIFEST, read
from iaa.jobs.config.job_config import flatten
from iaa.platform.cluster.owner import owner
from iaa.files import disk_full
from iaa.platform.tracking.connection import (OWNER_TAG, PARENT_TAG, STOP_TAGS, TRANSIENT, experiment_id,
                                             experiment_note, store_client, store_full)

_log = logging.getLogger(__name__)

RETRY_EVERY_S = 30.0


@functools.lru_cache(maxsize=1)
def git_commit() -> str:
    """The commit of the installed source tree, or ``unknown`` outside a git checkout."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parent,
                             capture_output=True, text=True, timeout=5, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def source_tags() -> dict[str, str]:
    """MLflow's system tags for where a run comes from (its UI shows them as the run's source):
    the command (``iaa-cli tune``) and the commit of the source tree, where it is a git checkout."""
    command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:2]]) if sys.argv and sys.argv[0] else "iaa"
    commit = git_commit()
    return {"mlflow.source.type": "LOCAL", "mlflow.source.name": command,
            **({"mlflow.source.git.commit": commit} if commit != "unknown" else {})}


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


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
        self._client = store_client(uri)
        self._pending: list[Metric] = []
        self._retry_at = 0.0
        self._failure: str | None = None
        self.lost: list[str] = []          # what the store refused for good, with why
        self.full: IaaError | None = None  # a full disk under the store, once a write met one (a DiskFullError)

    @classmethod
    def start(cls, uri: str, experiment: str, name: str, *, tags: Mapping[str, str] | None = None,
              parent_run_id: str | None = None) -> "Run":
        all_tags = {**source_tags(), OWNER_TAG: owner(), **(tags or {})}
        if parent_run_id:
            all_tags[PARENT_TAG] = parent_run_id
        where = experiment_id(uri, experiment, experiment_note(experiment, all_tags))
        run = store_client(uri).create_run(where, run_name=name, tags=all_tags)
        return cls(uri, run.info.run_id)

    @classmethod
    def reopen(cls, uri: str, run_id: str) -> "Run":
        """Continue run ``run_id`` (a resumed job): ``RUNNING`` again, owned by this process."""
        run = cls(uri, run_id)
        run.mark_running()
        return run

    def mark_running(self) -> None:
        """RUNNING again, owned by this process; the tags that said how it stopped (a signal, a
        process that died) no longer hold and are removed: a run the resume finishes reads as one."""
        tags = self._client.get_run(self.run_id).data.tags
        for key in STOP_TAGS:
            if key in tags:
                self._client.delete_tag(self.run_id, key)
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
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Write the metrics held back; before the retry time only where ``force``."""
        if not self._pending or (not force and time.monotonic() < self._retry_at):
            return
        try:
            while self._pending:
                with signals.held():            # a write cut halfway would keep the store locked
                    self._client.log_batch(self.run_id, metrics=self._pending[:1000])
                del self._pending[:1000]
        except TRANSIENT as err:
            self._note_full(err, f"log metrics of run {self.run_id}")
            if self._failure is None:
                _log.warning(f"MLflow at {self.uri} failed ({brief(err)}); keeping metrics and retrying every "
                             f"{RETRY_EVERY_S:g} s")
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
            with signals.held():                # a write cut halfway would keep the store locked
                call(*args, **kwargs)
        except TRANSIENT as err:
            self._note_full(err, f"{what} of run {self.run_id}")
            _log.warning(f"MLflow at {self.uri}: could not {what} of run {self.run_id} ({brief(err)})")
            self.lose(what, err)

    def _note_full(self, err: BaseException, failed: str) -> None:
        if self.full is None and disk_full(err):
            self.full = store_full(self.uri, failed)

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
        self.flush(force=True)
        if self._pending:
            names = sorted({m.key for m in self._pending})
            steps = sorted({m.step for m in self._pending})
            _log.warning(f"{len(self._pending)} metric values of run {self.run_id} were not logged to MLflow at "
                         f"{self.uri}: {', '.join(names)} at steps {steps[0]}..{steps[-1]} ({self._failure})")
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
    try:
        run = Run.reopen(uri, resume_id) if resume_id else Run.start(uri, experiment, name, **kwargs)
    except TRANSIENT as err:
        if disk_full(err):
            raise store_full(uri, f"{'reopen' if resume_id else 'start'} the run; nothing was done") from None
        raise
    try:
        yield run
    except KeyboardInterrupt:
        run.end("KILLED")
        raise
    except IaaError as err:
        run.end("FAILED")
        unmarked = [w for w in run.lost if w.startswith("mark FAILED")]
        if unmarked:
            # "mark FAILED ((sqlite3.OperationalError) database or disk is full)" -> the last part
            reason = re.sub(r"^\(\([\w.]+\) ", "(", unmarked[0].removeprefix("mark FAILED "))
            raise IaaError(f"{err}; and the MLflow run {run.run_id} could not be marked FAILED {reason}") from err
        raise
    except BaseException:
        run.end("FAILED")
        raise
    run.flush(force=True)
    run.end("FAILED" if run.lost or run.unlogged() else "FINISHED")
    if run.lost:
        marked = "could not be marked FAILED either" if any(w.startswith("mark ") for w in run.lost) else "is marked FAILED"
        raise TrackingIncomplete(f"{uri}: the store did not record everything of run {run.run_id}, which {marked}; "
                                 f"not logged: {'; '.join(w for w in run.lost if not w.startswith('mark '))}. The work "
                                 "itself finished and its files are written; free the store's disk (or unlock it, or "
                                 "restart it) and run again to log it")


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
    manifest = read(Path(prepared))
    return {"name": manifest.dataset if manifest is not None else Path(prepared).name, "source": str(Path(prepared).resolve()),
            "digest": manifest_digest(prepared)}
