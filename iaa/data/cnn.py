"""Reader of DeepMind's CNN/Daily Mail ``.question`` files (rc-data), from a folder or the .tgz.

One file, one example::

    <url>
    <blank>
    <context: tokens, entities anonymised as @entityN>
    <blank>
    <query with @placeholder>
    <blank>
    <answer: an @entityN>
    <blank>
    @entity0:Real Name
    ...

Candidates are the distinct ``@entityN`` tokens of the document in order of first occurrence
(the convention of the AS Reader and the Stanford AR). Split folders ``training``, ``validation``
and ``test`` become ``train``, ``valid`` and ``test``. A .tgz is read as a stream, never extracted;
an archive with a link, an absolute path or a path that climbs out (``..``) is rejected, and so is
a question file over ``MAX_QUESTION_BYTES`` (rc-data's largest is about 100 KB), in an archive
(by its header, before a byte of it is read) or in a folder.
"""

from __future__ import annotations

import functools
import re
import tarfile
import zlib
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from iaa.data import bad_input as E
from iaa.data import manifest as M
from iaa.data.build import SplitSource
from iaa.data.bad_input import DataError
from iaa.data.parsed import ClozeExample, ParsedChunk, assemble, encode, note_errors, offsets_of

PLACEHOLDER = "@placeholder"
ENTITY_PATTERN = r"^@entity\d+$"
FOLDERS = {"training": "train", "validation": "valid", "test": "test"}
FILES_PER_TASK = 2_000
MAX_QUESTION_BYTES = 16 << 20     # one .question file; rc-data's are at most about 100 KB
_ENTITY = re.compile(ENTITY_PATTERN)
_ENTITY_LINE = re.compile(r"^@entity\d+:")
LINE_OF = {"query": 5, "answer": 7}    # the lines of a .question file that its checks name


def parse_question(name: str, data: bytes) -> ClozeExample:
    """One ``.question`` file; raises DataError naming the file (and line) for bad input."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 (byte 0x{data[e.start]:02x} at byte {e.start})", path=name,
                        line=data.count(b"\n", 0, e.start) + 1, reason=E.NOT_UTF8) from None
    lines = text.replace("\r\n", "\n").split("\n")
    fields = {"url": 0, "context": 2, "query": 4, "answer": 6}
    for what, i in fields.items():
        if len(lines) <= i or not lines[i].strip():
            raise DataError(f"missing the {what} (line {i + 1} of url, blank, context, blank, query, blank, answer)",
                            path=name, line=i + 1, reason=E.MISSING_FIELD)
        if i and lines[i - 1].strip():
            raise DataError(f"expected a blank line before the {what}", path=name, line=i, reason=E.MISSING_FIELD)
    for k, line in enumerate(lines[8:], start=9):
        if line.strip() and not _ENTITY_LINE.match(line):
            raise DataError(f"expected an '@entityN:Name' line, found {line[:40]!r}", path=name, line=k,
                            reason=E.MISSING_FIELD)
    if _ENTITY_LINE.match(lines[6]):
        raise DataError(f"expected the answer (an @entityN), found the entity line {lines[6][:40]!r}: the answer "
                        "line is missing", path=name, line=7, reason=E.MISSING_FIELD)
    doc, query, answer = lines[2].split(), lines[4].split(), lines[6].strip()
    candidates = tuple(dict.fromkeys(t for t in doc if t.startswith("@entity") and _ENTITY.match(t)))
    return ClozeExample(PurePosixPath(name).stem, tuple(doc), tuple(query), candidates, answer)


def parse_files(items: list[tuple[str, bytes]], *, on_error: str = "fail", lowercase: bool = False) -> ParsedChunk:
    """Parse (name, bytes) question files into one chunk; bad ones raise or are counted (``on_error``)."""
    examples, names, errs = [], [], []
    for name, data in items:
        try:
            examples.append(parse_question(name, data))
            names.append(name)
        except DataError as e:
            errs.append(e)

    def answer_kind(i: int) -> tuple[str, str]:
        a = examples[i].answer
        if not _ENTITY.match(a):
            return E.ANSWER_NOT_CANDIDATE, f"answer {a!r} is not an @entity token, so it is not among the candidates"
        return E.ANSWER_NOT_IN_DOCUMENT, f"answer {a!r} does not occur in the document, so it is not among the candidates"

    words, doc, query = encode(pa.array([w for ex in examples for w in ex.doc], pa.string()),
                               pa.array([w for ex in examples for w in ex.query], pa.string()))
    chunk, content_errs = assemble(
        example_ids=pa.array([ex.example_id for ex in examples], pa.string()), words=words,
        doc=doc, doc_offsets=offsets_of(np.array([len(ex.doc) for ex in examples], np.int64)),
        query=query, query_offsets=offsets_of(np.array([len(ex.query) for ex in examples], np.int64)),
        cand_words=pa.array([c for ex in examples for c in ex.candidates], pa.string()),
        cand_offsets=offsets_of(np.array([len(ex.candidates) for ex in examples], np.int64)),
        answers=pa.array([ex.answer for ex in examples], pa.string()),
        placeholder=PLACEHOLDER, lowercase=lowercase, where=lambda i, field: (names[i], LINE_OF[field]),
        answer_kind=answer_kind, sources=pa.array(names, pa.string()),
    )
    note_errors(chunk, errs + content_errs, on_error)
    return chunk


def find_source(source: Path) -> Path:
    """The ``questions`` folder under ``source``, or ``source`` itself when it is a .tgz/.tar.gz."""
    source = Path(source)
    if source.is_file() and source.name.endswith((".tgz", ".tar.gz", ".tar")):
        return source
    for folder in (source / "questions", source / "cnn" / "questions", source):
        if folder.is_dir() and any((folder / f).is_dir() for f in FOLDERS):
            return folder
    raise DataError("no CNN questions here: give the folder holding questions/{training,validation,test}/ "
                    "or the .tgz", path=source, reason=E.MISSING_SOURCE)


def fingerprint(source: Path) -> dict:
    """Names, sizes and times of the question files (or of the archive)."""
    found = find_source(source)
    if found.is_file():
        return M.fingerprint([found])
    return M.fingerprint((p for f in FOLDERS for p in (found / f).glob("*.question")), root=found)


def split_sources(source: Path, *, on_error: str = "fail", lowercase: bool = False) -> list[SplitSource]:
    """One SplitSource per split present; each yields parse tasks of FILES_PER_TASK files."""
    found = find_source(source)
    if found.is_file():
        present = {split for split, _, _ in _scan_tgz(found, read=False)}
    else:
        present = {split for folder, split in FOLDERS.items() if any((found / folder).glob("*.question"))}
    parse = functools.partial(parse_files, on_error=on_error, lowercase=lowercase)
    return [SplitSource(s, functools.partial(_tasks, found, s, parse)) for s in FOLDERS.values() if s in present]


def read(source: Path, *, on_error: str = "fail", lowercase: bool = False) -> dict[str, ParsedChunk]:
    """All splits, each parsed in one piece (tests and small data)."""
    found = find_source(source)
    return {s.split: parse_files(list(iter_files(found, s.split)), on_error=on_error, lowercase=lowercase)
            for s in split_sources(found, on_error=on_error, lowercase=lowercase)}


def iter_files(found: Path, split: str) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of one split's question files, in name order (folder) or archive order (.tgz)."""
    if found.is_file():
        for s, name, data in _scan_tgz(found, read=True):
            if s == split:
                yield f"{found.name}:{name}", data
        return
    folder = next(f for f, s in FOLDERS.items() if s == split)
    for p in sorted((found / folder).glob("*.question")):
        name = str(p.relative_to(found.parent))
        if not p.is_file():
            raise DataError("is named like a question file but is not a file", path=p, reason=E.MISSING_FIELD)
        _check_size(p, p.stat().st_size)
        yield name, p.read_bytes()


