"""Ctrl-C and SIGTERM for a long command: stop at once, leave nothing RUNNING, say how to resume.

A job wraps its long work in :func:`stoppable` and registers what must be marked on a stop
(:func:`on_stop`, or :meth:`Stop.on_stop`: its tracked runs end KILLED, a study's unfinished
trials FAIL). The first
SIGINT or SIGTERM raises :class:`Interrupted` in the main thread; leaving the block runs the
marks, newest first, and raises :class:`Interrupted` again carrying the one line the command
prints (what was kept and the exact command that resumes).

A second signal ends the process within :data:`MARKS_WITHIN_S` (exit status 128 + the signal's
number) wherever the main thread is: a thread of this module counts the signals as they arrive
(:class:`_Watch`), so neither a main thread waiting in C (on a store another process has locked)
nor a callback that drops exceptions (a garbage collection's) can delay it. The marks run once more
in a thread of their own, since the main thread may hold what they need (a tracking store's write
transaction); what they cannot mark by then, the next command that opens the work folder marks, and
the line says so. The processes this one started (a local Ray's) end with it (:func:`end_process`).
A first signal's exception dropped by such a callback is raised again (:func:`_unraisable`).
Plain Python signals and psutil: nothing here knows a cluster or a store.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any, Callable, Iterator

import psutil

from iaa import logs, signals

if TYPE_CHECKING:
    from iaa.jobs.evaluation.closing import Command

_log = logging.getLogger(__name__)

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
        resume: the exact command that continues the work (a job's :class:`Command`; plain text is
            said as it is).
        kept: what the stop leaves behind (called once, after the marks).
        restart: where the work left nothing to continue from (``resumable`` says so), the exact
            command that starts it again; the line gives it instead of ``resume``.
        resumable: whether ``resume`` has something to continue from now (a run's checkpoint).
    """

    resume: Command | str
    kept: Callable[[], str] = lambda: ""
    restart: Command | str | None = None
    resumable: Callable[[], bool] = lambda: True
    signal_name: str | None = None       # the signal that stopped the command, once one did
    ending: bool = False                 # a second signal came: the process is ending
    caught: bool = False                 # the stop's exception reached the block's end: marking
    handler: Callable[[int, FrameType | None], None] | None = None   # the block's signal handler
    wakeup_fd: int = -1                  # the pipe that counts the signals (:class:`_Watch`)
    redelivered: int = 0                 # signals raised again by this process, not sent
    _marks: list[Callable[[str], None]] = field(default_factory=list)

    def on_stop(self, mark: Callable[[str], None], kept: Callable[[], str] | None = None) -> None:
        """``mark(signal_name)`` runs on a stop; a mark must be quick and may run twice. ``kept``,
        when given, says from now on what the stop leaves behind."""
        self._marks.append(mark)
        if kept is not None:
            self.kept = kept

    def resumes_when(self, resumable: Callable[[], bool], restart: Command | str) -> None:
        """From now on, ``resume`` is said only where ``resumable()``; else ``restart``, with the
        words that nothing was kept to continue from."""
        self.resumable, self.restart = resumable, restart

    def mark(self, signal_name: str) -> None:
        """Every mark, newest first; one that fails does not keep the others from running."""
        for mark in reversed(self._marks):
            try:
                mark(signal_name)
            except Exception as err:  # noqa: BLE001 - a stop must still mark the rest
                _log.warning(f"on {signal_name}: {type(err).__name__}: {err}")

    def line(self, signal_name: str, marked: bool = True) -> str:
        """The one line; ``marked=False``: the marks did not finish (another process holds the
        store), and the next command that opens the work folder marks what they left RUNNING."""
        try:
            again = self.restart is not None and not self.resumable()
        except Exception:  # noqa: BLE001 - as below: the line is said; resume is what it says then
            again = False
        next_line = f"run it again with: {self.restart}" if again else f"resume with: {self.resume}"
        if not marked:
            return (f"interrupted by {signal_name}: ended before its runs and trials were marked (the next "
                    f"command in this work folder marks them KILLED and FAIL); {next_line}")
        if again:
            return f"interrupted by {signal_name}: it stopped before its first checkpoint, so there is nothing to resume; {next_line}"
        try:
            kept = self.kept()
        except Exception:  # noqa: BLE001 - the line must be said even when the store fails
            kept = ""
        return f"interrupted by {signal_name}: {kept + '; ' if kept else ''}{next_line}"


