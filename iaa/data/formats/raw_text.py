"""Cloze questions from outside a prepared dataset, turned into rows like ``prepare`` writes.

Three inputs: JSON Lines of ``{"id", "document", "query", "candidates"[, "answer", "entities"]}``
with raw text, a CBT file, or a CNN ``.question`` file (checked as ``prepare`` checks it). JSON Lines are strict: lines end at ``\n`` only
(a U+2028 inside a string is text), ``document`` and ``query`` are strings, ``candidates`` a
list of strings (or one string of ``|``- or space-separated words), each candidate one word
(never empty, blank or several words: the reader points at single words), ``id`` a string or an
integer and unique, ``answer`` one of the candidates, ``entities`` an object of names (``{"@entity0":
"Ann Lee"}``, as a CNN file's ``@entityN:Name`` lines give them); an empty file and undecodable bytes are
errors naming the file and line, and so are text that is not Unicode (a lone surrogate such as
``"\\ud800"``), a number of more than ``MAX_NUMBER_DIGITS`` digits and JSON nested deeper than
Python reads (:func:`loads`). Raw text is split on whitespace, as both parsers
split their lines. The rows go through the parsers' own ``assemble`` (placeholder and candidate
matching, optional lowercasing) and ``to_table`` (vocabulary ids, ``<unk>`` for unseen words,
``doc_cand`` from the words themselves, so distinct unseen candidates stay apart).
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from iaa.data.parsed import ClozeExample, ParsedChunk, assemble, encode, match_keys, offsets_of
from iaa.data.prepared.shards import to_table
from iaa.data.prepared.vocab import Vocab
from iaa.errors import IaaError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
RECORD_KEYS = ("id", "document", "query", "candidates", "answer", "entities")   # what a JSON Lines question holds
MAX_NUMBER_DIGITS = 40        # an integer id of more is refused (Python itself stops at 4,300)
SHOWN = 5                     # candidates named in a message, then "and N more"
CNN_QUERY_LINE = 5  # url, blank, context, blank, query: what a CNN question's messages point at


class InputError(IaaError):
    """A question that cannot be answered as given; the message names the input and line."""


@dataclass(frozen=True)
class Question:
    """One question as read, with its gold answer (None when the input gives none)."""

    example: ClozeExample
    gold: str | None
    where: str            # "FILE:LINE", for messages
    names: tuple[tuple[str, str], ...] = ()   # (word, its real name): a CNN question's entity names

    def name_of(self, word: str) -> str | None:
        """The real name the input gives ``word`` (an ``@entityN``), or None."""
        return dict(self.names).get(word)


def read_input(path: Path, placeholder: str) -> list[Question]:
    """The questions of ``path``: JSON Lines, a CNN ``.question`` file, or else a CBT file."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such input file")
    if path.name.endswith(JSONL_SUFFIXES):
        return _read_jsonl(path, placeholder)
    if path.suffix == ".question":
        from iaa.data.formats import cnn

        try:
            ex, names = cnn.read_question(str(path), path.read_bytes())
        except cnn.DataError as err:               # prepare's words: the file, the line, what is wrong
            raise InputError(str(err)) from None
        return [Question(ex, ex.answer, f"{path}:{CNN_QUERY_LINE}", tuple(names.items()))]
    from iaa.data.formats import cbt

    chunk = cbt.read(path, on_error="fail")
    questions = [Question(ex, ex.answer, f"{path}:{ex.example_id.rsplit(':', 1)[-1]}") for ex in chunk.examples()]
    if not questions and chunk.truncated:
        raise InputError(f"no complete question: {chunk.truncated[0]}")
    for message in chunk.truncated:                 # the file stops inside its last example
        warnings.warn(message, stacklevel=2)
    return questions


