"""A sweep's record on disk: ``WORKDIR/sweeps/NAME/sweep.json``, one typed row per trial.

``sweep.json`` is written by ``iaa-cli tune`` (through the platform) and read by the ensemble
job, which picks its members from the rows. Its keys are a contract::

    {"name", "dataset", "data_dir", "tracking_uri", "experiment", "parent_run_id", "storage",
     "search_space", "num_samples", "workers_per_trial", "max_concurrent", "trials": [row, ...],
     "wall_s"}

with one :class:`TrialRecord` per row. This module needs neither Ray nor MLflow.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.errors import IaaError
from iaa.files import atomic_write_text
from iaa.jobs.config import JobConfig, from_dict, to_dict
from iaa.jobs.workdir import Workdir

FAILED_STATUSES = frozenset({"ERROR", "FAILED"})
FINISHED_STATUSES = frozenset({"TERMINATED", "ERROR"})
TABLE_ROWS = 10


@dataclass(frozen=True)
class TrialRecord:
    """One trial of a sweep (or one member trained for an ensemble), as ``sweep.json`` stores it."""

    trial_id: str
    config: JobConfig
    params: Mapping[str, Any] = field(default_factory=dict)   # the Tune config: sampled values
    best_valid_acc: float | None = None
    checkpoint: str | None = None          # the best checkpoint file, readable from the driver
    mlflow_run_id: str | None = None
    status: str = "TERMINATED"             # Tune's: TERMINATED, ERROR, or unfinished (RUNNING, PENDING ...)
    checks: int = 0
    steps: int = 0
    stop_reason: str = ""                  # the loop's (patience, max_epochs ...), or "asha"
    error: str | None = None

    @property
    def failed(self) -> bool:
        return self.status in FAILED_STATUSES

    @property
    def scored(self) -> bool:
        """Finished without error and made at least one validation check."""
        return self.best_valid_acc is not None and not self.failed

    def to_json(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in fields(self)}
        return {**row, "config": to_dict(self.config), "params": dict(self.params)}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> "TrialRecord":
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in row.items() if k in known}
        acc = values.get("best_valid_acc")
        return cls(**{**values, "config": from_dict(row["config"]), "params": dict(row.get("params") or {}),
                      "best_valid_acc": float(acc) if acc is not None else None})


def sweep_dir(workdir: Path, name: str) -> Path:
    return Workdir(workdir).sweep(name)


def sweep_file(workdir: Path, name: str) -> Path:
    return sweep_dir(workdir, name) / "sweep.json"


def unique_name(base: str) -> str:
    """``base`` with a short random id, e.g. ``demo-iaa-3f9c2a``: runs never share a folder by default."""
    return f"{base}-{secrets.token_hex(3)}"


def read(path: Path) -> dict[str, Any]:
    """A ``sweep.json``: its header as written, with ``trials`` as :class:`TrialRecord` objects."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise IaaError(f"{path}: not valid JSON ({err}); the sweep record is damaged") from err
    return {**data, "trials": [TrialRecord.from_json(t) for t in data.get("trials", [])]}


def write(path: Path, sweep: Mapping[str, Any]) -> None:
    """Write ``sweep`` (``trials`` as records) atomically, so a reader never sees half a file."""
    data = {**sweep, "trials": [t.to_json() for t in sweep.get("trials", [])]}
    atomic_write_text(path, json.dumps(data, indent=1, default=str))


def find(workdir: Path, name: str) -> Path:
    """The ``sweep.json`` of sweep ``name``; a default-named prefix (``demo-iaa``) means its latest run.

    Sweeps are named ``DATASET-MODEL-<id>`` by default, so ``--sweep demo-iaa`` finds the most
    recently written ``demo-iaa-<id>``. Raises :class:`IaaError` when there is none.
    """
    exact = sweep_file(workdir, name)
    if exact.is_file():
        return exact
    runs = [p for p in Workdir(workdir).sweeps.glob(f"{name}-*/sweep.json") if _is_id(p.parent.name, name)]
    if runs:
        return max(runs, key=lambda p: p.stat().st_mtime)
    raise IaaError(f"no sweep {name!r}: {exact} does not exist (run `iaa-cli tune --name {name}` first)")


def _is_id(folder: str, prefix: str) -> bool:
    tail = folder[len(prefix) + 1:]
    return len(tail) == 6 and all(c in "0123456789abcdef" for c in tail)


def table(records: Sequence[TrialRecord], param_names: Sequence[str]) -> str:
    """The best trials first: rank, trial, status, checks, best valid accuracy and searched values."""
    ranked = sorted(records, key=lambda r: -(r.best_valid_acc if r.best_valid_acc is not None else -1))
    head = ["rank", "trial", "status", "checks", "valid_acc", *[n.split(".")[-1] for n in param_names]]
    rows = [head]
    for i, r in enumerate(ranked[:TABLE_ROWS], 1):
        acc = f"{r.best_valid_acc:.4f}" if r.best_valid_acc is not None else "-"
        status = "stopped" if r.stop_reason == "asha" else r.status.lower()
        values = [_dotted(to_dict(r.config), n) for n in param_names]
        rows.append([str(i), r.trial_id, status, str(r.checks), acc,
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


# Short names of the paper's hyperparameters, for run names and table columns.
SHORT_NAMES = {"train.lr": "lr", "model.steps": "T", "model.hidden_dim": "h", "model.embed_dim": "d",
               "model.state_dim": "s", "train.batch_size": "B", "model.dropout": "dropout"}


def short_name(key: str) -> str:
    """``model.steps`` -> ``T``; an unknown key keeps its last dotted part."""
    return SHORT_NAMES.get(key, key.split(".")[-1])


def short_value(value: Any) -> str:
    """``0.004`` -> ``4e-3``, ``64`` -> ``64``: compact and exact for the values a grid holds."""
    if isinstance(value, float) and not value.is_integer() and abs(value) < 0.01:
        mantissa, exponent = f"{value:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def config_label(params: Mapping[str, Any]) -> str:
    """What distinguishes a trial: ``lr=4e-3 T=2 h=64`` from its searched values."""
    return " ".join(f"{short_name(k)}={short_value(v)}" for k, v in sorted(params.items(), key=lambda kv: _order(kv[0])))


def _order(key: str) -> tuple[int, str]:
    names = list(SHORT_NAMES)
    return (names.index(key), key) if key in names else (len(names), key)
