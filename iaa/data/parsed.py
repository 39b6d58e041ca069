"""Parsed cloze examples in columnar form, shared by the CBT and CNN readers.

A reader tokenises a piece of its source into flat token arrays and calls :func:`assemble`, which
dictionary-encodes the words of that piece once (in Arrow, not a Python loop), finds each
candidate's positions in the document from the words themselves, checks every example and
drops or reports the bad ones. The result, a :class:`ParsedChunk`, holds word indices into the
chunk's own small dictionary; the shard writer later maps that dictionary to vocabulary ids.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from iaa.data import bad_input as E
from iaa.data.bad_input import DataError

# (example index, the field at fault: "query" or "answer") -> (file, line) for messages
Where = Callable[[int, str], tuple[str, "int | None"]]


@dataclass(frozen=True)
class ClozeExample:
    """One cloze question as plain words, the way tests and humans read it."""

    example_id: str
    doc: tuple[str, ...]         # document tokens
    query: tuple[str, ...]       # query tokens, one of them the placeholder
    candidates: tuple[str, ...]  # in the file's order
    answer: str                  # the gold word, one of the candidates


@dataclass
class ParsedChunk:
    """The valid examples of one piece of a source file, columnar. E examples, D distinct words.

    ``doc``/``query`` hold indices into ``words``; example ``i`` owns ``doc[doc_offsets[i]:doc_offsets[i+1]]``.
    ``words`` are the matching keys (lowercased when the dataset is lowercased); ``cand_words`` are the
    candidates exactly as written in the file and ``cand_keys`` their matching keys.
    """

    example_ids: pa.Array          # (E,) string
    words: pa.Array                # (D,) string, distinct
    word_counts: np.ndarray        # (D,) int64, occurrences in documents and queries
    doc: np.ndarray                # (sum Ld,) int32 index into words
    doc_offsets: np.ndarray        # (E+1,) int64
    doc_cand: np.ndarray           # (sum Ld,) int32 candidate index of each document token, -1 for none
    query: np.ndarray              # (sum Lq,) int32 index into words
    query_offsets: np.ndarray      # (E+1,) int64
    cand_words: pa.Array           # (sum C,) string, as in the file
    cand_keys: pa.Array            # (sum C,) string, the words vocabulary ids are looked up by
    cand_offsets: np.ndarray       # (E+1,) int64
    answer: np.ndarray             # (E,) int32 index into the example's candidates
    skipped: Counter = field(default_factory=Counter)     # reason -> count of dropped examples
    skip_messages: list[str] = field(default_factory=list)  # the first few, for the manifest
    truncated: list[str] = field(default_factory=list)      # one message per cut-off trailing example
    sources: pa.Array | None = None  # (E,) string: each example's file, where its id does not name it

    def __len__(self) -> int:
        return len(self.answer)

    def examples(self) -> list[ClozeExample]:
        """The chunk as records (slow: Python objects per token; for tests and small data)."""
        words = np.array(self.words.to_pylist(), dtype=object)
        ids, cands = self.example_ids.to_pylist(), self.cand_words.to_pylist()
        out = []
        for i in range(len(self)):
            c = cands[self.cand_offsets[i]:self.cand_offsets[i + 1]]
            out.append(ClozeExample(
                example_id=ids[i],
                doc=tuple(words[self.doc[self.doc_offsets[i]:self.doc_offsets[i + 1]]]),
                query=tuple(words[self.query[self.query_offsets[i]:self.query_offsets[i + 1]]]),
                candidates=tuple(c),
                answer=c[self.answer[i]],
            ))
        return out


MAX_MESSAGES = 20


def lengths(offsets: np.ndarray) -> np.ndarray:
    """(E+1,) offsets -> (E,) lengths."""
    return np.diff(offsets)


def offsets_of(lens: np.ndarray) -> np.ndarray:
    """(E,) lengths -> (E+1,) int64 offsets."""
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    return out


def select_ragged(values: np.ndarray | pa.Array, offsets: np.ndarray, keep: np.ndarray):
    """Keep the rows ``keep`` (E,) bool of a ragged array; returns (values, offsets)."""
    lens = lengths(offsets)
    mask = np.repeat(keep, lens)
    values = values[mask] if isinstance(values, np.ndarray) else values.filter(pa.array(mask))
    return values, offsets_of(lens[keep])


def row_of(offsets: np.ndarray) -> np.ndarray:
    """(E+1,) offsets -> (sum L,) int32 row index of every element."""
    return np.repeat(np.arange(len(offsets) - 1, dtype=np.int32), lengths(offsets))


def match_keys(words: pa.Array, lowercase: bool, keep: str) -> pa.Array:
    """The words candidates are matched by: lowercased when asked, except the placeholder ``keep``."""
    if not lowercase:
        return words
    return pc.if_else(pc.equal(words, keep), words, pc.utf8_lower(words))


def encode(doc_tokens: pa.Array, query_tokens: pa.Array) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Dictionary-encode flat token arrays together: (words (D,), doc (sum Ld,) int32, query (sum Lq,) int32)."""
    encoded = pc.dictionary_encode(pa.concat_arrays([doc_tokens.cast(pa.string()), query_tokens.cast(pa.string())]))
    idx = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    return encoded.dictionary, idx[:len(doc_tokens)], idx[len(doc_tokens):]


