"""Torch side of the data: open a prepared directory, plan length-bucketed batches, pad them.

``iter_batches`` groups documents of similar length (a shuffled pool of ``POOL_BATCHES`` batches
is sorted by length and cut), then shuffles the batch order by (seed, epoch). Every example is in
exactly one batch per epoch; with ``world_size`` > 1 each rank gets a disjoint share of the same
plan with an equal number of batches, which data-parallel training needs to stay in step.

Data-parallel workers read only their own rows of the training split (:meth:`PreparedData.rank_rows`:
a contiguous share of the shards in manifest order, so every rank reads each shard file at most
once and no row is read by two ranks), then plan their epochs over those rows as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from iaa.data import bad_input as E
from iaa.data.prepared import manifest as M
from iaa.data.loading.batch import Batch
from iaa.data.bad_input import DataError
from iaa.data.prepared.shards import SCHEMA
from iaa.data.prepared.vocab import Vocab

TEACHER_COLUMN = "teacher_probs"  # optional list<float32> column of soft targets (iaa.jobs.distill.distill)
POOL_BATCHES = 50  # batches per length-sorted pool: larger pools pad less but shuffle less
READ_BATCH_ROWS = 2048  # rows decoded at a time when a worker reads its share of a shard


@dataclass(frozen=True)
class PreparedData:
    """A directory written by ``iaa-cli prepare``: its manifest, vocabulary and shards."""

    root: Path
    manifest: M.Manifest
    vocab: Vocab

    @classmethod
    def open(cls, root: Path) -> "PreparedData":
        root = Path(root)
        manifest = M.read(root)
        if manifest is None:
            raise DataError("no manifest.json: not a prepared dataset (run iaa-cli prepare)", path=root,
                            reason=E.MISSING_SOURCE)
        return cls(root, manifest, Vocab.load(root / M.VOCAB))

    @property
    def splits(self) -> tuple[str, ...]:
        return tuple(self.manifest.splits)

    def table(self, split: str) -> pa.Table:
        """All rows of one split, in file order (columns as ``iaa.data.prepared.shards.SCHEMA``)."""
        self._need_split(split)
        files = [self.root / s.file for s in self.manifest.splits[split].shards]
        if not files:
            return SCHEMA.empty_table()
        return pa.concat_tables(pq.read_table(f, schema=SCHEMA) for f in files)

    def rows(self, split: str, start: int, stop: int) -> pa.Table:
        """Rows ``[start, stop)`` of one split, reading only the shards that hold them."""
        self._need_split(split)
        parts, offset = [], 0
        for shard in self.manifest.splits[split].shards:
            n = shard.rows
            lo, hi = max(start, offset), min(stop, offset + n)
            if lo < hi:
                parts += _read_range(self.root / shard.file, lo - offset, hi - offset)
            offset += n
        return pa.Table.from_batches(parts).cast(SCHEMA) if parts else SCHEMA.empty_table()

    def rank_rows(self, split: str, rank: int, world_size: int) -> pa.Table:
        """This rank's contiguous share of a split (see :func:`rank_range`), read from its shards only."""
        self._need_split(split)
        total = sum(s.rows for s in self.manifest.splits[split].shards)
        return self.rows(split, *rank_range(total, rank, world_size))

    def _need_split(self, split: str) -> None:
        if split not in self.manifest.splits:
            raise DataError(f"no {split!r} split here (have {', '.join(self.splits)})", path=self.root,
                            reason=E.MISSING_SOURCE)


def _read_range(path: Path, start: int, stop: int) -> list[pa.RecordBatch]:
    """Rows ``[start, stop)`` of one Parquet file, streamed: at most one decoded batch beyond them."""
    kept, offset = [], 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=READ_BATCH_ROWS):
        lo, hi = max(start, offset), min(stop, offset + batch.num_rows)
        if lo < hi:
            kept.append(batch.slice(lo - offset, hi - lo))
        offset += batch.num_rows
        if offset >= stop:
            break
    return kept


