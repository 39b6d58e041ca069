"""The table of pre-recorded learning curves (``curves.parquet``): its schema, writer and reader.

One row per validation check of one configuration of a fixed grid (written by
``build_table.py``). A search replayed against the table proposes a configuration from the grid's
choice lists and reads its curve instead of training it::

    t = table.load()
    curve = t.curve({"train.lr": 0.004, "model.steps": 3, ...})   # list[Check], in check order
    curve[-1].valid_acc, curve[-1].examples, curve[-1].seconds

Columns: one per searched knob (its dotted name, e.g. ``train.lr``), then ``config_id``,
``check`` (1-based), ``valid_acc``, ``best_valid_acc`` (the best check so far), ``examples``
(training examples seen, cumulative), ``seconds`` (training seconds, cumulative, validation
excluded), ``wall_seconds`` (cumulative, validation and checkpoints included) and ``epoch``.
The file's key-value metadata holds ``grid`` (JSON: dotted name -> list of choices, as
``iaa.jobs.config.search_space.DEMO_GRID``) and how the table was built (command, data, seed,
CPU, torch version, date).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

DEFAULT = Path(__file__).resolve().parent / "curves.parquet"

# The columns after the knobs, with their types.
CHECK_COLUMNS: dict[str, pa.DataType] = {
    "config_id": pa.int32(),
    "check": pa.int16(),
    "valid_acc": pa.float64(),
    "best_valid_acc": pa.float64(),
    "examples": pa.int64(),
    "seconds": pa.float64(),
    "wall_seconds": pa.float64(),
    "epoch": pa.float64(),
}
REQUIRED_METADATA = ("grid", "command")

Key = tuple[float, ...]   # a configuration: its knobs' values in the grid's order, as normalised floats


@dataclass(frozen=True)
class Check:
    """One validation check of one configuration (cumulative figures since its start)."""

    check: int              # 1-based
    valid_acc: float
    best_valid_acc: float
    examples: int           # training examples seen
    seconds: float          # training seconds (validation excluded)
    wall_seconds: float     # validation and checkpoints included
    epoch: float


@dataclass(frozen=True)
class CurveTable:
    """The grid, every configuration's curve, and the file's metadata (str -> str, ``grid`` parsed)."""

    grid: dict[str, list[Any]]
    curves: dict[Key, list[Check]]
    config_ids: dict[Key, int]
    metadata: dict[str, str]

    def key(self, params: Mapping[str, Any]) -> Key:
        """The key of ``params`` (every knob of the grid, extra keys ignored); KeyError names a missing one."""
        missing = [name for name in self.grid if name not in params]
        if missing:
            raise KeyError(f"configuration lacks {missing}; the grid searches {list(self.grid)}")
        return tuple(normalise(params[name]) for name in self.grid)

    def curve(self, params: Mapping[str, Any]) -> list[Check]:
        """The checks of the configuration ``params``; KeyError when it is not in the grid."""
        key = self.key(params)
        if key not in self.curves:
            raise KeyError(f"{dict(zip(self.grid, key))} is not a configuration of the table")
        return self.curves[key]


def normalise(value: Any) -> float:
    """A knob's value as a float with 12 significant digits: ``3``, ``3.0`` and ``np.int64(3)``
    match, and so do ``0.001`` and a float that differs from it in the last bits."""
    return float(f"{float(value):.12g}")


def write_table(rows: Sequence[Mapping[str, Any]], grid: Mapping[str, Sequence[Any]], path: Path,
                metadata: Mapping[str, str]) -> pa.Table:
    """Write ``rows`` (dicts with the knobs and ``CHECK_COLUMNS``) to ``path`` as zstd Parquet,
    sorted by config and check, with ``grid`` and ``metadata`` in the file's key-value metadata."""
    rows = sorted(rows, key=lambda r: (r["config_id"], r["check"]))
    knob_types = {name: pa.int32() if all(isinstance(v, int) for v in choices) else pa.float64()
                  for name, choices in grid.items()}
    schema = pa.schema([pa.field(n, t) for n, t in {**knob_types, **CHECK_COLUMNS}.items()])
    columns = {name: [r[name] for r in rows] for name in schema.names}
    meta = {**metadata, "grid": json.dumps({k: list(v) for k, v in grid.items()})}
    table = pa.Table.from_pydict(columns, schema=schema).replace_schema_metadata(meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, path, compression="zstd", compression_level=19)
    return table


def load(path: Path = DEFAULT) -> CurveTable:
    """Read the table at ``path``: the grid, each configuration's curve in check order, the metadata.
    SystemExit, one line, where there is no file."""
    if not Path(path).is_file():
        raise SystemExit(f"{path}: no curve table there; build it with python benchmarks/search/build_table.py "
                         "(20 to 40 minutes with --workers 2 on 2 cores; benchmarks/search/README.md)")
    table = pq.read_table(path)
    metadata = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    missing = [k for k in REQUIRED_METADATA if k not in metadata]
    if missing:
        raise ValueError(f"{path}: not a curve table, its metadata lacks {missing}")
    grid: dict[str, list[Any]] = json.loads(metadata["grid"])
    curves: dict[Key, list[Check]] = {}
    config_ids: dict[Key, int] = {}
    for row in table.sort_by([("config_id", "ascending"), ("check", "ascending")]).to_pylist():
        key = tuple(normalise(row[name]) for name in grid)
        config_ids[key] = row["config_id"]
        curves.setdefault(key, []).append(Check(
            check=row["check"], valid_acc=row["valid_acc"], best_valid_acc=row["best_valid_acc"],
            examples=row["examples"], seconds=row["seconds"], wall_seconds=row["wall_seconds"],
            epoch=row["epoch"]))
    return CurveTable(grid, curves, config_ids, metadata)
