"""``manifest.json``: what a prepared dataset holds, and whether it is still current.

A prepared directory is current when its manifest has this schema version, the same dataset,
options and source fingerprint, and every shard it lists is present with its recorded size;
``iaa.data.prepared.verify`` then checks the shards' contents. :class:`Manifest` is the file as a typed
record: :func:`read` checks its form, and :meth:`Manifest.to_json` writes it back key for key.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from iaa.data import bad_input as E
from iaa.data.bad_input import DataError
from iaa.files import atomic_write_text

SCHEMA_VERSION = 2         # 2: doc_cand is int32 (1: int16, which wraps past 32,767 candidates)
READABLE_VERSIONS = (1, 2)  # a version-1 folder still loads; `prepare` rewrites it
MANIFEST = "manifest.json"
VOCAB = "vocab.json"


@dataclass(frozen=True)
class Shard:
    """One Parquet file of a split, as written (:func:`iaa.data.prepared.shards.write_part`)."""

    file: str        # relative to the prepared folder: ``train/part-00000.parquet``
    rows: int
    bytes: int
    sha256: str


@dataclass(frozen=True)
class Split:
    """One split: its questions, the shards that hold them, and what ``prepare`` left out of it."""

    count: int
    shards: tuple[Shard, ...]
    skipped: Mapping[str, int] = field(default_factory=dict)     # reason -> bad examples skipped
    skipped_examples: tuple[str, ...] = ()                       # the first few, said
    truncated: int = 0                                           # trailing examples cut off
    truncated_examples: tuple[str, ...] = ()
    doc_len_histogram: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "skipped": dict(self.skipped), "skipped_examples": list(self.skipped_examples),
                "truncated": self.truncated, "truncated_examples": list(self.truncated_examples),
                "shards": [vars(s).copy() for s in self.shards], "doc_len_histogram": dict(self.doc_len_histogram)}


@dataclass(frozen=True)
class Manifest:
    """What ``iaa-cli prepare`` wrote into a folder: the dataset, how it was built, its vocabulary
    and its splits. ``counts`` is the file's own per-split tally, which ``iaa.data.prepared.verify`` holds
    to the splits' rows; readers ask :meth:`count`."""

    dataset: str
    vocab_size: int
    vocab_hash: str
    splits: Mapping[str, Split]
    schema_version: int = SCHEMA_VERSION
    created_by: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)   # on_error, lowercase, min_count, max_vocab
    source: Mapping[str, Any] = field(default_factory=dict)    # the source's fingerprint
    source_path: str | None = None                             # None: generated (the demo)
    counts: Mapping[str, int] = field(default_factory=dict)
    files: tuple[str, ...] = ()                                # every file prepare wrote, this one last

    @classmethod
    def of(cls, header: Mapping[str, Any], *, vocab_size: int, vocab_hash: str,
           splits: Mapping[str, Split]) -> "Manifest":
        """A new manifest: ``header`` (dataset, created_by, options, source, source_path) and the splits."""
        return cls(vocab_size=vocab_size, vocab_hash=vocab_hash, splits=dict(splits),
                   counts={name: s.count for name, s in splits.items()}, **header)

    @property
    def lowercase(self) -> bool:
        return bool(self.options.get("lowercase", False))

    def count(self, split: str) -> int:
        """Questions in ``split``; 0 where there is no such split."""
        return self.counts.get(split, self.splits[split].count if split in self.splits else 0)

    @property
    def skipped(self) -> dict[str, int]:
        """Bad examples skipped, per split."""
        return {name: sum(s.skipped.values()) for name, s in self.splits.items()}

    @property
    def truncated(self) -> dict[str, int]:
        """Examples cut off, per split."""
        return {name: s.truncated for name, s in self.splits.items()}

    def with_files(self, files: Iterable[str]) -> "Manifest":
        return replace(self, files=tuple(files))

    def to_json(self) -> dict[str, Any]:
        out = {"schema_version": self.schema_version, "dataset": self.dataset, "created_by": self.created_by,
               "options": dict(self.options), "source": dict(self.source), "source_path": self.source_path,
               "vocab_size": self.vocab_size, "vocab_hash": self.vocab_hash, "counts": dict(self.counts),
               "skipped": self.skipped, "truncated": self.truncated,
               "splits": {name: s.to_json() for name, s in self.splits.items()}}
        return {**out, "files": list(self.files)} if self.files else out

    @classmethod
    def from_json(cls, obj: Any, out: Path) -> "Manifest":
        """The manifest that ``obj`` (the parsed file of the folder ``out``) holds; a DataError
        naming the file, what is wrong and the command that rebuilds it where it is no manifest."""
        path = Path(out) / MANIFEST

        def damaged(what: str) -> DataError:
            raw = obj if isinstance(obj, dict) else {}
            return DataError(f"{what}; {_rebuild_hint(Path(out), raw.get('dataset'), raw.get('source_path'), raw.get('options'))}",
                             path=path, reason=E.MISSING_SOURCE)

        if not isinstance(obj, dict) or not isinstance(obj.get("dataset"), str):
            raise damaged("is not a manifest (expected a JSON object with a dataset and its splits)")
        if obj.get("schema_version") not in READABLE_VERSIONS:
            raise damaged(f"written with schema version {obj.get('schema_version')!r}, "
                          f"this code reads versions {', '.join(map(str, READABLE_VERSIONS))}")
        try:
            splits = {name: _split(entry) for name, entry in obj["splits"].items()}
            return cls(dataset=obj["dataset"], vocab_size=_int(obj["vocab_size"]), vocab_hash=str(obj.get("vocab_hash", "")),
                       splits=splits, schema_version=obj["schema_version"], created_by=str(obj.get("created_by", "")),
                       options=dict(obj.get("options") or {}), source=dict(obj.get("source") or {}),
                       source_path=None if obj.get("source_path") is None else str(obj["source_path"]),
                       counts={name: _int(n) for name, n in (obj.get("counts") or {}).items()},
                       files=tuple(str(f) for f in obj.get("files") or ()))
        except (KeyError, TypeError, ValueError, AttributeError):
            raise damaged("lacks its splits, shards or vocab_size, or holds one of the wrong kind") from None


