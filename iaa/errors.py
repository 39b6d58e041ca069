"""The project's one error type for expected failures.

An :class:`IaaError` is something a user can fix: bad input data, a bad setting, a missing or
damaged file, an unreachable service. The CLI shows it as a one-line message and exits non-zero.
Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class IaaError(Exception):
    """An expected failure, with a message that says what is wrong and what to do."""
