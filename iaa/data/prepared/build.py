"""Parse sources in parallel, build the vocabulary from train, write shards, vocab and manifest.

The main thread reads (and gunzips) sources and hands each chunk to a thread pool; parsing,
id mapping and Parquet writing run in Arrow and numpy kernels that release the GIL, so the
threads use all cores without copying data between processes. Output does not depend on the
number of workers: chunking, vocabulary order and part boundaries are fixed by the input.
"""

from __future__ import annotations

import os
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iaa import logs
from iaa.data import bad_input as E
from iaa.data.prepared import manifest as M
from iaa.data.bad_input import DataError
from iaa.data.parsed import MAX_MESSAGES, ParsedChunk
from iaa.data.prepared.shards import chunk_ids, length_histogram, to_table, write_part
from iaa.data.prepared.vocab import Vocab

PART_ROWS = 10_000  # examples per Parquet part, at least (whole chunks are never split)
SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class SplitSource:
    """One split of a source: ``tasks()`` runs in the main thread and yields parse tasks for the pool."""

    split: str
    tasks: Callable[[], Iterator[Callable[[], ParsedChunk]]]


@dataclass(frozen=True)
class VocabOptions:
    placeholder: str
    min_count: int = 1
    max_size: int | None = None
    keep_pattern: str | None = None


def default_workers() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def build(out: Path, sources: list[SplitSource], vocab_opts: VocabOptions, *,
          header: Mapping[str, Any], workers: int | None = None, progress: bool = False) -> M.Manifest:
    """Write ``out/{vocab.json, manifest.json, <split>/part-*.parquet}``; return the manifest.

    ``out`` must be a new or empty directory; ``header`` (dataset, options, source) leads the manifest.
    Raises the first DataError of the sources (in file order) unless their tasks skip bad examples.
    """
    if not any(s.split == "train" for s in sources):
        raise DataError("the source has no train split, and the vocabulary is built from it",
                        reason=E.MISSING_SOURCE)
    out.mkdir(parents=True, exist_ok=True)
    bar = _progress(progress)
    with ThreadPoolExecutor(max_workers=workers or default_workers()) as pool:
        try:
            parsed = _parse_all(pool, sources, bar)
            _check_unique_ids(parsed)
            train = parsed["train"]
            vocab = Vocab.build(((c.words, c.word_counts) for c in train), placeholder=vocab_opts.placeholder,
                                min_count=vocab_opts.min_count, max_size=vocab_opts.max_size,
                                keep_pattern=vocab_opts.keep_pattern)
            ids = {id(c): i for cs in parsed.values() for c, i in zip(cs, chunk_ids(cs, vocab))}
            writes = {split: [(part, pool.submit(_write, group, vocab, [ids[id(c)] for c in group], out / split / part))
                              for part, group in _parts(chunks)]
                      for split, chunks in parsed.items()}
            shards = {split: [M.Shard(file=f"{split}/{part}", **f.result()) for part, f in fs] for split, fs in writes.items()}
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
        finally:
            if bar is not None:
                bar.close()
    vocab.save(out / M.VOCAB)
    manifest = M.Manifest.of(header, vocab_size=len(vocab), vocab_hash=vocab.sha256,
                             splits={s: _split_entry(cs, shards[s]) for s, cs in parsed.items()})
    M.write(out, manifest)
    return manifest


def _parse_all(pool: ThreadPoolExecutor, sources: list[SplitSource], bar) -> dict[str, list[ParsedChunk]]:
    futures: dict[str, list[Future]] = {s.split: [] for s in sources}
    failed: list[Future] = []

    def done(f: Future) -> None:
        if f.cancelled() or f.exception() is not None:
            failed.append(f)
        elif bar is not None:
            bar.update(len(f.result()))

    for source in sources:  # reading and gunzipping here overlaps with parsing in the pool
        for task in source.tasks():
            futures[source.split].append(f := pool.submit(task))
            f.add_done_callback(done)
            if failed:
                break  # a bad example was found: stop reading, report it below
        if failed:
            break
    return {split: [f.result() for f in fs] for split, fs in futures.items()}  # raises the first error in order


def _check_unique_ids(parsed: dict[str, list[ParsedChunk]]) -> None:
    """Raise DataError when two examples share an id (the same file twice, or in two splits)."""
    ids = [c.example_ids for cs in parsed.values() for c in cs if len(c)]
    if not ids:
        return
    counts = pc.value_counts(pa.chunked_array(ids, pa.string()))
    repeated = counts.filter(pc.greater(counts.field("counts"), 1))
    if len(repeated):
        first = repeated.field("values")[0].as_py()
        where = [f"{c.sources[i].as_py()} in {split}" if c.sources is not None else f"in {split}"
                 for split, cs in parsed.items() for c in cs
                 for i in np.flatnonzero(pc.equal(c.example_ids, first).to_numpy(zero_copy_only=False)).tolist()]
        raise DataError(f"example id {first!r} occurs {len(where)} times ({', '.join(where)}); "
                        f"{len(repeated)} id(s) repeat: is a question file in the source twice?",
                        reason=E.DUPLICATE_ID)


def _parts(chunks: list[ParsedChunk]) -> Iterator[tuple[str, list[ParsedChunk]]]:
    """Consecutive non-empty chunks grouped into parts of at least PART_ROWS examples."""
    group: list[ParsedChunk] = []
    rows, n = 0, 0
    for chunk in (c for c in chunks if len(c)):
        group.append(chunk)
        rows += len(chunk)
        if rows >= PART_ROWS:
            yield f"part-{n:05d}.parquet", group
            group, rows, n = [], 0, n + 1
    if group:
        yield f"part-{n:05d}.parquet", group


def _write(chunks: list[ParsedChunk], vocab: Vocab, ids: list, path: Path) -> dict:
    return write_part([to_table(c, vocab, i) for c, i in zip(chunks, ids)], path)


def _split_entry(chunks: list[ParsedChunk], shards: list[M.Shard]) -> M.Split:
    skipped: Counter = Counter()
    messages, truncated = [], []
    for c in chunks:
        skipped.update(c.skipped)
        messages.extend(c.skip_messages)
        truncated.extend(c.truncated)
    doc_lens = np.concatenate([np.diff(c.doc_offsets) for c in chunks]) if chunks else np.zeros(0, np.int64)
    return M.Split(count=int(sum(len(c) for c in chunks)), shards=tuple(shards), skipped=dict(sorted(skipped.items())),
                   skipped_examples=tuple(messages[:MAX_MESSAGES]), truncated=len(truncated),
                   truncated_examples=tuple(truncated[:MAX_MESSAGES]), doc_len_histogram=length_histogram(doc_lens))


def _progress(enabled: bool):
    return logs.progress("parsing", " ex", leave=False) if enabled else None