def assemble(
    *,
    example_ids: pa.Array,
    words: pa.Array,
    doc: np.ndarray, doc_offsets: np.ndarray,
    query: np.ndarray, query_offsets: np.ndarray,
    cand_words: pa.Array, cand_offsets: np.ndarray,
    answers: pa.Array,
    placeholder: str,
    lowercase: bool,
    where: Where,
    answer_kind: Callable[[int], tuple[str, str]] | None = None,
    sources: pa.Array | None = None,
) -> tuple[ParsedChunk, list[DataError]]:
    """Check E encoded examples; return the valid ones and one error per bad one.

    Args:
        words: (D,) distinct words; ``doc``/``query`` index it, cut per example by ``*_offsets`` (E+1,).
            It may hold words no document or query uses.
        cand_words: flat candidates as written, cut per example by ``cand_offsets``.
        answers: (E,) the gold word of each example.
        placeholder: the query token that marks the gap (``XXXXX`` or ``@placeholder``).
        lowercase: match and count words case-folded (the placeholder keeps its case).
        where: (example index, field at fault: ``query`` or ``answer``) -> (file, line) named by its error.
        answer_kind: optional example index -> (reason, message) used when the answer is not
            among the candidates (CNN words this differently from CBT).
        sources: optional (E,) file of each example, kept with it to name where an id repeats.
    """
    n = len(answers)
    exact_words, exact_doc = words, doc
    if lowercase:
        words, doc, query = _fold_case(words, doc, query, placeholder)
    cand_keys = match_keys(cand_words, lowercase, placeholder)
    cand_local = _lookup(cand_keys, words)                                       # (sum C,) -1: not in any text
    answer = _answer_index(cand_words, cand_offsets, answers)                    # (E,)
    doc_cand = _doc_candidates(doc, doc_offsets, cand_local, cand_offsets, len(words))
    if lowercase:
        doc_cand = _split_case_variants(doc_cand, exact_doc, doc_offsets, _lookup(cand_words, exact_words),
                                        cand_local, cand_offsets, len(exact_words))
    checks = _Checks(
        placeholders=_placeholder_counts(query, query_offsets, pc.index(words, placeholder).as_py(), n),
        duplicate=_duplicate_candidates(cand_words, cand_offsets),
        answer=answer, answer_in_doc=_answer_in_doc(doc_cand, doc_offsets, answer))
    bad_rows = checks.bad_rows()
    errs = [_error_of(i, checks, where, placeholder, answers, cand_words, cand_offsets, answer_kind)
            for i in bad_rows.tolist()]
    chunk = _chunk_of(
        _keep_mask(n, bad_rows), example_ids=example_ids, words=words, doc=doc, doc_offsets=doc_offsets,
        doc_cand=doc_cand, query=query, query_offsets=query_offsets, cand_words=cand_words, cand_keys=cand_keys,
        cand_offsets=cand_offsets, answer=answer, sources=sources,
    )
    return chunk, errs