class _Columns:
    """A table's list columns as flat numpy arrays plus offsets, so batches are cut without Arrow calls."""

    def __init__(self, table: pa.Table) -> None:
        self.doc, self.doc_off = _flat(table.column("doc"))
        self.query, self.query_off = _flat(table.column("query"))
        self.doc_cand, _ = _flat(table.column("doc_cand"))
        _, self.cand_off = _flat(table.column("candidates"))
        self.answer = table.column("answer").to_numpy()
        self.example_id = np.array(table.column("example_id").to_pylist(), dtype=object)
        self.doc_len = np.diff(self.doc_off)
        self.teacher = _flat(table.column(TEACHER_COLUMN)) if TEACHER_COLUMN in table.column_names else None

    def batch(self, rows: np.ndarray) -> Batch:
        doc, doc_mask = _pad(self.doc, self.doc_off, rows, 0)
        query, query_mask = _pad(self.query, self.query_off, rows, 0)
        doc_cand, _ = _pad(self.doc_cand, self.doc_off, rows, -1)
        n_cand = self.cand_off[rows + 1] - self.cand_off[rows]
        cand_mask = np.arange(max(int(n_cand.max(initial=0)), 1))[None, :] < n_cand[:, None]   # (B, C)
        return Batch(
            doc=torch.from_numpy(doc), doc_mask=torch.from_numpy(doc_mask),
            query=torch.from_numpy(query), query_mask=torch.from_numpy(query_mask),
            doc_cand=torch.from_numpy(doc_cand), cand_mask=torch.from_numpy(cand_mask),
            answer=torch.from_numpy(self.answer[rows].astype(np.int64)),
            example_ids=self.example_id[rows].tolist(),
            teacher=None if self.teacher is None else torch.from_numpy(self._teacher(rows, cand_mask.shape[1])),
            doc_lengths=torch.from_numpy(doc_mask.sum(1)), query_lengths=torch.from_numpy(query_mask.sum(1)),
        )

    def _teacher(self, rows: np.ndarray, width: int) -> np.ndarray:
        """The rows' soft targets, (B, C) float32, 0 past each row's candidates."""
        values, offsets = self.teacher
        out = np.zeros((len(rows), width), dtype=np.float32)
        for b, row in enumerate(rows):
            row_values = values[offsets[row]:offsets[row + 1]]
            out[b, : len(row_values)] = row_values
        return out


def _flat(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """list column -> (values (sum L,), offsets (N+1,) int64)."""
    arr = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]]
    return values, offsets - offsets[0]


def _pad(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of a ragged array as a padded (B, L) int64 array and its (B, L) bool mask (True: real)."""
    lens = offsets[rows + 1] - offsets[rows]                                     # (B,)
    width = max(int(lens.max(initial=0)), 1)
    mask = np.arange(width)[None, :] < lens[:, None]                             # (B, L)
    out = np.full((len(rows), width), fill, dtype=np.int64)
    starts = np.repeat(offsets[rows], lens)                                      # (sum L,) source row start
    within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    out[mask] = values[starts + within]
    return out, mask


def collate(table: pa.Table) -> Batch:
    """All rows of ``table`` (a slice of a split) as one padded batch, in row order."""
    return _Columns(table).batch(np.arange(table.num_rows))


def rank_range(total: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of rank's contiguous share of ``total`` rows; shares differ by at most one row."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank} of {world_size}")
    return rank * total // world_size, (rank + 1) * total // world_size


def num_batches(n: int, batch_size: int, world_size: int = 1) -> int:
    """Batches per rank per epoch for ``n`` examples."""
    total = math.ceil(n / batch_size)
    return math.ceil(total / world_size) if n else 0


def batch_plan(doc_lens: np.ndarray, batch_size: int, *, seed: int, epoch: int, shuffle: bool = True,
               rank: int = 0, world_size: int = 1) -> list[np.ndarray]:
    """Row indices of each of this rank's batches; every row is in exactly one batch over all ranks.

    The number of batches is rounded up to a multiple of ``world_size`` and rows are spread so that
    batch sizes differ by at most one (and never exceed ``batch_size``). Without ``shuffle`` batches
    go by increasing document length (deterministic, for evaluation).
    """
    if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need batch_size >= 1 and 0 <= rank < world_size, got {batch_size}, {rank}, {world_size}")
    n = len(doc_lens)
    if n == 0:
        return []
    if n < world_size:
        raise ValueError(f"{n} examples cannot be split over {world_size} ranks")
    count = num_batches(n, batch_size, world_size) * world_size
    if shuffle:
        rng = np.random.default_rng([seed, epoch])
        perm = rng.permutation(n)
        pool = batch_size * POOL_BATCHES
        order = np.concatenate([p[np.argsort(doc_lens[p], kind="stable")]
                                for p in np.split(perm, np.arange(pool, n, pool))])
    else:
        order = np.argsort(doc_lens, kind="stable")
    sizes = np.full(count, n // count)
    sizes[:n % count] += 1
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    batches = [order[bounds[i]:bounds[i + 1]] for i in range(count)]
    if shuffle:
        batches = [batches[i] for i in rng.permutation(count)]
    return batches[rank::world_size]


def iter_batches(table: pa.Table, batch_size: int, *, seed: int, epoch: int, shuffle: bool = True,
                 rank: int = 0, world_size: int = 1) -> Iterator[Batch]:
    """Padded, length-bucketed batches of ``table`` for one epoch (see ``batch_plan``)."""
    cols = _Columns(table)
    for rows in batch_plan(cols.doc_len, batch_size, seed=seed, epoch=epoch, shuffle=shuffle,
                           rank=rank, world_size=world_size):
        yield cols.batch(rows)
