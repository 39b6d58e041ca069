"""A sweep's record on disk: ``WORKDIR/sweeps/NAME/sweep.json``, read and written as a
:class:`SweepRecord` with one :class:`TrialRecord` per trial.

``sweep.json`` is written by ``iaa-cli tune`` and read by ``tune --resume``, the ensemble job
(which picks its members from the rows) and ``report --sweep``. Its keys are a contract::

    {"schema", "name", "dataset", "data_dir", "tracking_uri", "experiment", "parent_run_id",
     "storage", "address", "search_space", "sampler", "seed", "num_samples", "time_budget_s", "asha", "optuna", "base",
     "warm_start", "try_first", "workers_per_trial", "gpus_per_worker", "max_concurrent", "register",
     "trials": [row, ...], "wall_s", "spans"}

``schema`` is 1 (a record without it was written before it was versioned, and reads the same);
keys this version does not know are kept as they are when the record is written again; ``sampler`` names the Optuna sampler that proposed the
trials (:data:`~iaa.jobs.config.presets.SAMPLERS`; a record without it was searched by ``tpe``),
``seed`` the seed it proposed them with, ``try_first`` the configurations its first trials ran
(``tune --try-first``), ``workers_per_trial``, ``gpus_per_worker`` and ``register`` what a
resume runs its trials on and registers the best under, unless its command line says otherwise.
``wall_s`` is the time the sweep ran, over all its runs, and ``spans`` each run as ``[start,
seconds]`` (Unix seconds; a record without it was written before runs were recorded).
Paths inside the work folder (``data_dir``, ``storage``, ``tracking_uri``, ``optuna.storage`` and
each trial's ``checkpoint``) are stored relative to it and found again under the folder the
record is in now (:mod:`iaa.jobs.workdir.recorded`), so a copied or moved work folder reads its
own files. This module needs neither Ray nor MLflow.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field, fields as dataclass_fields, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from iaa.errors import IaaError
from iaa.files import atomic_write_text
from iaa.jobs.config.job_config import to_dict
from iaa.jobs.config.presets import DEFAULT_SAMPLER, SAMPLERS
from iaa.jobs.ports import Carried, TrialRecord
from iaa.jobs.sweeps.cost import duration
from iaa.jobs.workdir import recorded
from iaa.jobs.workdir.paths import SWEEP_RECORD, Workdir

SCHEMA = 1
FINISHED_STATUSES = frozenset({"TERMINATED", "ERROR"})
TABLE_ROWS = 10
PATH_KEYS = ("data_dir", "storage", "tracking_uri")   # besides optuna.storage and the trials' checkpoints


@dataclass(frozen=True)
class Asha:
    """The ASHA settings a sweep stops its trials with."""

    grace_period: int
    reduction_factor: float


@dataclass(frozen=True)
class Study:
    """Where a sweep's Optuna study lives."""

    storage: str
    study: str


