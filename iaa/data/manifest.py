"""``manifest.json``: what a prepared dataset holds, and whether it is still current.

A prepared directory is current when its manifest has this schema version, the same dataset,
options and source fingerprint, and every shard it lists is present with its recorded size.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

SCHEMA_VERSION = 1
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
    path = Path(out) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def write(out: Path, manifest: dict[str, Any]) -> None:
    tmp = Path(out) / f".{MANIFEST}.tmp"
    tmp.write_text(json.dumps(manifest, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, Path(out) / MANIFEST)


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