def _fold_case(words: pa.Array, doc: np.ndarray, query: np.ndarray,
               placeholder: str) -> tuple[pa.Array, np.ndarray, np.ndarray]:
    """Fold the distinct words (D,) to lower case, then remap every token through them.

    Returns (folded words (D',), doc (sum Ld,) int32, query (sum Lq,) int32), indices into the folded
    words; the placeholder keeps its case.
    """
    folded = pc.dictionary_encode(match_keys(words, True, placeholder))
    remap = folded.indices.to_numpy(zero_copy_only=False).astype(np.int32)
    return folded.dictionary, remap[doc], remap[query]


def _placeholder_counts(query: np.ndarray, query_offsets: np.ndarray, ph: int, n: int) -> np.ndarray:
    """(E,) number of tokens equal to word index ``ph`` (the placeholder; -1: absent) in each query."""
    rows = np.searchsorted(query_offsets, np.flatnonzero(query == ph), side="right") - 1
    return np.bincount(rows, minlength=n)[:n]


@dataclass(frozen=True)
class _Checks:
    """What :func:`assemble` found about each of E examples; any failed check rejects the example."""

    placeholders: np.ndarray   # (E,) int, placeholder tokens in the query; a cloze query has one
    duplicate: np.ndarray      # (E,) bool, some spelling listed twice among the candidates
    answer: np.ndarray         # (E,) int32 index of the answer among the candidates, -1 if absent
    answer_in_doc: np.ndarray  # (E,) bool, the answer candidate occurs in the document

    def bad_rows(self) -> np.ndarray:
        """Sorted indices of the rejected examples."""
        return np.flatnonzero((self.placeholders != 1) | self.duplicate | (self.answer < 0) | ~self.answer_in_doc)


def _error_of(i: int, checks: _Checks, where: Where, placeholder: str, answers: pa.Array, cand_words: pa.Array,
              cand_offsets: np.ndarray, answer_kind: Callable[[int], tuple[str, str]] | None) -> DataError:
    """The error for rejected example ``i``, naming its file and line and the first check it fails."""
    path, line = where(i, "query" if checks.placeholders[i] != 1 else "answer")
    if checks.placeholders[i] == 0:
        return DataError(f"the query has no {placeholder} placeholder", path=path, line=line, reason=E.NO_PLACEHOLDER)
    if checks.placeholders[i] > 1:
        return DataError(f"the query has {checks.placeholders[i]} {placeholder} placeholders; a cloze query has one",
                         path=path, line=line, reason=E.MANY_PLACEHOLDERS)
    if checks.duplicate[i]:
        cands = cand_words[cand_offsets[i]:cand_offsets[i + 1]].to_pylist()
        twice = sorted({c for c in cands if cands.count(c) > 1})
        return DataError(f"candidate(s) {twice} listed more than once in {cands}",
                         path=path, line=line, reason=E.DUPLICATE_CANDIDATE)
    if checks.answer[i] < 0:
        if answer_kind is not None:
            reason, what = answer_kind(i)
        else:
            cands = cand_words[cand_offsets[i]:cand_offsets[i + 1]].to_pylist()
            reason, what = E.ANSWER_NOT_CANDIDATE, f"answer {answers[i].as_py()!r} is not among the candidates {cands}"
        return DataError(what, path=path, line=line, reason=reason)
    return DataError(f"answer {answers[i].as_py()!r} does not occur in the document",
                     path=path, line=line, reason=E.ANSWER_NOT_IN_DOCUMENT)