_ACTIVE: list[Stop] = []      # the stoppable blocks now running, innermost last


def on_stop(mark: Callable[[str], None]) -> None:
    """Register ``mark`` with the innermost :func:`stoppable` block; none running: nothing to do."""
    if _ACTIVE:
        _ACTIVE[-1].on_stop(mark)


def _name(signum: int) -> str:
    return signal.Signals(signum).name


def resumes_when(resumable: Callable[[], bool], restart: Command | str) -> None:
    """:meth:`Stop.resumes_when` of the innermost running :func:`stoppable` block (none: nothing)."""
    if _ACTIVE:
        _ACTIVE[-1].resumes_when(resumable, restart)


@contextmanager
def stoppable(resume: Command | str, kept: Callable[[], str] = lambda: "", *, restart: Command | str | None = None,
              resumable: Callable[[], bool] = lambda: True) -> Iterator[Stop]:
    """Run the block so that SIGINT and SIGTERM stop it as :class:`Interrupted` (see the module).
    ``restart`` and ``resumable``: as :class:`Stop`'s.

    Outside the main thread (where Python cannot handle signals) the block runs as it is.
    """
    stop = Stop(resume, kept, restart, resumable)
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def first(signum: int, frame: FrameType | None) -> None:
        if stop.caught or stop.ending:      # a second signal is the watch's: it ends the process
            return
        name = stop.signal_name = stop.signal_name or _name(signum)
        if signals.holding():               # inside a store write: stop right after it, not halfway
            signals.hold(signum)
            return
        raise Interrupted(name)

    before = {s: signal.getsignal(s) for s in SIGNALS}
    stop.handler = first
    arm(first)
    watch = _Watch(stop)
    _ACTIVE.append(stop)
    hook = sys.unraisablehook
    sys.unraisablehook = _unraisable(hook)
    try:
        yield stop
    except (KeyboardInterrupt, SystemExit) as err:
        if isinstance(err, SystemExit) and err.code != signal.SIGTERM:
            raise                            # a plain exit, not a library's SIGTERM handler (Ray's)
        stop.caught = True
        name = stop.signal_name or getattr(err, "signal_name", "SIGTERM" if isinstance(err, SystemExit) else "SIGINT")
        stop.mark(name)
        watch.drain()                    # a second signal sent by now is counted
        while stop.ending:               # the ending thread says the line and ends the process
            time.sleep(0.05)
        raise Interrupted(name, err.message if isinstance(err, Interrupted) and err.message
                          else stop.line(name)) from None
    finally:
        _ACTIVE.remove(stop)
        sys.unraisablehook = hook
        watch.close()
        for s, handler in before.items():
            signal.signal(s, handler if handler is not None else signal.SIG_DFL)


_DRAIN = 255          # not a signal's number: :meth:`_Watch.drain`'s mark in the pipe