def _read_jsonl(path: Path, placeholder: str) -> list[Question]:
    """Every record of a JSON Lines file, split on ``\n`` only; ids unique. A byte-order mark
    that starts the file (as some Windows editors write) is not part of the first record."""
    questions: list[Question] = []
    first_line: dict[str, int] = {}
    numbered: set[int] = set()                     # lines without an id: their number stands for one
    unread: dict[str, int] = {}                    # keys no question has, by the first line that gives one
    for n, raw in enumerate(path.read_bytes().removeprefix(codecs.BOM_UTF8).split(b"\n"), 1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"{path}:{n}: not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1})") from None
        if not line.strip():
            continue
        record = _json(line, f"{path}:{n}")
        q = from_record(record, f"{path}:{n}", placeholder)
        if "entities" in record:
            q = dataclasses.replace(q, names=_entity_names(record["entities"], f"{path}:{n}"))
        for key in record.keys() - set(RECORD_KEYS):
            unread.setdefault(key, n)
        if q.example.example_id in first_line:
            earlier = first_line[q.example.example_id]
            taken = " (it has no id: its line number stands for one)" if earlier in numbered else ""
            raise InputError(f"{path}:{n}: id {q.example.example_id!r} is also the id of line {earlier}{taken}; "
                             "give every question its own id")
        if "id" not in record:
            numbered.add(n)
        first_line[q.example.example_id] = n
        questions.append(q)
    if not questions:
        raise InputError(f"{path}: no question in the file (it is empty or holds only blank lines)")
    if unread:
        keys = ", ".join(f"{key!r} (line {n})" for key, n in sorted(unread.items(), key=lambda kv: kv[1]))
        warnings.warn(f"{path}: key(s) {keys} are not read; a question's keys are {', '.join(RECORD_KEYS)}",
                      stacklevel=2)
    return questions


class LongNumber:
    """A JSON integer of more than ``MAX_NUMBER_DIGITS`` digits, kept as its length: it is never a
    valid value, and the field that holds it names it in the error."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _integer(text: str) -> int | LongNumber:
    digits = len(text.lstrip("-"))
    return LongNumber(digits) if digits > MAX_NUMBER_DIGITS else int(text)


def loads(text: str | bytes, where: str) -> Any:
    """JSON text as Python values; a too-long integer becomes a :class:`LongNumber`.

    Raises:
        InputError: not JSON, or nested deeper than Python's recursion limit (named ``where``).
    """
    try:
        return json.loads(text, parse_int=_integer)
    except json.JSONDecodeError as err:
        raise InputError(f"{where}: not valid JSON ({err.msg.removesuffix(' at')} at column {err.colno})") from None
    except UnicodeDecodeError as err:
        raise InputError(f"{where}: not valid JSON (not UTF-8 text at byte {err.start})") from None
    except RecursionError:
        raise InputError(f"{where}: not valid JSON (nested too deeply; a question is an object of strings and "
                         "a list of strings)") from None


def text_problem(value: str) -> str | None:
    """Why ``value`` is not Unicode text (a lone surrogate cannot be written as UTF-8), else None."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as err:
        return (f"holds a lone surrogate (\\u{ord(value[err.start]):04x} at character {err.start + 1}), which is "
                "not Unicode text; send each character as itself or as a surrogate pair")
    return None


def _json(line: str, where: str) -> dict[str, Any]:
    record = loads(line, where)
    if not isinstance(record, dict):
        raise InputError(f"{where}: expected a JSON object with id, document, query, candidates")
    return record


