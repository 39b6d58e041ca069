"""The one error type of the data layer: bad input, named by file, line and what is wrong."""

from __future__ import annotations

from iaa.errors import IaaError

# Why an example was rejected. Keys of the manifest's ``skipped`` counts.
MISSING_LINE = "missing_line"
MISSING_FIELD = "missing_field"
ANSWER_NOT_CANDIDATE = "answer_not_candidate"
ANSWER_NOT_IN_DOCUMENT = "answer_not_in_document"
NO_PLACEHOLDER = "no_placeholder"
NOT_UTF8 = "not_utf8"
UNSAFE_ARCHIVE = "unsafe_archive"
MISSING_SOURCE = "missing_source"
MANY_PLACEHOLDERS = "many_placeholders"
DUPLICATE_CANDIDATE = "duplicate_candidate"
DUPLICATE_ID = "duplicate_id"
CANDIDATE_COUNT = "candidate_count"

REASONS: tuple[str, ...] = (
    MISSING_LINE, MISSING_FIELD, ANSWER_NOT_CANDIDATE, ANSWER_NOT_IN_DOCUMENT, NO_PLACEHOLDER, NOT_UTF8,
    MANY_PLACEHOLDERS, DUPLICATE_CANDIDATE, DUPLICATE_ID, CANDIDATE_COUNT,
)

UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")
UTF16_TEXT = "is UTF-16 text (or binary), not UTF-8: convert it to UTF-8 first (iconv -f UTF-16 -t UTF-8)"


def looks_utf16(head: bytes) -> bool:
    """``head``, a file's first bytes, starts with a UTF-16 byte order mark or holds the NUL bytes
    that betray UTF-16 (or binary) text without one, in its first 4 KB: no UTF-8 text does."""
    return head.startswith(UTF16_BOMS) or b"\x00" in head[:4096]


class DataError(IaaError, ValueError):
    """Bad input data. ``str(err)`` reads ``FILE, line N: what is wrong``.

    Args:
        what: what is wrong, in words a user can act on.
        path: the file (or archive member) at fault; None when no single file is.
        line: 1-based line number in that file, when known (CBT).
        reason: one of this module's reason constants, used to count skipped examples.
    """

    def __init__(self, what: str, *, path: object = None, line: int | None = None, reason: str = MISSING_FIELD) -> None:
        self.what = what
        self.path = None if path is None else str(path)
        self.line = line
        self.reason = reason
        where = self.path or ""
        if line is not None:
            where = f"{where}, line {line}" if where else f"line {line}"
        super().__init__(f"{where}: {what}" if where else what)

    def __reduce__(self):  # keep the fields when sent between processes (Ray, multiprocessing)
        return _rebuild, (self.what, self.path, self.line, self.reason)


def _rebuild(what: str, path: str | None, line: int | None, reason: str) -> DataError:
    return DataError(what, path=path, line=line, reason=reason)
