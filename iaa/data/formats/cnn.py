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
(by its header, before a byte of it is read) or in a folder. Files that are not read (macOS
metadata, misplaced or misnamed question files) are counted in the source's :class:`Layout`.
The ``@entityN:Name`` lines are checked for their form; :func:`read_question` also returns them.
"""

from __future__ import annotations

import functools
import os
import re
import tarfile
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator

import numpy as np
import pyarrow as pa

from iaa.data import bad_input as E
from iaa.data.prepared import manifest as M
from iaa.data.prepared.build import SplitSource
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
ARCHIVES = (".tgz", ".tar.gz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")  # any case
SHOWN = 3                               # files named in a note about those not read


FIELDS = ("url", "context", "query", "answer")    # on lines 1, 3, 5 and 7, each one line, a blank line between


def parse_question(name: str, data: bytes) -> ClozeExample:
    """One ``.question`` file; raises DataError naming the file (and line) for bad input."""
    return _example(name, _lines(name, data))


def read_question(name: str, data: bytes) -> tuple[ClozeExample, dict[str, str]]:
    """One ``.question`` file checked as ``prepare`` checks it (its lines, one placeholder, the answer
    an entity of the document), with its ``@entityN:Name`` lines as a map from entity to name.

    Raises:
        DataError: naming the file, the line and what is wrong, in ``prepare``'s words.
    """
    lines = _lines(name, data)
    example = _example(name, lines)
    _, errs = _assembled([example], [name], lowercase=False)
    if errs:
        raise errs[0]
    return example, _entity_names(name, lines)


def _lines(name: str, data: bytes) -> list[str]:
    """The file's lines, its layout checked: url, blank, context, blank, query, blank, answer, then
    a blank line and the ``@entityN:Name`` lines."""
    if E.looks_utf16(data):
        raise DataError(E.UTF16_TEXT, path=name, line=1, reason=E.NOT_UTF8)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 (byte 0x{data[e.start]:02x} at byte {e.start})", path=name,
                        line=data.count(b"\n", 0, e.start) + 1, reason=E.NOT_UTF8) from None
    lines = text.replace("\r\n", "\n").split("\n")
    last = max((k for k, line in enumerate(lines, 1) if line.strip()), default=0)   # the last line with text
    for k, what in enumerate(FIELDS):
        i = 2 * k                                                                  # the field's line, from 0
        if i and i - 1 < len(lines) and lines[i - 1].strip():
            before = FIELDS[k - 1]
            raise DataError(f"expected a blank line between the {before} and the {what}, found {lines[i - 1][:40]!r}: "
                            f"is the {before} split over two lines? (each field is one line)",
                            path=name, line=i, reason=E.MISSING_FIELD)
        if i < len(lines) and lines[i].strip():
            continue
        if last <= i:
            ends = f"the file ends at line {last} (cut off?)" if last else "the file holds no text"
            raise DataError(f"missing the {what}: {ends}", path=name, line=i + 1, reason=E.MISSING_FIELD)
        raise DataError(f"missing the {what} (line {i + 1} of url, blank, context, blank, query, blank, answer)",
                        path=name, line=i + 1, reason=E.MISSING_FIELD)
    if _ENTITY_LINE.match(lines[6]):
        raise DataError(f"expected the answer (an @entityN), found the entity line {lines[6][:40]!r}: the answer "
                        "line is missing", path=name, line=7, reason=E.MISSING_FIELD)
    if len(lines) > 7 and lines[7].strip():
        found = lines[7].strip()[:40]
        why = ("the @entityN:Name lines start at line 9" if _ENTITY_LINE.match(found)
               else "a question has one answer, on line 7")
        raise DataError(f"expected a blank line after the answer, found {found!r}: {why}",
                        path=name, line=8, reason=E.MISSING_FIELD)
    for k, line in enumerate(lines[8:], start=9):
        if line.strip() and not _ENTITY_LINE.match(line):
            raise DataError(f"expected an '@entityN:Name' line, found {line[:40]!r}", path=name, line=k,
                            reason=E.MISSING_FIELD)
    return lines


def _example(name: str, lines: list[str]) -> ClozeExample:
    doc, query, answer = lines[2].split(), lines[4].split(), lines[6].strip()
    candidates = tuple(dict.fromkeys(t for t in doc if t.startswith("@entity") and _ENTITY.match(t)))
    return ClozeExample(PurePosixPath(name).stem, tuple(doc), tuple(query), candidates, answer)


def _entity_names(name: str, lines: list[str]) -> dict[str, str]:
    """``@entityN`` -> its name, from the lines after the answer (checked for their form already)."""
    names: dict[str, str] = {}
    for k, line in enumerate(lines[8:], start=9):
        entity, _, real = line.strip().partition(":")
        if not entity:
            continue
        if names.setdefault(entity, real.strip()) != real.strip():
            raise DataError(f"{entity} is named twice: {names[entity]!r}, then {real.strip()!r}", path=name, line=k,
                            reason=E.MISSING_FIELD)
    return names


def parse_files(items: list[tuple[str, bytes]], *, on_error: str = "fail", lowercase: bool = False) -> ParsedChunk:
    """Parse (name, bytes) question files into one chunk; bad ones raise or are counted (``on_error``)."""
    examples, names, errs = [], [], []
    for name, data in items:
        try:
            examples.append(parse_question(name, data))
            names.append(name)
        except DataError as e:
            errs.append(e)
    chunk, content_errs = _assembled(examples, names, lowercase=lowercase)
    note_errors(chunk, errs + content_errs, on_error)
    return chunk


def _assembled(examples: list[ClozeExample], names: list[str], *, lowercase: bool) -> tuple[ParsedChunk, list[DataError]]:
    """The examples checked (one placeholder, the answer an entity of the document) and encoded; one
    error per bad one, naming its file and line."""
    def answer_kind(i: int) -> tuple[str, str]:
        a = examples[i].answer
        if not _ENTITY.match(a):
            return E.ANSWER_NOT_CANDIDATE, f"answer {a!r} is not an @entity token, so it is not among the candidates"
        return E.ANSWER_NOT_IN_DOCUMENT, f"answer {a!r} does not occur in the document, so it is not among the candidates"

    words, doc, query = encode(pa.array([w for ex in examples for w in ex.doc], pa.string()),
                               pa.array([w for ex in examples for w in ex.query], pa.string()))
    return assemble(
        example_ids=pa.array([ex.example_id for ex in examples], pa.string()), words=words,
        doc=doc, doc_offsets=offsets_of(np.array([len(ex.doc) for ex in examples], np.int64)),
        query=query, query_offsets=offsets_of(np.array([len(ex.query) for ex in examples], np.int64)),
        cand_words=pa.array([c for ex in examples for c in ex.candidates], pa.string()),
        cand_offsets=offsets_of(np.array([len(ex.candidates) for ex in examples], np.int64)),
        answers=pa.array([ex.answer for ex in examples], pa.string()),
        placeholder=PLACEHOLDER, lowercase=lowercase, where=lambda i, field: (names[i], LINE_OF[field]),
        answer_kind=answer_kind, sources=pa.array(names, pa.string()),
    )


def find_source(source: Path) -> Path:
    """The ``questions`` folder under ``source`` (or ``source`` itself where it holds the split
    folders), or ``source`` itself when it is a tar archive (one of ``ARCHIVES``)."""
    source = Path(source)
    if source.is_file():
        if source.name.lower().endswith(ARCHIVES):
            return source
        raise DataError(f"is a file, not one of the archives read ({', '.join(ARCHIVES)}): give the archive, or the "
                        "folder holding questions/{training,validation,test}/", path=source, reason=E.MISSING_SOURCE)
    for folder in (source / "questions", source / "cnn" / "questions", source):
        if folder.is_dir() and any((folder / f).is_dir() for f in FOLDERS):
            return folder
    raise DataError("no CNN questions here: give the folder holding questions/{training,validation,test}/ "
                    "or the .tgz", path=source, reason=E.MISSING_SOURCE)


# What a file of a source is to the reader (:func:`_kind`), and how a note says those not read
QUESTION, APPLEDOUBLE, MISPLACED, MISNAMED, OTHER = "question", "appledouble", "misplaced", "misnamed", "other"
_NOTES = {
    APPLEDOUBLE: "macOS metadata file(s) (._NAME.question, AppleDouble) are not questions and are not read "
                 "(e.g. {e}); tar with COPYFILE_DISABLE=1 to leave them out",
    MISPLACED: ".question file(s) outside the split folders training/, validation/ and test/ are not read "
               "(in {f}); move them into the split folder they belong to",
    MISNAMED: "file(s) named like question files are not read, as their names do not end in .question (e.g. {e})",
    OTHER: "other file(s) in the split folders are not read (e.g. {e})",
}


@dataclass(frozen=True)
class Layout:
    """What a source holds: where its questions are, the splits they fill, and one line for each kind
    of file that is not read (``prepare`` says each in a warning)."""

    found: Path                     # the questions folder, or the archive
    splits: tuple[str, ...]         # those with a question file, in FOLDERS' order
    notes: tuple[str, ...] = ()


def survey(source: Path) -> Layout:
    """The :class:`Layout` of ``source``: a folder's files are listed, an archive's headers read once.

    A question file is ``<split folder>/NAME.question``: directly in the questions folder's
    ``training``, ``validation`` or ``test``; in an archive, under any folder (``cnn/questions/``,
    ``cnn/``, none). What else looks like one is counted in a note: macOS metadata files
    (``._NAME.question``), ``.question`` files elsewhere (a sub-folder, ``Training/``), names that
    are not ``*.question`` (``NAME.QUESTION``, ``NAME.question.txt``), other files in a split folder.

    Raises:
        DataError: an archive that mixes Daily Mail's questions with others (another corpus), or a
            source without a training question (the vocabulary is built from them), naming it and
            what it holds.
    """
    found = find_source(source)
    counts: Counter = Counter()                     # split -> question files
    roots: Counter = Counter()                      # the folder holding the split folders -> question files
    odd: dict[str, list[str]] = {}                  # kind -> the files of that kind, as shown
    for kind, split, root, shown in _entries(found):
        if kind == QUESTION:
            counts[split] += 1
            roots[root] += 1
        elif kind:
            odd.setdefault(kind, []).append(shown)
    notes = [_note(kind, odd[kind]) for kind in _NOTES if kind in odd] + _root_notes(found, roots)
    if not counts["train"]:
        none = "no .question file in training/" if found.is_dir() else "no .question member in a training/ folder"
        held = ", ".join(f"{n:,} in {folder}/" for folder, split in FOLDERS.items() if (n := counts[split]))
        raise DataError(f"no training question, and the vocabulary is built from them: {none} (questions found: "
                        f"{held or 'none'})" + "".join(f"; {note}" for note in notes), path=found, reason=E.MISSING_SOURCE)
    return Layout(found, tuple(s for s in FOLDERS.values() if counts[s]), tuple(notes))


def _kind(folders: tuple[str, ...], name: str, *, archive: bool) -> tuple[str, str | None]:
    """(what the file ``name`` in ``folders`` is to the reader, its split for a question), the folders
    being an archive member's or those under the questions folder; kind ``""``: not looked at."""
    parent = folders[-1] if folders else ""
    in_split = parent in FOLDERS and (archive or len(folders) == 1)
    if name.endswith(".question"):
        if name.startswith("._"):
            return APPLEDOUBLE, None
        return (QUESTION, FOLDERS[parent]) if in_split else (MISPLACED, None)
    if ".question" in name.lower():
        return MISNAMED, None
    return (OTHER if in_split else ""), None