@dataclass(frozen=True)
class SweepRecord:
    """A sweep as ``sweep.json`` records it (checked by :func:`check` when read).

    Older records may lack any key but ``name`` and ``trials``: such a sweep is read (an ensemble
    or a report can use its trials), but resumed only with what :data:`RESUME_KEYS` names.
    """

    name: str
    trials: tuple[TrialRecord, ...] = ()
    dataset: str | None = None
    data_dir: str | None = None
    tracking_uri: str | None = None
    experiment: str | None = None
    parent_run_id: str | None = None
    storage: str | None = None
    address: str | None = None                       # the Ray cluster it last ran on; None: a local Ray
    search_space: Mapping[str, Any] | None = None    # SearchSpace.to_json()'s object
    sampler: str | None = None                       # None: written before samplers were recorded (tpe)
    seed: int | None = None                          # the sampler's seed; None: written before it was recorded
    num_samples: int | None = None
    time_budget_s: float | None = None               # the trials' time in all, over every run; None: no limit
    asha: Asha | None = None
    optuna: Study | None = None
    base: Mapping[str, Any] | None = None            # the base JobConfig, as to_dict gives it
    warm_start: Carried | None = None                # the earlier sweep's trials its study began with
    try_first: tuple[Mapping[str, Any], ...] | None = None   # the configurations its first trials ran
    workers_per_trial: int | None = None
    gpus_per_worker: float | None = None             # None: written before it was recorded (no GPU)
    max_concurrent: int | None = None
    register: str | None = None                      # the registered model name the best trial goes to
    wall_s: float = 0.0
    # each run of the sweep's command, as (its start in Unix seconds, its seconds); None: written
    # before they were recorded. Between two, the sweep stood stopped.
    spans: tuple[tuple[float, float], ...] | None = None
    unknown: Mapping[str, Any] = field(default_factory=dict)    # keys of a newer version, written back as read

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SweepRecord:
        """A checked ``sweep.json`` object (its rows as JSON) as a record."""
        from iaa.jobs.workdir import fields

        values, unknown = fields.split_known(cls, data, "unknown")
        values["trials"] = tuple(TrialRecord.from_json(t) for t in data.get("trials") or [])
        values["asha"] = Asha(**data["asha"]) if data.get("asha") else None
        values["optuna"] = Study(**data["optuna"]) if data.get("optuna") else None
        values["warm_start"] = Carried.from_json(data["warm_start"]) if data.get("warm_start") else None
        values["try_first"] = tuple(dict(c) for c in data["try_first"]) if data.get("try_first") else None
        values["wall_s"] = float(data.get("wall_s") or 0.0)
        values["spans"] = tuple((float(start), float(seconds)) for start, seconds in data["spans"]) \
            if data.get("spans") is not None else None
        return cls(**values, unknown=unknown)

    def to_json(self) -> dict[str, Any]:
        """The ``sweep.json`` object, rows as JSON, keys as :func:`check` reads them."""
        data: dict[str, Any] = {"schema": SCHEMA, **self.unknown}
        for f in dataclass_fields(self):
            value = getattr(self, f.name)
            if f.name == "unknown" or value is None:
                continue
            data[f.name] = ([t.to_json() for t in value] if f.name == "trials"
                            else [dict(c) for c in value] if f.name == "try_first"
                            else vars(value).copy() if isinstance(value, (Asha, Study))
                            else value.to_json() if isinstance(value, Carried) else value)
        return data

    @property
    def finished(self) -> bool:
        """Nothing is left to run: the sweep spent its time budget, or it reached its number of
        trials and every one ended, none of them by losing its worker with no restores left
        (continuing runs that one again)."""
        return self.budget_spent or (bool(self.trials) and len(self.trials) >= (self.num_samples or 0)
                                     and all(t.status in FINISHED_STATUSES and not t.lost for t in self.trials))

    @property
    def budget_spent(self) -> bool:
        """The sweep's time budget ended it: the trials it stopped are cut (their checks count)."""
        return any(t.cut for t in self.trials)

    def with_run(self, trials: Sequence[TrialRecord], started: float, seconds: float) -> SweepRecord:
        """The record after a run that began at ``started`` (Unix seconds), ran ``seconds`` and
        left ``trials``."""
        return replace(self, trials=tuple(trials), wall_s=round(self.wall_s + seconds, 1),
                       spans=(*(self.spans or ()), (round(started, 3), round(seconds, 3))))


def sweep_dir(workdir: Path, name: str) -> Path:
    return Workdir(workdir).sweep(name)


def sweep_file(workdir: Path, name: str) -> Path:
    return Workdir(workdir).sweep_record(name)


def unique_name(base: str) -> str:
    """``base`` with a short random id, e.g. ``demo-iaa-3f9c2a``: runs never share a folder by default."""
    return f"{base}-{secrets.token_hex(3)}"


def read(path: Path) -> SweepRecord:
    """A ``sweep.json``, checked, with every path found where it is now (absolute)."""
    return SweepRecord.from_json(read_rows(path))


def read_resumable(path: Path) -> SweepRecord:
    """A ``sweep.json`` to resume (:func:`read`), refused in one line naming the file and the key
    when it lacks what a resume needs (:func:`check_resumable`)."""
    data = read_rows(path)
    check_resumable(path, data)
    return SweepRecord.from_json(data)


def check_study(record: SweepRecord, path: Path, has_study: Callable[[str, str], bool]) -> None:
    """RecordError naming ``path`` (the record) when ``has_study(storage, name)`` does not find
    the record's Optuna study in its recorded storage: a resume needs it."""
    from iaa.jobs.workdir.fields import RecordError

    assert record.optuna is not None                     # check_resumable: required
    if not has_study(record.optuna.storage, record.optuna.study):
        raise RecordError(f"{path}: optuna.study: no study {record.optuna.study!r} in {record.optuna.storage}; "
                          "the sweep cannot be resumed without it: run a new sweep under another `sweep_name`")


