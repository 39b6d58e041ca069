"""Check a prepared folder against its manifest before any job reads it.

Every shard must exist with its recorded size, sha256 and row count, ``vocab.json`` must hash to
the manifest's ``vocab_hash``, and every row must hold values the model can index: the answer
among its candidates, ids within the vocabulary, list lengths as recorded and ``doc_cand``
within ``[-1, C)``. Any failure is one :class:`DataError` naming the file, what is wrong and the
``iaa-cli prepare`` command that rebuilds the folder.

Within one process a file already verified is skipped while its inode, size, modification and
change times are those it had then; any write to it changes its change time, so an edited file is
always read again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from iaa.data import bad_input as E
from iaa.data.prepared import manifest as M
from iaa.data.cloze import advice
from iaa.data.bad_input import DataError
from iaa.data.prepared.shards import SCHEMA, file_sha256

_VERIFIED: dict[str, tuple] = {}  # resolved path -> (stat identity, what it was checked against)


def verify(root: Path) -> M.Manifest:
    """Verify the prepared folder ``root``; return its manifest. Raises DataError on any damage."""
    root = Path(root)
    manifest = M.read(root)
    if manifest is None:
        raise DataError(f"no {M.MANIFEST}: not a prepared dataset; {advice.not_prepared(root)}", path=root,
                        reason=E.MISSING_SOURCE)
    try:
        _check_vocab(root, manifest)
        for split, entry in manifest.splits.items():
            rows = sum(_check_shard(root, shard, manifest.vocab_size) for shard in entry.shards)
            for where, counted in ((f"splits.{split}.count", entry.count),
                                   (f"counts.{split}", manifest.counts.get(split, rows))):
                if rows != counted:
                    raise _Damage(root / M.MANIFEST, f"the {split} split holds {rows} rows, the manifest's "
                                                     f"{where} says {counted}")
    except _Damage as damage:
        raise DataError(f"{damage.what}; {M.rebuild_hint(root, manifest)}", path=damage.path,
                        reason=E.MISSING_SOURCE) from None
    return manifest


class _Damage(Exception):
    def __init__(self, path: Path, what: str) -> None:
        super().__init__(what)
        self.path, self.what = path, what


def _check_vocab(root: Path, manifest: M.Manifest) -> None:
    """Check ``vocab.json``'s bytes against the manifest's hash."""
    path = root / M.VOCAB
    if not path.is_file():
        raise _Damage(path, "is missing")
    expected = (manifest.vocab_hash,)
    if not _unchanged(path, expected):
        if hashlib.sha256(path.read_bytes()).hexdigest() != manifest.vocab_hash:
            raise _Damage(path, "does not match the manifest's vocab_hash: it changed after prepare")
        _remember(path, expected)


def _check_shard(root: Path, shard: M.Shard, vocab_size: int) -> int:
    """Rows of one shard, after checking its size, checksum, row count and value ranges."""
    path = root / shard.file
    if not path.is_file():
        raise _Damage(path, "is missing (deleted after prepare?)")
    expected = (shard.sha256, shard.rows, vocab_size)
    if _unchanged(path, expected):
        return shard.rows
    if path.stat().st_size != shard.bytes:
        raise _Damage(path, f"has {path.stat().st_size} bytes, the manifest records {shard.bytes}: "
                            "it changed after prepare")
    if file_sha256(path) != shard.sha256:
        raise _Damage(path, "its sha256 differs from the manifest's: it changed after prepare")
    try:
        table = pq.read_table(path, schema=SCHEMA)
    except (OSError, pa.ArrowException) as err:
        raise _Damage(path, f"is not a readable shard ({err})") from None
    if table.num_rows != shard.rows:
        raise _Damage(path, f"holds {table.num_rows} rows, the manifest records {shard.rows}")
    problem = value_problem(table, vocab_size)
    if problem:
        raise _Damage(path, problem)
    _remember(path, expected)
    return table.num_rows


def value_problem(table: pa.Table, vocab_size: int) -> str | None:
    """What makes ``table``'s values unusable by the model (None: nothing): ranges and lengths."""
    n_cands = _lengths(table, "candidates")                                            # (N,)
    doc_lens = _lengths(table, "doc")
    answer = table.column("answer").to_numpy()
    if len(answer) and ((answer < 0) | (answer >= n_cands)).any():
        return f"row {int(np.flatnonzero((answer < 0) | (answer >= n_cands))[0])}: answer index outside its candidates"
    for name in ("doc", "query", "candidates"):
        low, high = _value_range(table, name)
        if low < 0 or high >= vocab_size:
            return f"{name} holds token id {low if low < 0 else high}, outside the vocabulary of {vocab_size}"
    checks = (("doc_len", doc_lens), ("query_len", _lengths(table, "query")),
              ("doc_cand length", _lengths(table, "doc_cand")), ("candidate_words length", _lengths(table, "candidate_words")))
    recorded = {"doc_len": table.column("doc_len").to_numpy(), "query_len": table.column("query_len").to_numpy(),
                "doc_cand length": doc_lens, "candidate_words length": n_cands}
    for name, actual in checks:
        bad = np.flatnonzero(actual != recorded[name])
        if len(bad):
            return f"row {int(bad[0])}: {name} {int(recorded[name][bad[0]])} differs from the list's length {int(actual[bad[0]])}"
    doc_cand = _values(table, "doc_cand")
    limit = np.repeat(n_cands, doc_lens)
    bad = np.flatnonzero((doc_cand < -1) | (doc_cand >= limit))
    if len(bad):
        return f"doc_cand value {int(doc_cand[bad[0]])} outside [-1, candidates)"
    return None


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)


def _lengths(table: pa.Table, name: str) -> np.ndarray:
    return pc.list_value_length(_column(table, name)).to_numpy(zero_copy_only=False)


def _values(table: pa.Table, name: str) -> np.ndarray:
    return _column(table, name).flatten().to_numpy(zero_copy_only=False)


def _value_range(table: pa.Table, name: str) -> tuple[int, int]:
    bounds = pc.min_max(_column(table, name).flatten())
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    return (0, 0) if low is None else (int(low), int(high))


def _identity(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _unchanged(path: Path, expected: tuple) -> bool:
    """``path`` was verified against ``expected`` in this process and has not changed since."""
    return _VERIFIED.get(str(path.resolve())) == (_identity(path), expected)


def _remember(path: Path, expected: tuple) -> None:
    _VERIFIED[str(path.resolve())] = (_identity(path), expected)


def forget() -> None:
    """Drop the record of verified files (tests; a new process starts empty)."""
    _VERIFIED.clear()
