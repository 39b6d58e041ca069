"""An ensemble's record on disk: ``WORKDIR/ensembles/NAME/ensemble.json``, written by ``iaa-cli
ensemble`` and read by ``serve``, ``predict`` and ``distill``.

Every path it names inside the work folder (the members, ``all_members``, the keys of
``member_sha256``, ``data_dir``, ``ensemble_dir``, the predictions and the table, a SQLite
``tracking_uri``) is stored relative to the work folder and read back where the folder is now
(:mod:`iaa.jobs.workdir.recorded`); a path outside it stays absolute. A member is checked against
the sha256 recorded for it when it is read.

It is read and written as an :class:`EnsembleRecord` (``schema`` 1); a record without ``schema``,
written before it was versioned, reads the same, and keys this version does not know are kept and
written back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from typing import Any, Callable, Mapping

from iaa.errors import IaaError
from iaa.files import atomic_write_text
from iaa.jobs.workdir import fields, recorded
from iaa.jobs.workdir.paths import ENSEMBLE_RECORD

SUMMARY = ENSEMBLE_RECORD   # what `iaa-cli ensemble` writes into its folder
PATH_KEYS = ("data_dir", "ensemble_dir", "predictions", "table_path", "tracking_uri")
PATH_LISTS = ("members", "all_members")
# The kind of each key that is read back (iaa.jobs.workdir.fields): names become folders, numbers are shown.
RULES = {"name": "name", "dataset": "text?", "sweep": "name?", "data_dir": "text?", "ensemble_dir": "text?",
         "tracking_uri": "text?", "valid_acc": "accuracy?", "test_acc": "accuracy?",
         "mean_member_valid_acc": "accuracy?", "mean_member_test_acc": "accuracy?",
         "mean_selected_valid_acc": "accuracy?", "mean_selected_test_acc": "accuracy?",
         "member_valid_acc": "list?", "member_test_acc": "list?", "member_sha256": "mapping?", "all_members": "list?",
         "temperature": "temperature?", "baseline_valid_acc": "accuracy?", "baseline_test_acc": "accuracy?"}


SCHEMA = 1


@dataclass(frozen=True)
class EnsembleRecord:
    """An ensemble as ``ensemble.json`` records it: what its readers (``serve``, ``predict``,
    ``distill``) read as fields; its other figures (each member's accuracy, the selection, Boo(n),
    the files written: what ``iaa-cli ensemble`` returned, see
    :class:`iaa.jobs.ensemble.ensemble_result.EnsembleResult`) and the keys of a newer version in
    ``rest``, written back as read."""

    members: tuple[str, ...]                      # the selected members' checkpoints
    name: str | None = None
    dataset: str | None = None
    sweep: str | None = None
    data_dir: str | None = None
    ensemble_dir: str | None = None
    tracking_uri: str | None = None
    mlflow_run_id: str | None = None
    model_uri: str | None = None
    valid_acc: float | None = None
    test_acc: float | None = None
    temperature: float | None = None              # its distributions' scale, fitted on valid; None: 1.0
    member_valid_acc: tuple[float, ...] = ()
    all_members: tuple[str, ...] = ()
    member_sha256: Mapping[str, str] = field(default_factory=dict)   # checkpoint -> its sha256 when first read
    rest: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EnsembleRecord:
        """An ``ensemble.json`` object (checked) as a record."""
        known, rest = fields.split_known(cls, data, "rest")
        values = {k: tuple(v) if k in ("members", "all_members", "member_valid_acc") else v
                  for k, v in known.items() if v is not None}
        return cls(**values, rest=rest)

    def to_json(self) -> dict[str, Any]:
        """The ``ensemble.json`` object, in the order its keys were written."""
        data: dict[str, Any] = {"schema": SCHEMA}
        for f in dataclass_fields(self):
            value = getattr(self, f.name)
            if f.name != "rest" and value is not None:
                data[f.name] = list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value
        return {**data, **self.rest}

    @property
    def best_member_valid_acc(self) -> float | None:
        scores = [a for a in self.member_valid_acc if isinstance(a, (int, float))]
        return max(scores) if scores else None


def write(out_dir: Path, record: EnsembleRecord) -> Path:
    """Write ``record`` (absolute paths) as ``OUT_DIR/ensemble.json``, atomically."""
    workdir = recorded.workdir_of(Path(out_dir), "ensembles")
    data = _paths(record.to_json(), lambda text: recorded.stored(text, workdir))
    path = Path(out_dir) / SUMMARY
    atomic_write_text(path, json.dumps(data, indent=1, default=str))
    return path


def read(ensemble_dir: Path) -> EnsembleRecord:
    """``ensemble.json`` of ``ensemble_dir`` with its paths found where they are now (absolute).

    Raises:
        IaaError: the folder holds no ``ensemble.json``, or it lists no checkpoint paths as ``members``.
    """
    summary = Path(ensemble_dir) / SUMMARY
    if not summary.is_file():
        raise IaaError(f"{ensemble_dir} holds no {SUMMARY}: give the folder `iaa-cli ensemble` wrote")
    try:
        data = json.loads(summary.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise IaaError(f"{summary}: not valid JSON ({err}); re-run `iaa-cli ensemble` to write it again") from None
    fields.check(summary, data, RULES)
    members = data.get("members") if isinstance(data, dict) else None
    if not isinstance(members, list) or not all(isinstance(m, str) and m for m in members):
        raise IaaError(f"{summary}: 'members' must be a list of checkpoint paths; re-run `iaa-cli ensemble`")
    folder = Path(ensemble_dir)
    workdir = recorded.workdir_of(folder.absolute(), "ensembles")
    return EnsembleRecord.from_json(_paths(data, lambda text: recorded.located(text, workdir, folder.absolute())))


def _paths(data: Mapping[str, Any], convert: Callable[[str], str | None]) -> dict[str, Any]:
    """``data`` with ``convert`` applied to every path it records (members, their digests' keys)."""
    out = {**data, **{k: convert(str(data[k])) for k in PATH_KEYS if isinstance(data.get(k), (str, Path))}}
    for key in PATH_LISTS:
        if isinstance(data.get(key), list):
            out[key] = [convert(str(m)) if isinstance(m, (str, Path)) else m for m in data[key]]
    if isinstance(data.get("member_sha256"), dict):
        out["member_sha256"] = {convert(str(k)): v for k, v in data["member_sha256"].items()}
    return out


def members(ensemble_dir: Path) -> list[Path]:
    """The selected members' checkpoints of an ``iaa-cli ensemble`` output folder.

    Each is found where the work folder is now and checked against the sha256 that
    ``ensemble.json`` recorded for it (an ensemble written before digests were recorded is read
    without that check); a missing or changed member is refused.
    """
    from iaa.data.prepared.shards import file_sha256

    summary = Path(ensemble_dir) / SUMMARY
    record = read(ensemble_dir)
    found = record.members
    if not found:
        raise IaaError(f"{summary} lists no members")
    digests = record.member_sha256
    for member in found:
        if not isinstance(digests, dict) or (digests and member not in digests):
            raise IaaError(f"{summary}: no sha256 recorded for member {member}; re-run `iaa-cli ensemble`")
    for member in found:
        if not Path(member).is_file():
            raise IaaError(f"{summary}: member {member} is missing; re-run `iaa-cli ensemble`")
        if digests and file_sha256(Path(member)) != digests[member]:
            raise IaaError(f"{member}: changed since the ensemble {ensemble_dir} was made (its sha256 differs "
                           f"from the one in {SUMMARY}); re-run `iaa-cli ensemble` with the members you mean")
    return [Path(m) for m in found]


def temperature(ensemble_dir: Path) -> float:
    """What the ensemble's averaged distributions are scaled by when it answers: the temperature
    ``iaa-cli ensemble`` fitted on valid, or 1.0 for an ensemble made without one."""
    return read(ensemble_dir).temperature or 1.0