def _tasks(found: Path, split: str, parse: Callable) -> Iterator[Callable[[], ParsedChunk]]:
    batch: list[tuple[str, bytes]] = []
    for item in iter_files(found, split):
        batch.append(item)
        if len(batch) == FILES_PER_TASK:
            yield functools.partial(parse, batch)
            batch = []
    if batch:
        yield functools.partial(parse, batch)


def _scan_tgz(path: Path, *, read: bool) -> Iterator[tuple[str, str, bytes]]:
    """(split, member name, bytes) of each ``questions/<folder>/*.question`` member, streamed.

    Raises DataError for a member that is a link, absolute, or climbs out with ``..``.
    """
    try:
        with tarfile.open(path, mode="r:*") as tar:
            for member in tar:
                _check_member(path, member)
                parts = PurePosixPath(member.name).parts
                if not member.isfile() or not member.name.endswith(".question") or len(parts) < 3:
                    continue
                if parts[-3] != "questions" or parts[-2] not in FOLDERS:
                    continue
                _check_size(f"{path}:{member.name}", member.size)
                data = tar.extractfile(member).read() if read else b""  # type: ignore[union-attr]
                yield FOLDERS[parts[-2]], member.name, data
    except (tarfile.TarError, EOFError, OSError, zlib.error) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise DataError(f"{_archive_problem(path, err)}; download the archive again, or give the extracted "
                        "folder holding questions/", path=path, reason=E.MISSING_SOURCE) from None


def _check_size(name: str | Path, size: int) -> None:
    if size > MAX_QUESTION_BYTES:
        raise DataError(f"a question file of {size:,} bytes, over the limit of {MAX_QUESTION_BYTES:,} (rc-data's are "
                        "at most about 100 KB); remove it, or give the folder of the real questions",
                        path=name, reason=E.MISSING_SOURCE)


def _archive_problem(path: Path, err: Exception) -> str:
    """What is wrong with an archive that tarfile could not read, in one line."""
    with open(path, "rb") as f:
        head = f.read(2)
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if not head:
        return "is empty"
    if path.name.endswith(("gz", ".tgz")) and head != b"\x1f\x8b":
        return "is not gzip-compressed (a .tgz is a gzip-compressed tar archive)"
    if isinstance(err, (EOFError, zlib.error)) or "unexpected end" in first or "truncated" in first:
        return "ends early (an incomplete download?)"
    return f"is not a readable tar archive ({first})"


def _check_member(archive: Path, member: tarfile.TarInfo) -> None:
    name = PurePosixPath(member.name)
    if member.issym() or member.islnk():
        what = f"member {member.name!r} is a link (to {member.linkname!r}); links are not allowed"
    elif name.is_absolute() or member.name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", member.name):
        what = f"member {member.name!r} has an absolute path"
    elif ".." in name.parts or "\\.." in member.name or "..\\" in member.name:
        what = f"member {member.name!r} would be written outside the target folder"
    elif not (member.isfile() or member.isdir()):
        what = f"member {member.name!r} is not a regular file or folder"
    else:
        return
    raise DataError(f"unsafe archive: {what}", path=archive, reason=E.UNSAFE_ARCHIVE)