def _keep_mask(n: int, bad_rows: np.ndarray) -> np.ndarray | None:
    """(E,) bool, False at ``bad_rows``; None when every example is kept."""
    if not len(bad_rows):
        return None
    keep = np.ones(n, dtype=bool)
    keep[bad_rows] = False
    return keep


def _chunk_of(keep: np.ndarray | None, *, example_ids: pa.Array, words: pa.Array,
              doc: np.ndarray, doc_offsets: np.ndarray, doc_cand: np.ndarray,
              query: np.ndarray, query_offsets: np.ndarray,
              cand_words: pa.Array, cand_keys: pa.Array, cand_offsets: np.ndarray,
              answer: np.ndarray, sources: pa.Array | None = None) -> ParsedChunk:
    """The chunk of the examples ``keep`` (E,) bool marks (all when None), its words counted over what is kept."""
    if keep is not None:
        doc_cand, _ = select_ragged(doc_cand, doc_offsets, keep)
        doc, doc_offsets = select_ragged(doc, doc_offsets, keep)
        query, query_offsets = select_ragged(query, query_offsets, keep)
        cand_words, _ = select_ragged(cand_words, cand_offsets, keep)
        cand_keys, cand_offsets = select_ragged(cand_keys, cand_offsets, keep)
        example_ids, answer = example_ids.filter(pa.array(keep)), answer[keep]
        sources = sources.filter(pa.array(keep)) if sources is not None else None
    counts = np.bincount(doc, minlength=len(words)) + np.bincount(query, minlength=len(words))
    return ParsedChunk(
        example_ids=example_ids, words=words, word_counts=counts.astype(np.int64),
        doc=doc, doc_offsets=doc_offsets, doc_cand=doc_cand, query=query, query_offsets=query_offsets,
        cand_words=cand_words, cand_keys=cand_keys, cand_offsets=cand_offsets, answer=answer, sources=sources,
    )


def _answer_index(cand_words: pa.Array, cand_offsets: np.ndarray, answers: pa.Array) -> np.ndarray:
    """(E,) int32 index of the first candidate equal to the answer (exact spelling), -1 if none."""
    rows = row_of(cand_offsets)
    same = pc.equal(cand_words, pc.take(answers, pa.array(rows))).to_numpy(zero_copy_only=False)
    first = np.full(len(answers), np.iinfo(np.int32).max, dtype=np.int64)
    hit = np.flatnonzero(same)
    np.minimum.at(first, rows[hit], hit - cand_offsets[rows[hit]])
    first[first == np.iinfo(np.int32).max] = -1
    return first.astype(np.int32)


def _lookup(keys: pa.Array, words: pa.Array) -> np.ndarray:
    """(n,) int32 index of each key in ``words``, -1 where absent."""
    return pc.fill_null(pc.index_in(keys, value_set=words), -1).to_numpy().astype(np.int32)


