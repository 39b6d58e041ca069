"""The work folder and the run folder: the one place that names where things live.

A :class:`Workdir` (``--workdir``, ``IAA_WORKDIR``, default :data:`DEFAULT_WORKDIR`) holds::

    data/DATASET/        prepared datasets (manifest.json, vocab.json, split shards)
    runs/NAME/           one training run each (a RunFolder)
    sweeps/NAME/         sweep.json, best_config.yaml, the downloaded trial checkpoints
    ensembles/NAME/      ensemble.json, members' predictions, the ledger of members it trained
    evaluations/MODEL/   ``iaa-cli evaluate``'s predictions unless --out says otherwise
    distill/teachers/    the distillation teachers (an ensemble's soft targets)
    ray/                 Ray's storage (Tune and Train runs) unless --storage-path says otherwise
    mlflow.db            the SQLite MLflow store unless --tracking-uri / MLFLOW_TRACKING_URI
    mlartifacts/         that store's artifacts

Records in it store these paths relative to it (:mod:`iaa.jobs.workdir.recorded`), so a copied or
moved work folder works from its new place. A :class:`RunFolder` is the one reader and writer of
a run's files (``metrics.jsonl``, ``tracking.json``, ``checkpoints/{best,last}.pt``). What a
command may replace or delete in these folders is decided by the output policy
(:mod:`iaa.jobs.workdir.outputs`), never here.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from iaa.errors import IaaError
from iaa.files import atomic_write_text, ensure_writable
from iaa.jobs.workdir import names
from iaa.jobs.workdir.recorded import stored

DEFAULT_WORKDIR = "iaa-work"
SQLITE = "sqlite:///"
TRACKING_ENV = "MLFLOW_TRACKING_URI"
LAST = "last.pt"    # a run's latest checkpoint, in its checkpoints/ folder
BEST = "best.pt"    # its best checkpoint by validation accuracy
SWEEP_RECORD = "sweep.json"         # a sweep folder's record (iaa.jobs.sweeps.record)
BEST_CONFIG = "best_config.yaml"    # the config of a sweep's best trial, for ``train --config``
ENSEMBLE_RECORD = "ensemble.json"   # an ensemble folder's record (iaa.jobs.evaluation.ensembling.ensemble_record)


def sqlite_file(uri: str) -> Path | None:
    """The database file of a SQLite tracking URI (:data:`SQLITE` + path); None for any other store."""
    return Path(uri[len(SQLITE):]) if uri.startswith(SQLITE) else None


def sqlite_problem(db: Path, timeout_s: float = 5.0) -> str | None:
    """Why the SQLite file ``db`` is no readable database, or None when it is (or does not exist)."""
    if not db.exists():
        return None
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=timeout_s) as con:
            verdict = con.execute("PRAGMA quick_check").fetchone()[0]
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error as err:
        return str(err)
    return None if verdict == "ok" else verdict


@dataclass(frozen=True)
class Tracking:
    """Where a run folder's run is tracked: the store's URI, the run's id in it, and the folder's
    resolved place when it last wrote this (a moved or copied folder is then told from its original)."""

    uri: str
    run_id: str
    folder: str


@dataclass(frozen=True)
class RunFolder:
    """One training run's folder: its metrics, its checkpoints, the name of its Ray Train run."""

    path: Path

    RUN_FILES = ("checkpoints", "metrics.jsonl")   # what a started run leaves in its folder

    @property
    def metrics(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def best(self) -> Path:
        return self.checkpoints / BEST

    @property
    def last(self) -> Path:
        return self.checkpoints / LAST

    @property
    def ray_run_file(self) -> Path:
        """Holds the name of the run's Ray Train run under the storage path (``train --workers``)."""
        return self.path / "ray_run_name"

    @property
    def tracking_file(self) -> Path:
        """Names the tracked run that the folder's run writes to (:class:`Tracking`)."""
        return self.path / "tracking.json"

    def tracking(self) -> Tracking | None:
        """The tracked run as the folder's last run wrote it; None where no run wrote it (runs
        from before the file are found by their ``run_dir`` tag). A damaged file is an error that
        names it: removing it makes the next resume start a new tracked run."""
        file = self.tracking_file
        if not file.is_file():
            return None
        fix = "; remove it to resume under a new tracked run"
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise IaaError(f"{file}: line {err.lineno}: not JSON ({err.msg}){fix}") from None
        fields = ("tracking_uri", "run_id", "run_dir")
        missing = [k for k in fields if not isinstance(record, dict) or not isinstance(record.get(k), str)]
        if missing:
            raise IaaError(f"{file}: no {', '.join(missing)} (a string) in it{fix}")
        return Tracking(*(record[k] for k in fields))

    def track(self, uri: str, run_id: str) -> Tracking:
        """Write that the folder's run is tracked as ``run_id`` in the store ``uri``, from here."""
        tracking = Tracking(uri, run_id, str(self.path.resolve()))
        atomic_write_text(self.tracking_file, json.dumps(
            {"tracking_uri": tracking.uri, "run_id": tracking.run_id, "run_dir": tracking.folder}, indent=2) + "\n")
        return tracking

    def copied_from(self, uri: str) -> Path | None:
        """The run folder that this one is a copy of, where the two share the store ``uri`` and the
        original still tracks its run there: the tracked run its file names is then the original's.
        None for the folder that began the run, one that moved, and a copy with a store of its own."""
        tracking = self.tracking()
        if tracking is None or tracking.uri != uri or tracking.folder == str(self.path.resolve()):
            return None
        original = RunFolder(Path(tracking.folder))
        return original.path if original.path.is_dir() and original.tracking() == tracking else None

    def holds_run(self) -> bool:
        """True when the folder holds a started or finished run."""
        return any((self.path / name).exists() for name in self.RUN_FILES)

    def resumable(self) -> bool:
        """True when a checkpoint of the run is kept: in the folder, or (``train --workers``) in the
        storage of the Ray Train run that the folder names, once it made a check."""
        return (self.last.is_file() or self.best.is_file()
                or (self.ray_run_file.is_file() and self.metrics.is_file()))

    def append_metrics(self, metrics: dict[str, Any]) -> None:
        """One JSON line per validation check, stamped with the wall-clock time; a write that fails
        (a full disk) leaves the file as it was, never half a line."""
        line = (json.dumps({**metrics, "time": time.time()}, default=str) + "\n").encode("utf-8")
        fd = os.open(self.metrics, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            start = os.fstat(fd).st_size
            try:
                written = 0
                while written < len(line):
                    written += os.write(fd, line[written:])
            except OSError:
                os.ftruncate(fd, start)
                raise
        finally:
            os.close(fd)

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics.is_file():
            return []
        return [json.loads(line) for line in self.metrics.read_text(encoding="utf-8").splitlines() if line.strip()]

    def clear(self) -> None:
        """Remove the run's own files (a fresh run in a claimed folder); nothing else is touched."""
        import shutil

        self.path.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.checkpoints, ignore_errors=True)
        self.metrics.unlink(missing_ok=True)


@dataclass(frozen=True)
class Workdir:
    """Every path under the work folder, and where Ray and MLflow keep their state."""

    root: Path = Path(DEFAULT_WORKDIR)

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def writable(self) -> Path:
        """The folder, created if needed; IaaError when it cannot be written."""
        return ensure_writable(self.root, "the workdir", "give a writable `workdir` (or IAA_WORKDIR)")

    # --- datasets, runs, sweeps, ensembles -------------------------------------------------------
    # A name becomes a folder here only when it stays inside its parent (iaa.jobs.workdir.names).

    def data(self, dataset: str) -> Path:
        return self.root / "data" / names.component(dataset, "dataset")

    def run(self, name: str) -> RunFolder:
        return RunFolder(self.root / "runs" / names.component(name, "run name"))

    @property
    def sweeps(self) -> Path:
        return self.root / "sweeps"

    def sweep(self, name: str) -> Path:
        return self.sweeps / str(names.folder_name(name, "sweep name"))

    def sweep_record(self, name: str) -> Path:
        return self.sweep(name) / SWEEP_RECORD

    @property
    def ensembles(self) -> Path:
        return self.root / "ensembles"

    def ensemble(self, name: str) -> Path:
        return self.ensembles / str(names.folder_name(name, "ensemble name"))

    @property
    def teachers(self) -> Path:
        return self.root / "distill" / "teachers"

    def evaluation(self, checkpoint: Path) -> Path:
        """The folder of a checkpoint's predictions: ``evaluations/RUN-STEM-HASH``, the hash of its
        path within the work folder (so a moved folder keeps its names), or of its absolute path.
        A trial's checkpoint (``ray/SWEEP/TRIAL/checkpoint_000002/checkpoint.pt``) is named
        ``SWEEP-TRIAL-checkpoint_000002-HASH``."""
        checkpoint = Path(checkpoint)
        parent = checkpoint.parent
        if parent.name == "checkpoints":
            name = f"{parent.parent.name}-{checkpoint.stem}"
        elif parent.name.startswith("checkpoint_"):                      # Ray's folder of one checkpoint
            name = f"{parent.parent.parent.name}-{parent.parent.name}-{parent.name}"
        else:
            name = f"{parent.name}-{checkpoint.stem}"
        tag = hashlib.sha1(str(stored(checkpoint, self.root)).encode()).hexdigest()[:8]
        return self.root / "evaluations" / f"{name}-{tag}".lstrip("-")

    # --- Ray storage and the MLflow store ----------------------------------------------------------

    def storage(self, storage_path: str | None = None) -> str:
        """Ray's storage: ``--storage-path`` (an NFS path or a bucket URI), else ``WORKDIR/ray``."""
        return storage_path or str((self.root / "ray").resolve())

    TRACKING_DB = "mlflow.db"

    def optuna_storage(self, given: str | None = None) -> str:
        """A sweep's Optuna study store: ``--optuna-storage``, else the SQLite file ``WORKDIR/optuna.db``."""
        return given or f"{SQLITE}{(self.root / 'optuna.db').resolve()}"

    def tracking_db(self, tracking_uri: str | None = None) -> Path | None:
        """The SQLite file of the store :meth:`tracking_uri` names; None for a server."""
        uri = tracking_uri or os.environ.get(TRACKING_ENV)
        return sqlite_file(uri) if uri else self.root / self.TRACKING_DB

    def named_store(self, uri: str | None) -> str | None:
        """``uri`` as a next command must name it (``--tracking-uri``): None for this work folder's
        own store, which the command finds without the flag."""
        if not uri:
            return None
        db = sqlite_file(uri)
        own = (self.root / self.TRACKING_DB).resolve()
        return None if db is not None and db.resolve() == own else uri

    def tracking_uri(self, tracking_uri: str | None = None) -> str:
        """``--tracking-uri``, else ``MLFLOW_TRACKING_URI``, else the SQLite store ``WORKDIR/mlflow.db``.

        A SQLite store is checked here, so a damaged file fails before any job starts.
        """
        uri = tracking_uri or os.environ.get(TRACKING_ENV)
        if not uri:
            root = self.root.resolve()
            root.mkdir(parents=True, exist_ok=True)
            uri = f"{SQLITE}{root / self.TRACKING_DB}"
        db = sqlite_file(uri)
        problem = sqlite_problem(db) if db is not None else None
        if problem:
            raise IaaError(f"the MLflow store {db} is damaged: not a readable MLflow database ({problem}); move it "
                           "aside to start a fresh store (the runs it held are lost), or pass `tracking_uri`")
        return uri
