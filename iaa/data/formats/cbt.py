"""Reader of the Children's Book Test's official question format (``.txt`` or ``.txt.gz``).

One example is 21 numbered lines followed by a blank line::

    1 First context sentence .
    ...
    20 Last context sentence .
    21 Query with XXXXX in it .<TAB>answer<TAB><TAB>cand1|cand2|...|cand10

The document is sentences 1-20 joined without their numbers. A file is cut into byte chunks at
blank lines (:func:`iter_chunks`) and each chunk is parsed with numpy and Arrow kernels
(:func:`parse_chunk`), so chunks can be parsed in parallel and no Python loop runs per token.
An incomplete last example of a file (the official samples end with one) is reported in
``ParsedChunk.truncated`` and never used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iaa.data import bad_input as E
from iaa.data.bad_input import DataError
from iaa.data.parsed import ParsedChunk, assemble, note_errors, offsets_of

PLACEHOLDER = "XXXXX"
LINES = 21          # numbered lines per example
CANDIDATES = 10     # candidates of each question: the answer and 9 distractors
WORD_TYPES = ("NE", "CN", "V", "P")
SPLIT_FILES = {"train": "train", "valid": "valid_2000ex", "test": "test_2500ex"}
CHUNK_BYTES = 4 << 20


@dataclass(frozen=True)
class RawChunk:
    """A piece of a CBT file that starts and ends at an example boundary."""

    data: bytes | memoryview
    path: str          # the file, for messages
    first_line: int    # 1-based line number of the chunk's first line in the file
    is_last: bool      # the chunk ends the file, so an incomplete last example is a cut-off one


def find_files(source: Path, word_type: str) -> dict[str, Path]:
    """The official files of one word type under ``source`` (the ``CBTest`` folder or its ``data/``).

    Returns split -> path for the splits present; raises DataError when there is no train file.
    """
    wt = word_type.upper()
    if wt not in WORD_TYPES:
        raise ValueError(f"CBT word type must be one of {WORD_TYPES}, got {word_type!r}")
    source = Path(source)
    if source.is_file():
        raise DataError(f"a file, not a folder; give the folder that holds it ({source.parent}), the CBTest folder "
                        "of CBTest.tgz or its data/ folder", path=source, reason=E.MISSING_SOURCE)
    folders = [source / "data", source] if (source / "data").is_dir() else [source]
    found: dict[str, Path] = {}
    for split, suffix in SPLIT_FILES.items():
        for folder in folders:
            for ext in (".txt", ".txt.gz"):
                path = folder / f"cbtest_{wt}_{suffix}{ext}"
                if split not in found and path.is_file():
                    found[split] = path
    if "train" not in found:
        raise DataError(
            f"no cbtest_{wt}_train.txt[.gz] here; give the CBTest folder (or its data/ folder) of CBTest.tgz",
            path=source, reason=E.MISSING_SOURCE)
    return found


def iter_chunks(path: Path, chunk_bytes: int = CHUNK_BYTES) -> Iterator[RawChunk]:
    """Stream ``path`` (gzip or plain) as chunks of about ``chunk_bytes``, each cut after a blank line.

    Chunks are zero-copy views of large read blocks: whatever this reader does while holding the
    GIL stalls the parser threads, so it copies little and counts lines with numpy (GIL released).
    """
    path = Path(path)
    tail, first_line = b"", 1
    for block in _read_blocks(path):
        view, pos = memoryview(block), 0
        if tail:  # finish the pending piece with the head of this block (a small copy)
            cut = _boundary(block, 0, chunk_bytes - len(tail))
            if cut < 0:
                tail += block
                continue
            data, pos = tail + block[:cut], cut
            yield RawChunk(data, str(path), first_line, False)
            first_line += _count_lines(data)
        while len(block) - pos >= chunk_bytes:
            cut = _boundary(block, pos, chunk_bytes)
            if cut < 0:
                break
            yield RawChunk(view[pos:cut], str(path), first_line, False)
            first_line += _count_lines(view[pos:cut])
            pos = cut
        tail = block[pos:]
    yield RawChunk(tail, str(path), first_line, True)


def _boundary(buf: bytes, pos: int, size: int) -> int:
    """End (exclusive) of the last example that ends within ``buf[pos:pos+size]``, else of the first after it; -1: none."""
    cut = buf.rfind(b"\n\n", pos, pos + max(size, 2))
    if cut < 0:
        cut = buf.find(b"\n\n", pos + max(size, 2))
    return cut + 2 if cut >= 0 else -1


def _count_lines(data: bytes | memoryview) -> int:
    return int(np.count_nonzero(np.frombuffer(data, np.uint8) == 10))  # numpy: without the GIL


UTF8_BOM = b"\xef\xbb\xbf"


def _read_blocks(path: Path, size: int = 32 << 20) -> Iterator[bytes]:
    """The file's bytes in large blocks, gunzipped when it ends in .gz (Arrow's zlib runs without the GIL).

    A UTF-8 byte order mark is dropped (editors on Windows write one); a UTF-16 file, with its
    mark or with the NUL bytes that betray one without, is a DataError at line 1."""
    gz = path.name.endswith(".gz")
    try:
        with pa.input_stream(str(path), compression="gzip" if gz else None) as f:
            first = True
            while block := f.read(size):
                if first:
                    block, first = _without_mark(block, path), False
                yield block
    except (pa.ArrowInvalid, OSError) as e:
        if not gz or isinstance(e, FileNotFoundError):
            raise
        raise DataError(f"cannot gunzip: {e}", path=path, reason=E.MISSING_LINE) from None


def _without_mark(block: bytes, path: Path) -> bytes:
    if block.startswith(UTF8_BOM):
        return block[len(UTF8_BOM):]
    if E.looks_utf16(block):
        raise DataError(E.UTF16_TEXT, path=path, line=1, reason=E.NOT_UTF8)
    return block


def read(path: Path, *, on_error: str = "fail", lowercase: bool = False) -> ParsedChunk:
    """Parse a whole CBT file in one piece (tests, small files). See :func:`parse_chunk`."""
    data = b"".join(_read_blocks(Path(path)))
    return parse_chunk(RawChunk(data, str(path), 1, True), on_error=on_error, lowercase=lowercase)


def parse_chunk(raw: RawChunk, *, on_error: str = "fail", lowercase: bool = False) -> ParsedChunk:
    """Parse one chunk into its valid examples.

    Raises DataError naming file and line for the first bad example when ``on_error="fail"``;
    with ``"skip"`` bad examples are dropped and counted by reason on the result.
    """
    lines = _Lines(raw.data)
    bad_utf8 = _utf8_errors(raw, lines)
    errs: list[DataError] = []
    group_first, group_size, ok, truncated = _check_structure(lines, raw, errs)
    for i, err in sorted(bad_utf8.items()):  # a line with bad bytes spoils its example
        g = int(np.searchsorted(group_first, i, side="right")) - 1
        inside = g >= 0 and i < group_first[g] + group_size[g]
        if inside and ok[g]:
            ok[g] = False
            errs.append(err)
        elif not inside:
            errs.append(err)
    first = group_first[ok]                                  # (E,) first line index of each example
    fields = _query_lines(lines, first + LINES - 1, raw, errs)
    good = fields["ok"]
    first = first[good]
    words, doc, doc_offsets, query, query_offsets = _tokens(lines, first, fields["query_lens"][good])
    cand_keep = pa.array(np.repeat(good, fields["cand_lens"]))
    chunk, content_errs = assemble(
        example_ids=_example_ids(raw, first), words=words,
        doc=doc, doc_offsets=doc_offsets, query=query, query_offsets=query_offsets,
        cand_words=fields["cands"].filter(cand_keep), cand_offsets=offsets_of(fields["cand_lens"][good]),
        answers=fields["answer"].filter(pa.array(good)),
        placeholder=PLACEHOLDER, lowercase=lowercase,
        where=lambda i, field: (raw.path, raw.first_line + int(first[i]) + LINES - 1),
    )
    chunk.truncated.extend(truncated)
    note_errors(chunk, errs + content_errs, on_error)
    return chunk


class _Lines:
    """Line boundaries of a byte buffer, and the line numbers CBT puts in front of each line."""

    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        b = np.frombuffer(data, dtype=np.uint8)
        nl = np.flatnonzero(b == 10)
        self.ends_with_newline = len(b) > 0 and b[-1] == 10
        ends = nl if self.ends_with_newline or not len(b) else np.append(nl, len(b))
        self.starts = np.concatenate([[0], nl + 1])[:len(ends)]                        # (N,)
        self.ends = ends - ((ends > self.starts) & (b[np.maximum(ends - 1, 0)] == 13))  # drop a \r
        self.blank = self.ends == self.starts
        last = max(len(b) - 1, 0)
        c0, c1, c2 = (np.where(self.starts + k <= last, b[np.minimum(self.starts + k, last)], 0).astype(np.int32)
                      for k in range(3)) if len(b) else (np.zeros(0, np.int32),) * 3
        d0, d1 = (c0 >= 48) & (c0 <= 57), (c1 >= 48) & (c1 <= 57)
        one, two = d0 & (c1 == 32), d0 & d1 & (c2 == 32)
        self.number = np.where(one, c0 - 48, np.where(two, (c0 - 48) * 10 + c1 - 48, -1))  # (N,) -1: none
        # Every line as an Arrow string (with its newline), zero-copy, so Arrow kernels can split them.
        small = len(b) < 2**31 - 1
        offsets = np.append(self.starts, len(b)).astype(np.int32 if small else np.int64)
        self.array = pa.Array.from_buffers(pa.string() if small else pa.large_string(), len(self.starts),
                                           [None, pa.py_buffer(offsets), pa.py_buffer(data)])

    def __len__(self) -> int:
        return len(self.starts)

    def text(self, i: int) -> str:
        return bytes(self.data[self.starts[i]:self.ends[i]]).decode("utf-8", "replace")


def _utf8_errors(raw: RawChunk, lines: _Lines) -> dict[int, DataError]:
    """Line index -> error for lines that are not UTF-8; their bytes are then replaced in ``lines``."""
    try:
        lines.array.validate(full=True)
        return {}
    except pa.ArrowInvalid:
        pass
    bad: dict[int, DataError] = {}
    start, data = 0, bytes(raw.data)
    while True:
        try:
            data[start:].decode("utf-8")
            break
        except UnicodeDecodeError as e:
            pos = start + e.start
            i = data.count(b"\n", 0, pos)
            bad.setdefault(i, DataError(f"not UTF-8 (byte 0x{data[pos]:02x} at byte {pos})",
                                        path=raw.path, line=raw.first_line + i, reason=E.NOT_UTF8))
            start = pos + max(e.end - e.start, 1)
    lines.__init__(data.decode("utf-8", "replace").encode("utf-8"))  # same lines, bad bytes replaced
    return bad


def _check_structure(lines: _Lines, raw: RawChunk, errs: list[DataError]):
    """Group lines into examples (runs of non-blank lines) and check their numbering 1..21.

    Returns (first line index (G,), line count (G,), ok (G,) bool, messages of cut-off examples).
    """
    n = len(lines)
    filled = ~lines.blank
    run_start = filled & np.concatenate([[True], lines.blank[:-1]])
    group_first = np.flatnonzero(run_start)
    if not len(group_first):  # nothing but blank lines
        if raw.first_line == 1 and raw.is_last:
            errs.append(DataError("holds no example, only blank lines" if n else "is empty", path=raw.path,
                                  reason=E.MISSING_LINE))
        return group_first, group_first, np.zeros(0, dtype=bool), []
    gid = np.cumsum(run_start) - 1
    size = np.bincount(gid[filled], minlength=len(group_first))
    pos = np.arange(n) - group_first[np.maximum(gid, 0)]
    bad_line = filled & (lines.number != pos + 1)
    ok = (size == LINES) & (np.bincount(gid[bad_line], minlength=len(group_first)) == 0)
    truncated: list[str] = []
    firsts_bad: dict[int, int] = {}
    for i in np.flatnonzero(bad_line).tolist():
        firsts_bad.setdefault(int(gid[i]), i)
    if raw.is_last and len(group_first) and not lines.ends_with_newline:
        ok[-1] = False  # the file stops inside the last example's last line: cut off, whatever is left of it
    for g in np.flatnonzero(~ok).tolist():
        f = int(group_first[g])
        last = f + int(size[g]) - 1
        if g in firsts_bad:
            i = firsts_bad[g]
            p = int(pos[i]) + 1
            if p > LINES:
                what = f"expected a blank line after line {LINES} of the example, found {lines.text(i)[:40]!r}"
            elif lines.number[i] < 0:
                what = f"expected line {p} of the example to start with its number {p}, found {lines.text(i)[:40]!r}"
            else:
                what = f"line {p} of the example is missing (found line {lines.number[i]})"
            errs.append(DataError(what, path=raw.path, line=raw.first_line + i, reason=E.MISSING_LINE))
        elif raw.is_last and last == n - 1:
            where = f"inside line {size[g]}" if size[g] == LINES or not lines.ends_with_newline else f"after line {size[g]}"
            truncated.append(f"{raw.path}, line {raw.first_line + f}: the last example is cut off {where} "
                             f"of {LINES}; it is not used")
        else:
            errs.append(DataError(f"the example ends after line {size[g]}; lines {size[g] + 1}-{LINES} are missing",
                                  path=raw.path, line=raw.first_line + last + 1, reason=E.MISSING_LINE))
    return group_first, size, ok, truncated


def _query_lines(lines: _Lines, idx: np.ndarray, raw: RawChunk, errs: list[DataError]) -> dict:
    """Split line 21 of each example into query tokens, answer and candidates (all vectorised).

    ``idx`` (E,) are the line indices. Returns flat arrays with per-example lengths and an ``ok`` mask.
    """
    text = pc.take(lines.array, pa.array(idx)).cast(pa.string())
    parts = pc.split_pattern(text, "\t")
    n_parts = pc.list_value_length(parts).to_numpy()
    ok = n_parts == 4
    safe = pc.if_else(pa.array(ok), parts, pa.scalar(["", "", "", ""], parts.type))
    query = pc.ascii_split_whitespace(pc.list_element(safe, 0))
    answer = pc.utf8_trim_whitespace(pc.list_element(safe, 1))
    cands = pc.split_pattern(pc.utf8_trim_whitespace(pc.list_element(safe, 3)), "|")
    cand_flat = pc.utf8_trim_whitespace(cands.flatten())
    cand_lens = pc.list_value_length(cands).to_numpy().astype(np.int64)
    q_flat = query.flatten()
    q_lens = pc.list_value_length(query).to_numpy().astype(np.int64)
    q_keep = pc.binary_length(q_flat).to_numpy() > 0
    q_keep[offsets_of(q_lens)[:-1][q_lens > 0]] = False            # the leading "21"
    q_rows = np.repeat(np.arange(len(idx)), q_lens)
    q_lens = np.bincount(q_rows[q_keep], minlength=len(idx)).astype(np.int64)
    empty_cand = np.bincount(np.repeat(np.arange(len(idx)), cand_lens)[pc.binary_length(cand_flat).to_numpy() == 0],
                             minlength=len(idx)) > 0
    no_answer = pc.binary_length(answer).to_numpy() == 0
    counted = ok & ~empty_cand & (cand_lens != CANDIDATES)
    for e in np.flatnonzero(~ok | empty_cand | no_answer | counted).tolist():
        reason = E.MISSING_FIELD
        if not ok[e]:
            what = (f"line {LINES} must read query<TAB>answer<TAB><TAB>candidates, "
                    f"found {n_parts[e]} tab-separated field(s)")
        elif no_answer[e]:
            what = f"line {LINES} has an empty answer field"
        elif empty_cand[e]:
            what = f"line {LINES} has an empty candidate in {text[e].as_py().split(chr(9))[3].strip()!r}"
        else:
            what, reason = (f"line {LINES} lists {cand_lens[e]} candidates; a CBT question lists {CANDIDATES} "
                            f"(the answer and {CANDIDATES - 1} others)"), E.CANDIDATE_COUNT
        errs.append(DataError(what, path=raw.path, line=raw.first_line + int(idx[e]), reason=reason))
    return {"ok": ok & ~empty_cand & ~no_answer & ~counted, "query": q_flat.filter(pa.array(q_keep)),
            "query_lens": q_lens,
            "answer": answer, "cands": cand_flat, "cand_lens": cand_lens}


def _tokens(lines: _Lines, first: np.ndarray, query_lens: np.ndarray):
    """Tokenise the lines of E examples once and pick out documents and queries.

    ``first`` (E,) is each example's first line index and ``query_lens`` (E,) its query length.
    Returns (words (D,), doc (sum Ld,) int32, doc_offsets (E+1,), query (sum Lq,) int32, query_offsets (E+1,)):
    the document is lines 1-20 without their numbers; the query is the tokens of line 21 that follow
    its number, up to the first tab (a whitespace split of the line gives them first, in order).
    """
    if len(first) == 0:
        z = np.zeros(0, np.int32)
        return pa.array([], pa.string()), z, np.zeros(1, np.int64), z, np.zeros(1, np.int64)
    lo = int(first[0])
    tok = pc.ascii_split_whitespace(lines.array[lo:int(first[-1]) + LINES])
    line_off = tok.offsets.to_numpy().astype(np.int64)
    line_off -= line_off[0]                                             # (lines+1,) token offset of each line
    flat = tok.flatten()
    encoded = pc.dictionary_encode(flat)
    idx = encoded.indices.to_numpy(zero_copy_only=False)                # (tokens,) int32
    rel = first - lo
    doc_lo, doc_hi = line_off[rel], line_off[rel + LINES - 1]           # token span of lines 1-20
    delta = np.zeros(len(idx) + 1, np.int8)
    delta[doc_lo], delta[doc_hi] = 1, -1                                 # spans are disjoint and non-empty
    keep = np.cumsum(delta[:-1], dtype=np.int8) > 0
    doc_lines = (rel[:, None] + np.arange(LINES - 1)).ravel()           # (E*20,)
    keep[line_off[doc_lines]] = False                                   # each line's number
    # A line starts with its number, so the only empty token a line can give is its last one,
    # left by the whitespace (newline) that ends it.
    last = line_off[doc_lines + 1] - 1
    empty = _string_lengths(flat, last) == 0
    keep[last[empty]] = False
    doc_lens = (doc_hi - doc_lo) - (LINES - 1) - empty.reshape(-1, LINES - 1).sum(axis=1)
    doc_offsets = offsets_of(doc_lens)
    q_offsets = offsets_of(query_lens)
    q_pos = np.repeat(line_off[rel + LINES - 1] + 1 - q_offsets[:-1], query_lens) + np.arange(q_offsets[-1])
    return encoded.dictionary, idx[keep], doc_offsets, idx[q_pos], q_offsets


def _string_lengths(arr: pa.Array, at: np.ndarray) -> np.ndarray:
    """Byte length of the strings ``arr[at]``, read off the offsets buffer."""
    dtype = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    offsets = np.frombuffer(arr.buffers()[1], dtype=dtype)[arr.offset:arr.offset + len(arr) + 1]
    return offsets[at + 1] - offsets[at]


def _example_ids(raw: RawChunk, first: np.ndarray) -> pa.Array:
    """``<file stem>:<line of the example's first line>``, unique within a file."""
    stem = Path(raw.path).name.split(".")[0]
    return pa.array([f"{stem}:{raw.first_line + int(i)}" for i in first.tolist()], pa.string())