def _duplicate_candidates(cand_words: pa.Array, cand_offsets: np.ndarray) -> np.ndarray:
    """(E,) bool: the example lists one spelling twice among its candidates."""
    n = len(cand_offsets) - 1
    if not len(cand_words):
        return np.zeros(n, dtype=bool)
    code = pc.dictionary_encode(cand_words).indices.to_numpy(zero_copy_only=False).astype(np.int64)
    rows = row_of(cand_offsets).astype(np.int64)
    pairs = np.unique(rows * (int(code.max()) + 1) + code)
    return np.bincount(pairs // (int(code.max()) + 1), minlength=n)[:n] < np.diff(cand_offsets)


def _answer_in_doc(doc_cand: np.ndarray, doc_offsets: np.ndarray, answer: np.ndarray) -> np.ndarray:
    """(E,) bool: some document token of the example is its answer candidate."""
    n = len(doc_offsets) - 1
    rows = row_of(doc_offsets)
    hit = (doc_cand >= 0) & (doc_cand == answer[rows]) if len(rows) else np.zeros(0, bool)
    return np.bincount(rows[hit], minlength=n)[:n] > 0


TABLE_CELLS = 1 << 22  # (rows x distinct candidate words) per lookup table, 16 MB of int32


def _doc_candidates(doc: np.ndarray, doc_offsets: np.ndarray, cand_local: np.ndarray, cand_offsets: np.ndarray,
                    n_words: int) -> np.ndarray:
    """(sum Ld,) int32 candidate index of each document token (-1: none), from word indices.

    Works on words, not vocabulary ids, so two candidates unseen in training stay apart.
    When two candidates share a word (case folded), the first one in file order gets the positions.
    A dense (example, candidate word) -> slot table answers each token with one lookup.
    """
    n = len(doc_offsets) - 1
    out = np.full(len(doc), -1, dtype=np.int32)
    ok = cand_local >= 0
    if n == 0 or not ok.any():
        return out
    rows = row_of(cand_offsets)[ok]
    slots = (np.arange(len(cand_local)) - cand_offsets[row_of(cand_offsets)])[ok]
    uniq = np.unique(cand_local[ok])
    code = np.full(n_words, -1, np.int64)                                # word -> candidate-word code
    code[uniq] = np.arange(len(uniq))
    width = len(uniq)
    keys = rows * width + code[cand_local[ok]]                           # (example, code) of each candidate
    keys, first = np.unique(keys, return_index=True)                     # first slot wins on duplicates
    slots = slots[first]
    doc_code = code[doc]
    step = max(TABLE_CELLS // width, 1)
    for r0 in range(0, n, step):                                         # blocks of examples bound the table size
        r1 = min(r0 + step, n)
        lo, hi = doc_offsets[r0], doc_offsets[r1]
        pos = lo + np.flatnonzero(doc_code[lo:hi] >= 0)                  # tokens that are some candidate word
        pos_row = np.searchsorted(doc_offsets, pos, side="right") - 1
        table = np.full((r1 - r0) * width, -1, np.int32)
        k0, k1 = np.searchsorted(keys, [r0 * width, r1 * width])
        table[keys[k0:k1] - r0 * width] = slots[k0:k1]
        out[pos] = table[(pos_row - r0) * width + doc_code[pos]]
    return out


def _split_case_variants(doc_cand: np.ndarray, exact_doc: np.ndarray, doc_offsets: np.ndarray,
                         cand_exact: np.ndarray, cand_folded: np.ndarray, cand_offsets: np.ndarray,
                         n_exact: int) -> np.ndarray:
    """Keep candidates that differ only in case (``TOM``, ``Tom``) apart after folding.

    ``doc_cand`` gives a folded word's positions to the first such candidate; a token spelled
    exactly like another candidate of the group goes to that one instead. Other case variants
    (``tom``) stay with the first. Same rule as for unseen candidates: words decide, not ids.
    """
    rows = row_of(cand_offsets).astype(np.int64)
    width = int(cand_folded.max(initial=0)) + 2
    group = rows * width + cand_folded + 1                               # (sum C,) (example, folded word or -1)
    uniq, inverse, sizes = np.unique(group, return_inverse=True, return_counts=True)
    shared = (sizes[inverse] > 1) & (cand_folded >= 0) & (cand_exact >= 0)
    if not shared.any():
        return doc_cand
    exact = _doc_candidates(exact_doc, doc_offsets, np.where(shared, cand_exact, -1), cand_offsets, n_exact)
    return np.where(exact >= 0, exact, doc_cand).astype(np.int32)


def note_errors(chunk: ParsedChunk, errs: list[DataError], on_error: str) -> None:
    """Raise the first error (fail), or count them on the chunk (skip)."""
    if not errs:
        return
    if on_error == "fail":
        raise min(errs, key=lambda e: (e.line or 0))
    for e in sorted(errs, key=lambda e: (e.line or 0)):
        chunk.skipped[e.reason] += 1
        if len(chunk.skip_messages) < MAX_MESSAGES:
            chunk.skip_messages.append(str(e))