def _entries(found: Path) -> Iterator[tuple[str, str | None, str, str]]:
    """(kind, split, the folder holding the split folder, the file as shown) of each file of
    ``found``; a folder's question files are all under ``found`` itself (root ``""``)."""
    if found.is_file():
        for kind, split, name, _ in _scan_tgz(found, read=False):
            yield kind, split, "/".join(PurePosixPath(name).parts[:-2]), f"{found.name}:{name}"
        return
    for folder, dirs, files in os.walk(found):
        dirs.sort()
        folders = Path(folder).relative_to(found).parts
        for file in sorted(files):
            kind, split = _kind(folders, file, archive=False)
            yield kind, split, "", "" if kind == QUESTION else str(Path(folder) / file)


def _note(kind: str, shown: list[str]) -> str:
    """One line: how many files of ``kind`` are not read, and a few of them (or their folders)."""
    folders = list(dict.fromkeys(name.rsplit("/", 1)[0] + "/" for name in shown))
    return f"{len(shown):,} " + _NOTES[kind].format(e=", ".join(shown[:SHOWN]), f=", ".join(folders[:SHOWN]))


def _root_notes(found: Path, roots: Counter) -> list[str]:
    """An archive's question files under more than one folder: Daily Mail's beside others are
    refused (another corpus), others said; Daily Mail's alone are said to become dataset cnn."""
    def shown(root: str) -> str:
        return f"{root or '(the top)'}/ ({roots[root]:,})"

    daily = [root for root in roots if "dailymail" in root.lower().split("/")]
    if daily and len(roots) > 1:
        others = [root for root in roots if root not in daily]
        raise DataError(f"holds Daily Mail questions ({', '.join(map(shown, daily))}) beside others "
                        f"({', '.join(map(shown, others))}): Daily Mail is another corpus, and dataset cnn reads "
                        "one; give an archive or folder of CNN's questions alone", path=found, reason=E.MISSING_SOURCE)
    notes = []
    if len(roots) > 1:
        notes.append(f"questions under {len(roots)} folders are read together: {', '.join(map(shown, roots))}")
    if daily or (found.is_dir() and "dailymail" in [part.lower() for part in found.resolve().parts]):
        notes.append("these are Daily Mail's questions (a dailymail/ folder), prepared as dataset cnn")
    return notes


