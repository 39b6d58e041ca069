"""Ctrl-C and SIGTERM for a long command: stop at once, leave nothing RUNNING, say how to resume.

A job wraps its long work in :func:`stoppable` and registers what must be marked on a stop
(:func:`on_stop`, or :meth:`Stop.on_stop`: its tracked runs end KILLED, a study's unfinished
trials FAIL). The first
SIGINT or SIGTERM raises :class:`Interrupted` in the main thread; leaving the block runs the
marks, newest first, and raises :class:`Interrupted` again carrying the one line the command
prints (what was kept and the exact command that resumes).

A second signal ends the process within :data:`MARKS_WITHIN_S` (exit status 128 + the signal's
number): the marks run once more in a thread of their own while the handler returns at once, since
the main thread, paused where the signal found it, may hold what they need (a tracking store's
write transaction), and the processes this one started (a local Ray's) end with it
(:func:`end_process`). Plain Python signals and /proc: nothing here knows a cluster or a store.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Callable, Iterator

from iaa import signals

SIGNALS = (signal.SIGINT, signal.SIGTERM)
MARKS_WITHIN_S = 1.5          # after a second signal the process ends by then, marked or not


class Interrupted(KeyboardInterrupt):
    """The command was stopped by ``signal_name``; ``message`` is its one line for the console."""

    def __init__(self, signal_name: str = "SIGINT", message: str = "") -> None:
        super().__init__(message or f"interrupted by {signal_name}")
        self.signal_name, self.message = signal_name, message

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.signal_name, signal.SIGINT))


@dataclass
class Stop:
    """The marks to make when the command is stopped, and the line that says what is kept.

    Args:
        resume: the exact command that continues the work.
        kept: what the stop leaves behind (called once, after the marks).
    """

    resume: str
    kept: Callable[[], str] = lambda: ""
    signal_name: str | None = None       # the signal that stopped the command, once one did
    ending: bool = False                 # a second signal came: the process is ending
    _marks: list[Callable[[str], None]] = field(default_factory=list)

    def on_stop(self, mark: Callable[[str], None]) -> None:
        """``mark(signal_name)`` runs on a stop; a mark must be quick and may run twice."""
        self._marks.append(mark)

    def mark(self, signal_name: str) -> None:
        """Every mark, newest first; one that fails does not keep the others from running."""
        for mark in reversed(self._marks):
            try:
                mark(signal_name)
            except Exception as err:  # noqa: BLE001 - a stop must still mark the rest
                print(f"warning: on {signal_name}: {type(err).__name__}: {err}", file=sys.stderr)

    def line(self, signal_name: str) -> str:
        try:
            kept = self.kept()
        except Exception:  # noqa: BLE001 - the line must be said even when the store fails
            kept = ""
        return f"interrupted by {signal_name}: {kept + '; ' if kept else ''}resume with: {self.resume}"


_ACTIVE: list[Stop] = []      # the stoppable blocks now running, innermost last


def on_stop(mark: Callable[[str], None]) -> None:
    """Register ``mark`` with the innermost :func:`stoppable` block; none running: nothing to do."""
    if _ACTIVE:
        _ACTIVE[-1].on_stop(mark)


def _name(signum: int) -> str:
    return signal.Signals(signum).name


@contextmanager
def stoppable(resume: str, kept: Callable[[], str] = lambda: "") -> Iterator[Stop]:
    """Run the block so that SIGINT and SIGTERM stop it as :class:`Interrupted` (see the module).

    Outside the main thread (where Python cannot handle signals) the block runs as it is.
    """
    stop = Stop(resume, kept)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def first(signum: int, frame: FrameType | None) -> None:
        if signals.holding():               # inside a store write: stop right after it, not halfway
            signals.hold(signum)
            return
        name = stop.signal_name = _name(signum)
        arm(lambda signum, frame: _exit_now(stop, name, signum))    # the next one ends the process
        raise Interrupted(name)

    before = {s: signal.getsignal(s) for s in SIGNALS}
    arm(first)
    _ACTIVE.append(stop)
    try:
        yield stop
    except KeyboardInterrupt as err:
        name = stop.signal_name or getattr(err, "signal_name", "SIGINT")
        if not stop.ending:
            arm(lambda signum, frame: _exit_now(stop, name, signum))
        stop.mark(name)
        while stop.ending:               # the ending thread says the line and ends the process
            time.sleep(0.05)
        raise Interrupted(name, err.message if isinstance(err, Interrupted) and err.message
                          else stop.line(name)) from None
    finally:
        _ACTIVE.remove(stop)
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


def arm(handler: Callable[[int, FrameType | None], None]) -> None:
    """Install ``handler`` for SIGINT and SIGTERM (again after a library replaced them)."""
    for s in SIGNALS:
        signal.signal(s, handler)


def rearm() -> None:
    """Take SIGINT and SIGTERM back for the current :func:`stoppable` block after a library set
    its own handlers (Ray's ``init`` sets one for SIGTERM)."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        signal.signal(signal.SIGTERM, handler)


def _exit_now(stop: Stop, first: str, signum: int) -> None:
    """A second signal: the marks run again, the line is said and the process ends, all in a
    thread, within :data:`MARKS_WITHIN_S`; the handler returns at once, so that the main thread
    can let go of what the marks may need. A third signal ends the process at once."""
    stop.ending = True
    arm(lambda signum, frame: end_process(128 + signum))
    threading.Thread(target=_mark_and_end, args=(stop, first, 128 + signum), name="iaa-stop", daemon=True).start()


def _mark_and_end(stop: Stop, first: str, code: int) -> None:
    marking = threading.Thread(target=stop.mark, args=(first,), name="iaa-marks", daemon=True)
    marking.start()
    marking.join(MARKS_WITHIN_S)
    if marking.is_alive():
        print(f"warning: on {first}: the marks did not finish within {MARKS_WITHIN_S:g} s", file=sys.stderr)
    say(stop.line(first))
    end_process(code)


_SAID = threading.Lock()


def say(line: str) -> None:
    """Print the stop's line on stderr once per process, whichever path gets there first."""
    if _SAID.acquire(blocking=False):
        print(line, file=sys.stderr, flush=True)


def end_process(code: int) -> None:
    """End this process now with exit status ``code``, and every process it started with it (a
    local Ray's raylet, workers and agents, which would outlive it for seconds or for good)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for pid in descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    os._exit(code)


def descendants(root: int) -> list[int]:
    """Every process below ``root``, from /proc (none where there is no /proc)."""
    parent: dict[int, int] = {}
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                parent[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            pass
    found, todo = [], [root]
    while todo:
        here = todo.pop()
        kids = [pid for pid, ppid in parent.items() if ppid == here]
        found += kids
        todo += kids
    return found