def read_rows(path: Path) -> dict[str, Any]:
    """A ``sweep.json`` as its JSON, with every path found where it is now (absolute)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise IaaError(f"{path}: not valid JSON ({err}); the sweep record is damaged") from err
    check(path, data)
    folder = Path(path).absolute().parent
    workdir = recorded.workdir_of(folder, "sweeps")
    return _paths(data, lambda text: recorded.located(text, workdir, folder))


def sampler(record: SweepRecord) -> str:
    """The sampler a sweep's record names; ``tpe`` for a record written before samplers were
    recorded; IaaError for a name this version does not know."""
    name = record.sampler or DEFAULT_SAMPLER
    if name not in SAMPLERS:
        raise IaaError(f"sweep {record.name}: unknown sampler {name!r} in its record; "
                       f"this version knows {', '.join(SAMPLERS)}")
    return name


# The kind of each key of sweep.json and of its trials' rows (iaa.jobs.workdir.fields).
HEADER = {"schema": "positive?", "name": "name", "dataset": "text?", "data_dir": "text?", "tracking_uri": "text?", "experiment": "text?",
          "parent_run_id": "text?", "storage": "text?", "address": "text?", "search_space": "mapping?", "sampler": "text?", "seed": "integer?",
          "optuna": "mapping?", "asha": "mapping?", "base": "mapping?", "num_samples": "positive?",
          "time_budget_s": "seconds?", "warm_start": "mapping?", "try_first": "list?",
          "workers_per_trial": "positive?", "gpus_per_worker": "share?", "max_concurrent": "positive?",
          "register": "text?", "wall_s": "number?", "spans": "spans?", "trials": "list"}
ROW = {"trial_id": "text", "config": "mapping", "params": "mapping?", "best_valid_acc": "accuracy?",
       "checkpoint": "text?", "mlflow_run_id": "text?", "status": "text", "checks": "count", "steps": "count",
       "stop_reason": "text?", "error": "text?", "name": "text?", "seconds": "seconds?"}
NESTED = {"asha": {"grace_period": "positive", "reduction_factor": "factor"},
          "optuna": {"storage": "text", "study": "text"},
          "search_space": {"params": "mapping", "fixed": "mapping?"},
          "warm_start": {"sweep": "name", "trials": "count", "best": "accuracy?", "left_out": "mapping?"}}
# What a resume runs from: the data, the stores, the search and its budget (older records may lack
# some keys; such a sweep is read, but not continued).
RESUME_KEYS = ("name", "dataset", "data_dir", "tracking_uri", "experiment", "parent_run_id", "storage",
               "search_space", "num_samples", "asha", "optuna", "trials")


def check(path: Path, data: Any) -> None:
    """RecordError naming ``path`` and the key when ``data`` (a sweep.json) holds a value of the wrong kind."""
    from iaa.jobs.workdir import fields

    fields.check(path, data, HEADER)
    for key, rules in NESTED.items():
        if data.get(key) is not None:
            fields.check(path, data[key], rules, where=f"{key}.")
    for name, param in (data.get("search_space") or {}).get("params", {}).items():
        fields.check(path, param, {"choices": "list?", "low": "number?", "high": "number?", "step": "number?"},
                     where=f"search_space.params.{name}.")
    for reason, trials in ((data.get("warm_start") or {}).get("left_out") or {}).items():
        fields.check(path, {reason: trials}, {reason: "count"}, where="warm_start.left_out.")
    for i, config in enumerate(data.get("try_first") or []):
        fields.check(path, config, {}, where=f"try_first[{i}]")
    for i, row in enumerate(data.get("trials") or []):
        fields.check(path, row, ROW, where=f"trials[{i}].")


def check_resumable(path: Path, data: Mapping[str, Any]) -> None:
    """RecordError naming ``path`` and the key when ``data`` (a checked sweep.json) lacks what a
    resume needs: the keys of :data:`RESUME_KEYS` and the ASHA settings and study they hold."""
    from iaa.jobs.workdir import fields

    why = ": the sweep cannot be resumed without it"
    fields.require(path, data, RESUME_KEYS, why=why)
    for key in ("asha", "optuna"):
        fields.require(path, data[key], NESTED[key], where=f"{key}.", why=why)
    fields.require(path, data["search_space"], ("params",), where="search_space.", why=why)


def write(path: Path, sweep: SweepRecord) -> None:
    """Write ``sweep`` atomically, so a reader never sees half a file; paths inside the work
    folder are stored relative to it."""
    workdir = recorded.workdir_of(Path(path).parent, "sweeps")
    data = _paths(sweep.to_json(), lambda text: recorded.stored(text, workdir))
    atomic_write_text(path, json.dumps(data, indent=1, default=str))


def _paths(data: Mapping[str, Any], convert: Callable[[str], str | None]) -> dict[str, Any]:
    """``data`` (trials as JSON rows) with ``convert`` applied to every path it records."""
    out = {**data, **{k: convert(data[k]) for k in PATH_KEYS if isinstance(data.get(k), str)}}
    if isinstance(data.get("optuna"), Mapping) and isinstance(data["optuna"].get("storage"), str):
        out["optuna"] = {**data["optuna"], "storage": convert(data["optuna"]["storage"])}
    out["trials"] = [{**row, "checkpoint": convert(row["checkpoint"])} if isinstance(row.get("checkpoint"), str)
                     else row for row in data.get("trials", [])]
    return out


def find(workdir: Path, name: str) -> Path:
    """The ``sweep.json`` of sweep ``name``; a default-named prefix (``demo-iaa``) means its latest run.

    Sweeps are named ``DATASET-MODEL-<id>`` by default, so ``--sweep demo-iaa`` finds the most
    recently written ``demo-iaa-<id>``. Raises :class:`IaaError` when there is none.
    """
    exact = sweep_file(workdir, name)
    if exact.is_file():
        return exact
    runs = [p for p in Workdir(workdir).sweeps.glob(f"{name}-*/{SWEEP_RECORD}") if _is_id(p.parent.name, name)]
    if runs:
        return max(runs, key=lambda p: p.stat().st_mtime)
    there = _held(workdir, "this work folder's")
    raise IaaError(f"no sweep {name!r}: {exact} does not exist; {there}")


def latest(workdir: Path, dataset: str, model_kind: str) -> Path:
    """The ``sweep.json`` of the most recently written sweep of ``dataset`` and ``model_kind``,
    whatever its name (a damaged record is passed over). Raises :class:`IaaError` when there is none."""
    for path in newest(workdir):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        base = data.get("base") if isinstance(data, Mapping) else None
        model = base.get("model") if isinstance(base, Mapping) else None
        kind = model.get("kind", "iaa") if isinstance(model, Mapping) else "iaa"
        if data.get("dataset") == dataset and kind == model_kind:
            return path
    raise IaaError(f"no sweep of {model_kind} on {dataset} in the work folder {Path(workdir).absolute()}; "
                   f"{_held(workdir, 'its')}")


def _held(workdir: Path, whose: str) -> str:
    """The sweeps ``workdir`` holds, newest first (``whose`` sweeps), for a refusal; or that it holds none."""
    held = [path.parent.name for path in newest(workdir)]
    if not held:
        return f"{Workdir(workdir).sweeps} holds no sweep: give the `workdir` a sweep ran in"
    return f"{whose} sweeps, newest first: {', '.join(held[:8])}{' ...' if len(held) > 8 else ''}"


def newest(workdir: Path) -> list[Path]:
    """The ``sweep.json`` of every sweep of ``workdir``, the most recently written first."""
    def written(path: Path) -> float:
        try:
            return path.stat().st_mtime
        except OSError:                   # removed meanwhile: last
            return 0.0

    return sorted(Workdir(workdir).sweeps.glob(f"*/{SWEEP_RECORD}"), key=written, reverse=True)


def _is_id(folder: str, prefix: str) -> bool:
    tail = folder[len(prefix) + 1:]
    return len(tail) == 6 and all(c in "0123456789abcdef" for c in tail)


def table(records: Sequence[TrialRecord], param_names: Sequence[str]) -> str:
    """The best trials first: rank, trial, status, checks, best valid accuracy, the trial's time and
    searched values."""
    ranked = sorted(records, key=lambda r: -(r.best_valid_acc if r.best_valid_acc is not None else -1))
    head = ["rank", "trial", "status", "checks", "valid_acc", "time", *[n.split(".")[-1] for n in param_names]]
    rows = [head]
    for i, r in enumerate(ranked[:TABLE_ROWS], 1):
        acc = f"{r.best_valid_acc:.4f}" if r.best_valid_acc is not None else "-"
        status = "stopped" if r.stop_reason == "asha" else "cut" if r.cut else r.status.lower()
        values = [_dotted(to_dict(r.config), n) for n in param_names]
        rows.append([str(i), r.label, status, str(r.checks), acc, duration(r.seconds) if r.seconds is not None else "-",
                     *[f"{v:g}" if isinstance(v, float) else str(v) for v in values]])
    widths = [max(len(row[c]) for row in rows) for c in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in rows)


def _dotted(data: Mapping[str, Any], name: str) -> Any:
    node: Any = data
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return ""
        node = node[part]
    return node