class _Watch:
    """Counts SIGINT and SIGTERM as they arrive, in a thread of its own, and ends the process on
    the second (:func:`_end`).

    Python runs a signal's handler in the main thread, and only between two bytecodes of it: not
    while it waits in C (SQLite's busy wait on a store another process has locked), and from a
    garbage-collection callback whose exceptions are printed and dropped. The signal's number is
    written to a pipe at once, whatever the main thread does (``signal.set_wakeup_fd``)."""

    def __init__(self, stop: Stop) -> None:
        self.stop = stop
        self.drained = threading.Event()
        self.read, self.write = os.pipe()
        os.set_blocking(self.write, False)
        self.previous = signal.set_wakeup_fd(self.write, warn_on_full_buffer=False)
        stop.wakeup_fd = self.write
        self.thread = threading.Thread(target=self._count, name="iaa-signals", daemon=True)
        self.thread.start()

    def _count(self) -> None:
        seen = 0
        while True:
            try:
                data = os.read(self.read, 64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum == 0:                   # :meth:`close`
                    return
                if signum == _DRAIN:
                    self.drained.set()
                    continue
                if signum not in SIGNALS:
                    continue
                if self.stop.redelivered > 0:     # an exception raised again (:func:`_unraisable`)
                    self.stop.redelivered -= 1
                    continue
                seen += 1
                if seen >= 2:
                    _end(self.stop, signum)

    def drain(self) -> None:
        """Wait until the signals that arrived so far are counted (the pipe keeps their order)."""
        try:
            os.write(self.write, bytes([_DRAIN]))
        except OSError:
            return
        self.drained.wait(1.0)

    @staticmethod
    def forget_in_child() -> None:
        """In a child forked by this process (before it starts another program, or for good): the
        signals it receives are not this process's to count, so it writes none to the pipe."""
        if _ACTIVE:
            try:
                signal.set_wakeup_fd(-1)
            except ValueError:               # not the child's main thread
                pass

    def close(self) -> None:
        signal.set_wakeup_fd(self.previous, warn_on_full_buffer=False)
        try:
            os.write(self.write, b"\0")
        except OSError:
            pass
        self.thread.join(1.0)
        for fd in (self.read, self.write):
            os.close(fd)


os.register_at_fork(after_in_child=_Watch.forget_in_child)


def _unraisable(previous: Callable[..., None]) -> Callable[..., None]:
    """A hook for exceptions that a callback could not pass on (a weakref's, a ``__del__``): a
    signal's (:class:`Interrupted`, or the ``SystemExit`` of a library's SIGTERM handler) is raised
    again in the main thread, where it propagates, and not printed."""
    def hook(unraisable: Any) -> None:
        stop = _ACTIVE[-1] if _ACTIVE else None
        if stop is None or stop.caught or stop.ending or \
                not isinstance(unraisable.exc_value, (KeyboardInterrupt, SystemExit)):
            previous(unraisable)
            return
        name = stop.signal_name or ("SIGTERM" if isinstance(unraisable.exc_value, SystemExit) else "SIGINT")
        stop.signal_name = name
        if stop.handler is not None:
            arm(stop.handler)
        stop.redelivered += 1
        # from another thread, a moment later: called here, the handler would raise inside this hook;
        # a real signal to the main thread, so that a call it blocks in (a sleep, a wait) ends at once
        threading.Timer(0.01, signal.pthread_kill, args=(threading.main_thread().ident, getattr(signal, name))).start()
    return hook


def arm(handler: Callable[[int, FrameType | None], None]) -> None:
    """Install ``handler`` for SIGINT and SIGTERM (again after a library replaced them)."""
    for s in SIGNALS:
        signal.signal(s, handler)


def rearm() -> None:
    """Take SIGINT and SIGTERM back for the current :func:`stoppable` block after a library set
    its own handlers (Ray's ``init`` sets one for SIGTERM), and the pipe that counts them."""
    if _ACTIVE and _ACTIVE[-1].handler is not None:
        arm(_ACTIVE[-1].handler)
        if _ACTIVE[-1].wakeup_fd >= 0:
            signal.set_wakeup_fd(_ACTIVE[-1].wakeup_fd, warn_on_full_buffer=False)
        return
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        signal.signal(signal.SIGTERM, handler)


_ENDING = threading.Lock()


def _end(stop: Stop, signum: int) -> None:
    """A second signal: the marks run again, the line is said and the process ends, all in a
    thread, within :data:`MARKS_WITHIN_S`, wherever the main thread is. A third signal ends the
    process at once."""
    with _ENDING:
        if stop.ending:
            say(stop.line(stop.signal_name or _name(signum), marked=False))   # unless the line is out
            end_process(128 + signum)
        stop.ending = True
    name = stop.signal_name or _name(signum)
    threading.Thread(target=_mark_and_end, args=(stop, name, 128 + signum), name="iaa-stop", daemon=True).start()


def _mark_and_end(stop: Stop, first: str, code: int) -> None:
    lines: list[str] = []

    def mark() -> None:
        stop.mark(first)
        lines.append(stop.line(first))

    marking = threading.Thread(target=mark, name="iaa-marks", daemon=True)
    marking.start()
    marking.join(MARKS_WITHIN_S)
    say(lines[0] if lines else stop.line(first, marked=False))
    end_process(code)


_SAID = threading.Lock()


def say(line: str) -> None:
    """Write the stop's line to stderr once per process, whichever path gets there first.

    Straight to the file descriptor: this runs while a signal may have cut the main thread short
    inside a logging handler or a stream's buffer, whose locks it would wait on.
    """
    if _SAID.acquire(blocking=False):
        os.write(2, (logs.rendered(line) + "\n").encode("utf-8", "backslashreplace"))


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
    """Every process below ``root`` (none once ``root`` is gone)."""
    try:
        return [child.pid for child in psutil.Process(root).children(recursive=True)]
    except psutil.Error:
        return []