def from_record(record: dict[str, Any], where: str, placeholder: str) -> Question:
    """One ``{"id", "document", "query", "candidates"[, "answer"]}`` record, checked."""
    missing = [k for k in ("document", "query", "candidates") if k not in record]
    if missing:
        raise InputError(f"{where}: missing {', '.join(missing)} (a question needs document, query and candidates; "
                         "id and answer are optional)")
    for key in ("document", "query"):
        if not isinstance(record[key], str):
            raise InputError(f"{where}: {key} must be a string of text, got {_kind(record[key])}")
    cands = _candidates(record["candidates"], where)
    texts = [("document", record["document"]), ("query", record["query"]), *(("candidates", c) for c in cands),
             *((key, record[key]) for key in ("id", "answer") if isinstance(record.get(key), str))]
    for key, text in texts:
        if problem := text_problem(text):
            raise InputError(f"{where}: {key} {problem}")
    query = record["query"].split()
    if placeholder not in query:
        raise InputError(f"{where}: the query has no {placeholder} placeholder (it marks the word to fill in)")
    doc = record["document"].split()
    if not doc:
        raise InputError(f"{where}: the document is empty")
    example_id = record.get("id", where.rsplit(":", 1)[-1])
    if isinstance(example_id, bool) or not isinstance(example_id, (str, int)) or not str(example_id).strip():
        raise InputError(f"{where}: id must be a non-empty string or an integer, got {_kind(example_id)}")
    gold = record.get("answer")
    if gold is not None and not isinstance(gold, str):
        raise InputError(f"{where}: answer must be a string (one of the candidates), got {_kind(gold)}")
    if gold is not None and gold.strip() not in cands:
        raise InputError(f"{where}: the answer {gold!r} is not one of the candidates ({named(cands)})")
    example = ClozeExample(str(example_id), tuple(doc), tuple(query), tuple(cands), "")
    return Question(example, None if gold is None else gold.strip(), where)


def _entity_names(entities: Any, where: str) -> tuple[tuple[str, str], ...]:
    """A record's ``entities``: an object from words (``@entity0``) to their real names, as strings.

    Raises:
        InputError: not an object, a name that is not a string, or text that is not Unicode.
    """
    if not isinstance(entities, dict):
        raise InputError(f"{where}: entities must be an object of names ({{\"@entity0\": \"Ann Lee\"}}), got "
                         f"{_kind(entities)}")
    for word, name in entities.items():
        if not isinstance(name, str):
            raise InputError(f"{where}: entities[{_quoted(word)}] must be a string (a name), got {_kind(name)}")
        for text in (word, name):
            if problem := text_problem(text):
                raise InputError(f"{where}: entities {problem}")
    return tuple((word, name.strip()) for word, name in entities.items())


def _candidates(cands: Any, where: str) -> list[str]:
    """The candidate words of a record's ``candidates``: a list, or one string of ``|``- or
    space-separated words; each is stripped of surrounding spaces.

    Raises:
        InputError: not strings, an empty list, or a candidate that is empty, blank or several
            words (the reader points at one word of the document), named by its index (from 1).
    """
    as_string = isinstance(cands, str)
    if as_string:
        cands = cands.split("|") if "|" in cands else cands.split()
    if not isinstance(cands, list):
        raise InputError(f"{where}: candidates must be a list of strings, got {_kind(cands)}")
    for c in cands:
        if not isinstance(c, str):
            raise InputError(f"{where}: candidates must be a list of strings, got one that is {_kind(c)}")
    if not cands:
        raise InputError(f"{where}: the candidate list is empty")
    for i, c in enumerate(cands, 1):                   # counted from 1, as lines and ids are
        field = f"candidates[{i}]" + (" of the |-separated string" if as_string else "")
        if not c.strip():
            raise InputError(f"{where}: {field}: an empty candidate ({_quoted(c)}); each candidate is one word "
                             "of the document")
        if len(c.split()) > 1:
            raise InputError(f"{where}: {field}: {_quoted(c)} is {len(c.split())} words; candidates are single "
                             "words (the reader points at one word of the document)")
    return [c.strip() for c in cands]


def _quoted(text: str, most: int = 40) -> str:
    """``text`` as a JSON string for a message, cut after ``most`` characters."""
    shown = json.dumps(text[:most] + ("..." if len(text) > most else ""), ensure_ascii=False)
    return shown.encode("utf-8", "backslashreplace").decode("utf-8")      # a lone surrogate as \ud800


