"""``manifest.json``: what a prepared dataset holds, and whether it is still current.

A prepared directory is current when its manifest has this schema version, the same dataset,
options and source fingerprint, and every shard it lists is present with its recorded size;
``iaa.data.verify`` then checks the shards' contents.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterable

from iaa.data import errors as E
from iaa.data.errors import DataError
from iaa.files import atomic_write_text

SCHEMA_VERSION = 2         # 2: doc_cand is int32 (1: int16, which wraps past 32,767 candidates)
READABLE_VERSIONS = (1, 2)  # a version-1 folder still loads; `prepare` rewrites it
MANIFEST = "manifest.json"
VOCAB = "vocab.json"


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


def read(out: Path) -> dict[str, Any] | None:
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
    if not isinstance(manifest, dict) or "dataset" not in manifest:
        raise DataError(f"is not a manifest (expected a JSON object with a dataset and its splits); "
                        f"{rebuild_hint(Path(out), None)}", path=path, reason=E.MISSING_SOURCE)
    return manifest


def rebuild_hint(out: Path, manifest: dict[str, Any] | None) -> str:
    """What to do about a damaged prepared folder: the ``iaa-cli prepare`` command that rebuilds it
    (its options named as the jobs name them, which the command line spells as flags)."""
    manifest = manifest or {}
    dataset = manifest.get("dataset", "DATASET")
    source = "" if dataset == "demo" else f" `source` {manifest.get('source_path', 'SOURCE')}"
    options = manifest.get("options") or {}
    more = "".join([
        " `lowercase`" if options.get("lowercase") else "",
        " `on_error` skip" if options.get("on_error") == "skip" else "",
        f" `min_count` {options['min_count']}" if options.get("min_count", 1) != 1 else "",
        f" `max_vocab` {options['max_vocab']}" if options.get("max_vocab") else "",
    ])
    return f"rebuild it with: iaa-cli prepare `dataset` {dataset}{source} `out` {out}{more}"


def write(out: Path, manifest: dict[str, Any]) -> None:
    atomic_write_text(Path(out) / MANIFEST, json.dumps(manifest, indent=2, sort_keys=False) + "\n")


def is_current(out: Path, *, dataset: str, source: dict[str, Any], options: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of ``out`` if it was built from this source with these options and is complete."""
    m = read(out)
    if not m or m.get("schema_version") != SCHEMA_VERSION or m.get("dataset") != dataset:
        return None
    if m.get("source") != source or m.get("options") != options or not (Path(out) / VOCAB).is_file():
        return None
    for split in m.get("splits", {}).values():
        for shard in split.get("shards", []):
            path = Path(out) / shard["file"]
            if not path.is_file() or path.stat().st_size != shard["bytes"]:
                return None
    return m


def vocab_card(prepared: Path) -> dict[str, Any]:
    """What a checkpoint carries of its data: the prepared ``vocab.json`` text (its sha256 is the
    manifest's ``vocab_hash``) and whether the dataset lowercases its words."""
    options = (read(Path(prepared)) or {}).get("options") or {}
    return {"json": (Path(prepared) / VOCAB).read_text(encoding="utf-8"), "lowercase": bool(options.get("lowercase", False))}
