"""A prepared split held against a list of the question files it should hold, such as rc-data's
official CNN test list (``expected_cnn_test.txt``, 3,198 names): which listed questions it lacks,
and which of its questions the list does not name.

A list holds one file name a line (``NAME.question``; a bare ``NAME`` or a path whose last part
is the file name are read the same); blank lines are ignored. A CNN question's id is its file's
stem, so a name is compared by its stem.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import pyarrow.parquet as pq

from iaa.data import bad_input as E
from iaa.data.bad_input import DataError
from iaa.data.prepared.manifest import Manifest

SUFFIX = ".question"


@dataclass(frozen=True)
class Completeness:
    """A split's ids against a list of ``listed`` names: ``missing`` are listed but not in the split,
    ``unlisted`` in the split but not listed (both sorted)."""

    listed: int
    present: int
    missing: tuple[str, ...]
    unlisted: tuple[str, ...]


def read_list(path: Path) -> list[str]:
    """The ids a list names, in its order.

    Raises:
        DataError: naming the file (and line): not UTF-8, a line of more than one name, a name
            listed twice, or no name at all.
    """
    path = Path(path)
    data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    if E.looks_utf16(data):
        raise DataError(E.UTF16_TEXT, path=path, line=1, reason=E.NOT_UTF8)
    seen: dict[str, int] = {}
    for n, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8").strip()
        except UnicodeDecodeError as err:
            raise DataError(f"not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})", path=path, line=n,
                            reason=E.NOT_UTF8) from None
        if not line:
            continue
        if len(line.split()) > 1:
            raise DataError(f"expected one file name a line, found {line[:60]!r}", path=path, line=n)
        name = PurePosixPath(line.replace("\\", "/")).name.removesuffix(SUFFIX)
        if name in seen:
            raise DataError(f"{name}{SUFFIX} is listed twice (also on line {seen[name]})", path=path, line=n)
        seen[name] = n
    if not seen:
        raise DataError("lists no file name (one a line, such as NAME.question)", path=path, reason=E.MISSING_SOURCE)
    return list(seen)


def split_ids(root: Path, manifest: Manifest, split: str) -> list[str]:
    """The ``example_id`` of every row of ``split`` of the prepared folder ``root`` ([] without the split)."""
    if split not in manifest.splits:
        return []
    return [i for shard in manifest.splits[split].shards
            for i in pq.read_table(Path(root) / shard.file, columns=["example_id"]).column(0).to_pylist()]


def compare(listed: list[str], ids: list[str]) -> Completeness:
    """``ids`` (a split's) against the ``listed`` ones."""
    want, have = set(listed), set(ids)
    return Completeness(listed=len(want), present=len(want & have), missing=tuple(sorted(want - have)),
                        unlisted=tuple(sorted(have - want)))
