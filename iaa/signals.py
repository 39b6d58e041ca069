"""Blocks that a first SIGINT or SIGTERM must not cut in half.

A store write stopped halfway (a ``KeyboardInterrupt`` raised inside SQLite's transaction) leaves
its database locked by this very process, and the marks that a stop makes next (the run KILLED)
then wait on that lock until they fail. :func:`held` lets the block finish: a handler that
consults :func:`holding` records the signal instead of raising, and the block's end calls the
handler again (not the signal: a second one would count as the user's), so the stop happens right
after the write. Plain Python signals; nothing here knows a store.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_depth = 0
_pending: list[int] = []


def holding() -> bool:
    """Whether the main thread is inside a :func:`held` block now."""
    return _depth > 0


def hold(signum: int) -> None:
    """Keep ``signum`` for the end of the outermost :func:`held` block."""
    if signum not in _pending:
        _pending.append(signum)


@contextmanager
def held() -> Iterator[None]:
    """Run the block whole; a signal kept meanwhile (:func:`hold`) is handled at its end."""
    global _depth
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0 and _pending:
            signum = _pending.pop(0)
            _pending.clear()
            handler = signal.getsignal(signum)
            if callable(handler):
                handler(signum, None)
