"""The prepared data a run trains on, kept in its run folder: a resume finds its own data.

``RUN_DIR/data.json`` names the prepared folder, its dataset and its vocabulary's digest (the
manifest's ``vocab_hash``). The folder is stored relative to the command's work folder where it
lies inside it (:mod:`iaa.jobs.workdir.recorded`), so a resume in a moved or copied work folder
trains on that folder's own copy of the data. ``train`` with ``resume`` and no data takes the
data from here; data that is given is held to the record: another dataset or vocabulary (what a
checkpoint's weights are tied to) is refused naming both, while the same data in another place
(a moved or copied prepared folder) is taken, and the record then names that place. A run folder
written before the record needs its data given once; the resume then writes it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from iaa.data.prepared import manifest as manifest_mod
from iaa.errors import IaaError
from iaa.files import atomic_write_text
from iaa.jobs.workdir import fields, recorded
from iaa.jobs.workdir.paths import RunFolder

RECORD = "data.json"
RULES = {"data": "text", "dataset": "text", "vocab_hash": "text"}


class DataChangedError(IaaError):
    """A run is resumed on data other than the data it trained on."""


@dataclass(frozen=True)
class TrainedOn:
    """Prepared data as a run folder records it: where it is, and what makes it the same data."""

    data: Path
    dataset: str
    vocab_hash: str

    @classmethod
    def of(cls, prepared: Path) -> "TrainedOn":
        """The data in the prepared folder ``prepared`` (already verified by the caller)."""
        manifest = manifest_mod.read(Path(prepared))
        return cls(Path(prepared).resolve(), manifest.dataset if manifest else "",
                   manifest.vocab_hash if manifest else "")

    def same_data(self, other: "TrainedOn") -> bool:
        return (self.dataset, self.vocab_hash) == (other.dataset, other.vocab_hash)

    def identity(self) -> str:
        return f"{self.dataset or '?'}, vocabulary {self.vocab_hash[:12] or '?'}"

    def shown(self) -> str:
        return f"{self.data} ({self.identity()})"


def read(run_dir: Path, workdir: Path) -> TrainedOn | None:
    """The data that ``run_dir``'s run trained on, where it is now; None where no record is kept
    (a run from before the record). A damaged record is an error that names it."""
    path = Path(run_dir) / RECORD
    if not path.is_file():
        return None
    fix = "; remove it and resume with `data` or `dataset`"
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise IaaError(f"{path}: not valid JSON ({err}){fix}") from None
    fields.check(path, record, RULES)
    if not record.get("data"):
        raise IaaError(f"{path}: no data (the prepared folder) in it{fix}")
    data = recorded.located(record["data"], Path(workdir))
    return TrainedOn(Path(str(data)).resolve(), record.get("dataset", ""), record.get("vocab_hash", ""))


def data_to_resume(run_dir: Path, workdir: Path) -> Path:
    """The prepared folder that a resume of ``run_dir`` names no data for trains on: the one its
    record names. An error where there is no run to resume, no record, or its data is gone."""
    if not RunFolder(Path(run_dir)).resumable():
        raise IaaError(f"{run_dir}: nothing to resume: it holds no checkpoint of a run; give the folder of the "
                       "run to continue, or leave out `resume` and give `data` or `dataset` to start a run")
    then = read(run_dir, workdir)
    if then is None:
        raise IaaError(f"{run_dir}: no {RECORD} names the data its run trained on (a run from before run "
                       "folders recorded their data); resume it with `data` PREPARED_DIR or `dataset` NAME")
    if not then.data.is_dir():
        raise IaaError(f"{Path(run_dir) / RECORD}: its run trained on {then.data}, which is not there now; "
                       "resume it with `data` where that prepared folder is now")
    return then.data


def check(run_dir: Path, prepared: Path, workdir: Path) -> None:
    """Refuse to resume ``run_dir``'s run on ``prepared`` where its record names other data."""
    then, now = read(run_dir, workdir), TrainedOn.of(prepared)
    if then is None or then.same_data(now):
        return
    if then.data == now.data:
        raise DataChangedError(f"{run_dir}: {now.data} holds other data now ({now.identity()}) than its run "
                               f"trained on ({then.identity()}); prepare that data again, or give `overwrite` "
                               "or another `run_dir`")
    raise DataChangedError(f"{run_dir}: its run trained on {then.shown()}, not on {now.shown()}; resume it on its "
                           "own data (leave out `data` and `dataset`), or give `overwrite` or another `run_dir`")


def keep(run_dir: Path, prepared: Path, workdir: Path) -> None:
    """Record that ``run_dir``'s run trains on ``prepared`` (unless it already says so)."""
    now = TrainedOn.of(prepared)
    try:
        if read(run_dir, workdir) == now:
            return
    except IaaError:
        pass                     # a damaged record (a fresh run's folder) is written anew
    text = {"data": recorded.stored(now.data, Path(workdir)), "dataset": now.dataset,
            "vocab_hash": now.vocab_hash}
    atomic_write_text(Path(run_dir) / RECORD, json.dumps(text, indent=1) + "\n")
