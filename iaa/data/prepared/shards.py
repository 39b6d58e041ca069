"""Parquet shards: the row schema, mapping parsed chunks to vocabulary ids, and writing parts.

One row per example (see ``SCHEMA``). ``doc_cand[i]`` is the index into ``candidates`` of the
candidate whose word (after optional lowercasing) is document token ``i``, else -1. It is computed
from the words, not the ids, so two candidates that both map to ``<unk>`` keep their own positions.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from iaa.data.parsed import ParsedChunk
from iaa.files import atomic_write
from iaa.data.prepared.vocab import Vocab

SCHEMA = pa.schema([
    ("example_id", pa.string()),                 # CBT: "<file stem>:<first line>", CNN: the file name's stem
    ("doc", pa.list_(pa.int32())),               # (Ld,) vocab ids of the document
    ("query", pa.list_(pa.int32())),             # (Lq,) vocab ids of the query, the placeholder among them
    ("candidates", pa.list_(pa.int32())),        # (C,) vocab ids of the candidates, in file order
    ("candidate_words", pa.list_(pa.string())),  # (C,) the candidates as written in the file
    ("answer", pa.int32()),                      # index into candidates of the gold word
    ("doc_cand", pa.list_(pa.int32())),          # (Ld,) candidate index of each document token, -1 for none
                                                 # (int16 in schema version 1: read as int32)
    ("doc_len", pa.int32()),                     # Ld
    ("query_len", pa.int32()),                   # Lq
])
COMPRESSION = "zstd"
HIST_EDGES = (0, 64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 4096)  # document length buckets, tokens


def to_table(chunk: ParsedChunk, vocab: Vocab, ids: tuple[np.ndarray, np.ndarray] | None = None) -> pa.Table:
    """Map a chunk's words to vocabulary ids; one row per example, columns as ``SCHEMA``.

    ``ids``: precomputed (``vocab.ids(chunk.words)``, ``vocab.ids(chunk.cand_keys)``), see ``chunk_ids``.
    """
    word_ids, cand_ids = ids if ids is not None else chunk_ids([chunk], vocab)[0]   # (D,), (sum C,)
    doc_lens, query_lens = np.diff(chunk.doc_offsets), np.diff(chunk.query_offsets)
    return pa.Table.from_arrays([
        chunk.example_ids.cast(pa.string()),
        _lists(chunk.doc_offsets, pa.array(word_ids[chunk.doc], pa.int32())),
        _lists(chunk.query_offsets, pa.array(word_ids[chunk.query], pa.int32())),
        _lists(chunk.cand_offsets, pa.array(cand_ids, pa.int32())),
        _lists(chunk.cand_offsets, chunk.cand_words.cast(pa.string())),
        pa.array(chunk.answer, pa.int32()),
        _lists(chunk.doc_offsets, pa.array(chunk.doc_cand, pa.int32())),
        pa.array(doc_lens.astype(np.int32)),
        pa.array(query_lens.astype(np.int32)),
    ], schema=SCHEMA)


def chunk_ids(chunks: Sequence[ParsedChunk], vocab: Vocab) -> list[tuple[np.ndarray, np.ndarray]]:
    """Vocabulary ids of each chunk's words and candidate keys, in one lookup for all chunks."""
    ids = vocab.ids_many([c.words for c in chunks] + [c.cand_keys for c in chunks])
    return list(zip(ids[:len(chunks)], ids[len(chunks):]))


def _lists(offsets: np.ndarray, values: pa.Array) -> pa.ListArray:
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), values)


def write_part(tables: Sequence[pa.Table], path: Path) -> dict:
    """Write tables as one zstd Parquet file, atomically; returns its manifest entry (rows, bytes, sha256).

    A full disk raises :class:`iaa.files.DiskFullError` naming ``path`` and leaves no partial file.
    """
    table = pa.concat_tables(tables) if len(tables) != 1 else tables[0]
    atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression=COMPRESSION, use_dictionary=False,
                                                  write_statistics=False))
    return {"rows": table.num_rows, "bytes": path.stat().st_size, "sha256": file_sha256(path)}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def length_histogram(doc_lens: np.ndarray) -> dict:
    """Counts of documents per length bucket ``[edges[i], edges[i+1])``, the last one open-ended."""
    counts = np.bincount(np.searchsorted(HIST_EDGES, doc_lens, side="right") - 1, minlength=len(HIST_EDGES))
    stats = {"min": int(doc_lens.min()), "mean": round(float(doc_lens.mean()), 2), "max": int(doc_lens.max())} \
        if len(doc_lens) else {"min": 0, "mean": 0.0, "max": 0}
    return {"edges": list(HIST_EDGES), "counts": counts.tolist(), **stats}