def _kind(value: Any) -> str:
    """How a JSON value reads in a message: ``a list``, ``null``, ``the number 3``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, LongNumber):
        return f"a number of {value.digits:,} digits (at most {MAX_NUMBER_DIGITS}; give such an id as a string)"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    return {list: "a list", dict: "an object", str: "a string"}.get(type(value), type(value).__name__)


def named(words: Sequence[str]) -> str:
    """``a, b, c`` for a message: the first ``SHOWN`` words, then how many more."""
    more = f" and {len(words) - SHOWN:,} more" if len(words) > SHOWN else ""
    return ", ".join(words[:SHOWN]) + more


def to_rows(questions: Sequence[Question], vocab: Vocab, lowercase: bool) -> pa.Table:
    """Rows with ``iaa.data.prepared.shards.SCHEMA`` columns, one per question, in order.

    ``answer`` holds a candidate that occurs in the document (the model needs none; the gold is
    kept on the ``Question``). A candidate absent from its document gets probability 0: warned
    about here. A question with no candidate in its document cannot be answered: an error.
    """
    return to_table(assembled(questions, vocab.placeholder, lowercase), vocab)


def assembled(questions: Sequence[Question], placeholder: str, lowercase: bool) -> ParsedChunk:
    """The questions checked and matched as ``prepare`` does (one placeholder, no candidate listed
    twice, some candidate in the document), before any vocabulary: what :func:`to_rows` maps to ids.

    Raises:
        InputError: the first question that cannot be answered, named by its ``where``.
    """
    stand_ins = [present_candidate(q, lowercase, placeholder) for q in questions]
    words, doc, query = encode(pa.array([w for q in questions for w in q.example.doc], pa.string()),
                               pa.array([w for q in questions for w in q.example.query], pa.string()))
    chunk, errs = assemble(
        example_ids=pa.array([q.example.example_id for q in questions], pa.string()), words=words,
        doc=doc, doc_offsets=_offsets(len(q.example.doc) for q in questions),
        query=query, query_offsets=_offsets(len(q.example.query) for q in questions),
        cand_words=pa.array([c for q in questions for c in q.example.candidates], pa.string()),
        cand_offsets=_offsets(len(q.example.candidates) for q in questions),
        answers=pa.array(stand_ins, pa.string()),
        placeholder=placeholder, lowercase=lowercase, where=lambda i, field: (questions[i].where, None),
        sources=pa.array([q.where for q in questions], pa.string()),
    )
    if errs:
        raise InputError(str(errs[0]))
    return chunk


def labelled_rows(questions: Sequence[Question], vocab: Vocab, lowercase: bool, *, need_answers: bool) -> pa.Table:
    """:func:`to_rows` with each question's own answer in ``answer`` (-1 where none is given).

    Raises:
        InputError: ``need_answers`` and a question gives no answer, or an answer that is not one
            of its candidates (named by file and line).
    """
    missing = [q for q in questions if q.gold is None]
    if need_answers and missing:
        gives = "gives" if len(missing) == 1 else "give"
        raise InputError(f"{missing[0].where}: no answer: evaluation needs the answer of every question (an "
                         f"\"answer\" that is one of its candidates); {len(missing)} of the {len(questions)} "
                         f"questions {gives} none")
    for q in questions:
        if q.gold is not None and q.gold not in q.example.candidates:
            raise InputError(f"{q.where}: the answer {q.gold!r} is not one of the candidates "
                             f"({named(q.example.candidates)})")
    table = to_rows(questions, vocab, lowercase)
    gold = [-1 if q.gold is None else q.example.candidates.index(q.gold) for q in questions]
    return table.set_column(table.schema.get_field_index("answer"), table.schema.field("answer"),
                            pa.array(gold, pa.int32()))


def present_candidate(q: Question, lowercase: bool, placeholder: str) -> str:
    """The first candidate that occurs in the document; warns about the absent ones."""
    keys = set(match_keys(pa.array(q.example.doc, pa.string()), lowercase, placeholder).to_pylist())
    cands = q.example.candidates
    cand_keys = match_keys(pa.array(cands, pa.string()), lowercase, placeholder).to_pylist()
    absent = [c for c, k in zip(cands, cand_keys) if k not in keys]
    if len(absent) == len(cands):
        raise InputError(f"{q.where}: no candidate occurs in the document, so the reader cannot point at any")
    if absent:
        warnings.warn(f"{q.where}: candidate(s) {named(absent)} do not occur in the document: probability 0",
                      stacklevel=2)
    return next(c for c, k in zip(cands, cand_keys) if k in keys)


def _offsets(lens: Iterable[int]) -> np.ndarray:
    return offsets_of(np.fromiter(lens, np.int64))
