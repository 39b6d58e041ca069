"""Input documents for cloze making: plain text or CBT's raw book layout, ``.txt`` or ``.txt.gz``.

A source is a file or a folder of such files (searched recursively, in name order). A plain text
file is one document whose paragraphs (separated by blank lines) are tokenised and split into
sentences by the tagger. A file whose first line starts with ``_BOOK_TITLE_`` is in CBT's raw
layout: each ``_BOOK_TITLE_ : NAME`` line starts a book (one document) and every other non-blank
line is one already tokenised sentence, kept exactly as written.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

from iaa.data import bad_input as E
from iaa.data.bad_input import DataError

BOOK_MARK = "_BOOK_TITLE_"
MAX_SOURCE_BYTES = 512 << 20     # one source file's text, gunzipped: it is read whole (a book is ~1 MB)
MAX_PARAGRAPH_CHARS = 1_000_000   # spaCy's default nlp.max_length: the most text one tagger call reads
TOKENS, TEXT = "tokens", "text"   # Document.kind: tokenised sentences / raw paragraphs
SPLITS = ("train", "valid", "test")
SUFFIXES = (".txt", ".txt.gz")


@dataclass(frozen=True)
class SourceSpec:
    """A ``--source`` argument: a path, and the split all its documents go to (None: drawn)."""

    path: Path
    split: str | None = None

    @classmethod
    def parse(cls, arg: str) -> "SourceSpec":
        """``PATH`` or ``SPLIT=PATH`` (SPLIT one of train, valid, test)."""
        head, sep, tail = arg.partition("=")
        if sep and head in SPLITS:
            return cls(Path(tail), head)
        return cls(Path(arg))


@dataclass(frozen=True)
class Document:
    """One book or article.

    Attributes:
        doc_id: unique and stable: ``file_id``, plus ``:TITLE`` for a book of a raw CBT file. It
            seeds the document's questions, so it must not depend on where the files lie.
        path: the file, for messages.
        kind: TOKENS (``pieces`` are tokenised sentences) or TEXT (``pieces`` are paragraphs).
        pieces: the text, in order.
        split: the split forced by its source, or None.
        file_id: the file's path relative to its source folder (its name, for a file source), with
            ``#k`` added when two sources hold files of the same name: the same files give the same
            ids from any working directory or absolute path.
    """

    doc_id: str
    path: str
    kind: str
    pieces: tuple[str, ...]
    split: str | None = None
    file_id: str = ""


def files_of(spec: SourceSpec) -> list[Path]:
    """The text files of a source, in name order; DataError when there are none."""
    path = spec.path
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DataError("no such file or folder", path=path, reason=E.MISSING_SOURCE)
    found = sorted(p for p in path.rglob("*") if p.is_file() and p.name.endswith(SUFFIXES))
    if not found:
        raise DataError(f"no {' or '.join(SUFFIXES)} files in this folder", path=path, reason=E.MISSING_SOURCE)
    return found


def read_documents(specs: list[SourceSpec]) -> list[Document]:
    """All documents of all sources, in source order; DataError for an empty or undecodable file."""
    docs: list[Document] = []
    seen: set[str] = set()
    file_ids: set[str] = set()
    for spec in specs:
        for path in files_of(spec):
            file_id = _unique(path.relative_to(spec.path).as_posix() if spec.path.is_dir() else path.name, file_ids)
            for doc in read_file(path, spec.split, file_id=file_id):
                doc_id = _unique(doc.doc_id, seen)   # two books with one title in a file
                docs.append(doc if doc_id == doc.doc_id else replace(doc, doc_id=doc_id))
    return docs


def _unique(name: str, taken: set[str]) -> str:
    """``name``, or ``name#k`` with the first k >= 2 not taken yet; recorded as taken."""
    unique, k = name, 2
    while unique in taken:
        unique, k = f"{name}#{k}", k + 1
    taken.add(unique)
    return unique


def read_file(path: Path, split: str | None = None, *, file_id: str | None = None) -> list[Document]:
    """The documents of one file (one, or one per book in CBT's raw layout); ids start with ``file_id``
    [default: the file's name]."""
    text = decode(path, _read_bytes(path))
    lines = text.replace("\r\n", "\n").split("\n")
    first = next((ln for ln in lines if ln.strip()), None)
    if first is None:
        raise DataError("the file is empty: it has no text to make questions from", path=path,
                        reason=E.MISSING_SOURCE)
    file_id = file_id or path.name
    if first.startswith(BOOK_MARK):
        books = list(_books(path, file_id, lines, split))
        if not books:
            raise DataError(f"has {BOOK_MARK} lines but no book text under them: nothing to make questions from",
                            path=path, reason=E.MISSING_SOURCE)
        return books
    paragraphs = []
    for line, paragraph in _paragraphs(lines):
        if len(paragraph) > MAX_PARAGRAPH_CHARS:
            raise DataError(f"the paragraph starting here has {len(paragraph):,} characters, more than the tagger "
                            f"reads at once ({MAX_PARAGRAPH_CHARS:,}, spaCy's max_length); put blank lines between "
                            "its paragraphs", path=path, line=line, reason=E.MISSING_SOURCE)
        paragraphs.append(paragraph)
    return [Document(file_id, str(path), TEXT, tuple(paragraphs), split, file_id)]


def decode(path: Path, data: bytes) -> str:
    """UTF-8 text of ``data``; DataError naming the line and byte when it is not UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"not UTF-8 (byte 0x{data[e.start]:02x} at byte {e.start}); convert the file to UTF-8",
                        path=path, line=data.count(b"\n", 0, e.start) + 1, reason=E.NOT_UTF8) from None


def _read_bytes(path: Path) -> bytes:
    """The file's bytes (gunzipped), read up to ``MAX_SOURCE_BYTES``: a larger one is refused."""
    try:
        with (gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")) as f:
            data = f.read(MAX_SOURCE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:
        if not path.name.endswith(".gz"):
            raise
        raise DataError(f"cannot gunzip: {e}", path=path, reason=E.MISSING_SOURCE) from None
    if len(data) > MAX_SOURCE_BYTES:
        raise DataError(f"holds more than {MAX_SOURCE_BYTES >> 20} MiB of text{' once gunzipped' * path.name.endswith('.gz')}, "
                        "more than one source file may hold; split it into several files", path=path,
                        reason=E.MISSING_SOURCE)
    return data


def _books(path: Path, file_id: str, lines: list[str], split: str | None) -> Iterator[Document]:
    title, sentences = None, []
    for line in lines + [BOOK_MARK]:  # the sentinel closes the last book
        if line.startswith(BOOK_MARK):
            if title is not None and sentences:
                yield Document(f"{file_id}:{title}", str(path), TOKENS, tuple(sentences), split, file_id)
            title, sentences = line[len(BOOK_MARK):].lstrip(" :").strip() or "untitled", []
        elif line.strip():
            sentences.append(" ".join(line.split()))


def _paragraphs(lines: list[str]) -> Iterator[tuple[int, str]]:
    """Each paragraph (lines up to a blank one, joined) with the number of its first line."""
    para: list[str] = []
    for n, line in enumerate(lines + [""], 1):
        if line.strip():
            para.append(line.strip())
        elif para:
            yield n - len(para), " ".join(para)
            para = []