def _int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}")
    return value


def _split(entry: Mapping[str, Any]) -> Split:
    shards = tuple(Shard(file=str(s["file"]), rows=_int(s["rows"]), bytes=_int(s["bytes"]), sha256=str(s["sha256"]))
                   for s in entry["shards"])
    return Split(count=_int(entry.get("count", sum(s.rows for s in shards))), shards=shards,
                 skipped={str(k): _int(v) for k, v in (entry.get("skipped") or {}).items()},
                 skipped_examples=tuple(entry.get("skipped_examples") or ()), truncated=_int(entry.get("truncated", 0)),
                 truncated_examples=tuple(entry.get("truncated_examples") or ()),
                 doc_len_histogram=dict(entry.get("doc_len_histogram") or {}))


def fingerprint(files: Iterable[Path], root: Path | None = None) -> dict[str, Any]:
    """Identity of source files by name, size and modification time (no content read)."""
    entries = []
    for path in sorted(Path(p) for p in files):
        st = path.stat()
        name = str(path.relative_to(root)) if root is not None else path.name
        entries.append([name, st.st_size, st.st_mtime_ns])
    out: dict[str, Any] = {"files": len(entries), "sha256": digest(entries)}
    if len(entries) <= 10:
        out["names"] = [e[0] for e in entries]
    return out


def digest(obj: Any) -> str:
    """sha256 of an object's canonical JSON."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode("utf-8")).hexdigest()


def read(out: Path) -> Manifest | None:
    """The manifest of ``out``; None when there is none. Raises DataError when it is not a manifest."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        if path.exists():
            raise DataError(f"is not a file; {rebuild_hint(Path(out), None)}", path=path, reason=E.MISSING_SOURCE)
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        manifest = None
    except ValueError as err:
        raise DataError(f"is not valid JSON ({err}); {rebuild_hint(Path(out), None)}", path=path,
                        reason=E.MISSING_SOURCE) from None
    return Manifest.from_json(manifest, Path(out))


def counted(prepared: Path, split: str) -> int:
    """Questions in ``split`` of the prepared folder; 0 where the split, or the manifest, is absent."""
    manifest = read(prepared)
    return manifest.count(split) if manifest is not None else 0


def rebuild_hint(out: Path, manifest: Manifest | None) -> str:
    """What to do about a damaged prepared folder: the ``iaa-cli prepare`` command that rebuilds it
    (its options named as the jobs name them, which the command line spells as flags)."""
    if manifest is None:
        return _rebuild_hint(out, None, None, None)
    return _rebuild_hint(out, manifest.dataset, manifest.source_path, manifest.options)


def _rebuild_hint(out: Path, dataset: Any, source_path: Any, options: Any) -> str:
    dataset = dataset if isinstance(dataset, str) else "DATASET"
    source = "" if dataset == "demo" else f" `source` {source_path or 'SOURCE'}"
    options = options if isinstance(options, dict) else {}
    more = "".join([
        " `lowercase`" if options.get("lowercase") else "",
        " `on_error` skip" if options.get("on_error") == "skip" else "",
        f" `min_count` {options['min_count']}" if options.get("min_count", 1) != 1 else "",
        f" `max_vocab` {options['max_vocab']}" if options.get("max_vocab") else "",
    ])
    return f"rebuild it with: iaa-cli prepare `dataset` {dataset}{source} `out` {out}{more}"


def write(out: Path, manifest: Manifest) -> None:
    atomic_write_text(Path(out) / MANIFEST, json.dumps(manifest.to_json(), indent=2, sort_keys=False) + "\n")


def is_current(out: Path, *, dataset: str, source: dict[str, Any], options: dict[str, Any]) -> Manifest | None:
    """The manifest of ``out`` if it was built from this source with these options and is complete."""
    m = read(out)
    if m is None or m.schema_version != SCHEMA_VERSION or m.dataset != dataset:
        return None
    if m.source != source or m.options != options or not (Path(out) / VOCAB).is_file():
        return None
    for split in m.splits.values():
        for shard in split.shards:
            path = Path(out) / shard.file
            if not path.is_file() or path.stat().st_size != shard.bytes:
                return None
    return m


def vocab_card(prepared: Path) -> dict[str, Any]:
    """What a checkpoint carries of its data: the prepared ``vocab.json`` text (its sha256 is the
    manifest's ``vocab_hash``) and whether the dataset lowercases its words."""
    manifest = read(Path(prepared))
    return {"json": (Path(prepared) / VOCAB).read_text(encoding="utf-8"),
            "lowercase": manifest is not None and manifest.lowercase}
