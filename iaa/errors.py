"""The project's one error type for expected failures.

An :class:`IaaError` is something a user can fix: bad input data, a bad setting, a missing or
damaged file, an unreachable service. The CLI shows it as a one-line message and exits non-zero.
Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class IaaError(Exception):
    """An expected failure, with a message that says what is wrong and what to do."""


# Lines of a store's error that say where it happened, not what went wrong (SQLAlchemy spans
# several: a note on autoflush, the statement, its parameters and a link).
_NOISE = ("(raised as a result of", "[SQL:", "[parameters:", "(Background on this error")


def brief(err: BaseException | str) -> str:
    """The line of an error that says what is wrong, at most 300 characters."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip() and not line.strip().startswith(_NOISE)]
    return lines[0][:300] if lines else type(err).__name__


def printable(text: object, keep_lines: bool = False) -> str:
    """``text`` safe to show on a terminal: each non-printable character (C0 and C1 controls, DEL,
    line and paragraph separators, unassigned code points) escaped as Python's ``repr`` writes it
    (``\\x1b``, ``\\n``, ``\\u2028``); printable Unicode (``é``, ``模型``) is kept. ``keep_lines``
    keeps newlines, for text of several lines. A file's escape sequence then cannot clear the
    screen or rewrite what is shown."""
    text = str(text)
    if text.isprintable():
        return text
    if keep_lines:
        return "\n".join(printable(line) for line in text.split("\n"))
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