def fingerprint(source: Path) -> dict:
    """Names, sizes and times of the question files (or of the archive)."""
    found = find_source(source)
    if found.is_file():
        return M.fingerprint([found])
    return M.fingerprint((p for f in FOLDERS for p in _question_files(found / f)), root=found)


def split_sources(source: Path | Layout, *, on_error: str = "fail", lowercase: bool = False) -> list[SplitSource]:
    """One SplitSource per split present; each yields parse tasks of FILES_PER_TASK files.
    ``source``: a path, or its :func:`survey` (which refuses a source without training questions)."""
    layout = source if isinstance(source, Layout) else survey(source)
    parse = functools.partial(parse_files, on_error=on_error, lowercase=lowercase)
    return [SplitSource(s, functools.partial(_tasks, layout.found, s, parse)) for s in layout.splits]


def read(source: Path, *, on_error: str = "fail", lowercase: bool = False) -> dict[str, ParsedChunk]:
    """All splits, each parsed in one piece (tests and small data)."""
    layout = survey(source)
    return {s.split: parse_files(list(iter_files(layout.found, s.split)), on_error=on_error, lowercase=lowercase)
            for s in split_sources(layout, on_error=on_error, lowercase=lowercase)}


def iter_files(found: Path, split: str) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of one split's question files, in name order (folder) or archive order (.tgz).
    A folder's files are named by their path as ``found`` is given; an archive's as ``ARCHIVE:MEMBER``."""
    if found.is_file():
        for kind, s, name, data in _scan_tgz(found, read=True):
            if kind == QUESTION and s == split:
                yield f"{found.name}:{name}", data
        return
    folder = next(f for f, s in FOLDERS.items() if s == split)
    for p in _question_files(found / folder):
        if not p.is_file():
            raise DataError("is named like a question file but is not a file", path=p, reason=E.MISSING_FIELD)
        _check_size(p, p.stat().st_size)
        yield str(p), p.read_bytes()


def _question_files(folder: Path) -> list[Path]:
    """The ``*.question`` entries of a split folder in name order, macOS metadata files (``._*``) left out."""
    return sorted(p for p in folder.glob("*.question") if not p.name.startswith("._"))


def _tasks(found: Path, split: str, parse: Callable) -> Iterator[Callable[[], ParsedChunk]]:
    batch: list[tuple[str, bytes]] = []
    for item in iter_files(found, split):
        batch.append(item)
        if len(batch) == FILES_PER_TASK:
            yield functools.partial(parse, batch)
            batch = []
    if batch:
        yield functools.partial(parse, batch)


def _scan_tgz(path: Path, *, read: bool) -> Iterator[tuple[str, str | None, str, bytes]]:
    """(kind, split, member name, bytes) of each file member (:func:`_kind`), streamed; the bytes
    of questions only, and only when ``read``.

    Raises DataError for a member that is a link, absolute, or climbs out with ``..``, and for a
    question member over ``MAX_QUESTION_BYTES``.
    """
    try:
        with tarfile.open(path, mode="r:*") as tar:
            for member in tar:
                _check_member(path, member)
                if not member.isfile():
                    continue
                path_parts = PurePosixPath(member.name).parts
                kind, split = _kind(path_parts[:-1], path_parts[-1], archive=True)
                if kind == QUESTION:
                    _check_size(f"{path}:{member.name}", member.size)
                data = tar.extractfile(member).read() if read and kind == QUESTION else b""  # type: ignore[union-attr]
                yield kind, split, member.name, data
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
    if path.name.lower().endswith(("gz", ".tgz")) and head != b"\x1f\x8b":
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
