"""Blocks that a first SIGINT or SIGTERM must not cut in half.

A store write stopped halfway (a ``KeyboardInterrupt`` raised inside SQLite's transaction) leaves
its database locked by this very process, and the marks that a stop makes next (the run KILLED)
then wait on that lock until they fail. :func:`held` lets the block finish: a handler that
consults :func:`holding` records the signal instead of raising, and the block's end calls the
handler again (not the signal: a second one would count as the user's), so the stop happens right
after the write. Plain Python signals; nothing here knows a store.

A fork is such a block too. The :mod:`logging` module takes its lock before every ``fork`` (Ray
starts its processes with one) and gives it back in a callback after it, which drops the
exceptions raised inside it: a handler that raised there would leave the lock taken for good, and
every other thread that logs would then wait on it. Hooks registered here (after
:mod:`logging`'s, so that they run around its own) hold the signal from before the lock is taken
until after it is given back.
"""

from __future__ import annotations

import logging  # noqa: F401 - imported first: its fork hooks must run inside this module's (see above)
import os
import signal
import threading
from contextlib import contextmanager
from typing import Iterator

_depth = 0
_pending: list[int] = []
_forking = False         # the main thread is inside a fork's hooks (and :func:`_fork_begins` counted it)


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
        _leave()


def _leave() -> None:
    """The end of a held block: at the outermost, the first signal kept is handled."""
    global _depth
    _depth -= 1
    if _depth == 0 and _pending:
        signum = _pending.pop(0)
        _pending.clear()
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, None)


def _fork_begins() -> None:
    global _depth, _forking
    if threading.current_thread() is threading.main_thread():
        _depth += 1
        _forking = True


def _fork_ends() -> None:
    """After the fork, in the parent: a signal held meanwhile is handled (its exception, dropped
    by the caller of this hook, goes to ``sys.unraisablehook``, where the handler's owner raises it
    again in the main thread). A handler that raised before :func:`_fork_begins` counted the fork
    leaves nothing to end."""
    global _forking
    if _forking and threading.current_thread() is threading.main_thread():
        _forking = False
        _leave()


def _forked() -> None:
    """In the child: the parent's blocks and held signals are not its own."""
    global _depth, _forking
    _depth, _forking = 0, False
    _pending.clear()


os.register_at_fork(before=_fork_begins, after_in_parent=_fork_ends, after_in_child=_forked)
