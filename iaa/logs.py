"""How ``iaa`` speaks to a person: through the standard :mod:`logging` module, never ``print``.

The jobs and the platform log under loggers named after their modules (``iaa.jobs.tune.tune``,
``iaa.platform.sweeps.launch``...): progress and events at INFO, warnings at WARNING. An event
that a program may want to read carries its fields in ``extra={"event": NAME, ...}``.

As a library, ``iaa`` installs no handler: the application chooses (``logging.getLogger("iaa")``
silences, redirects or filters it all). The command line installs :func:`to_console` once per
command; a Ray worker process running a trial, a training worker or a served replica installs it
too (:func:`in_worker`), since it inherits nothing from the driver's logging and Ray forwards its
stderr to the driver's console.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import deque
from typing import Any, Callable

from iaa.errors import printable

ROOT = "iaa"
_ROOT_LOGGER = logging.getLogger(ROOT)
KEPT_WARNINGS = 1000
LOG_PROGRESS_S = 30.0   # a progress bar's interval when stderr is a file or a pipe (a terminal: 0.1 s)
_STANDARD = frozenset(vars(logging.makeLogRecord({})))    # a record's own attributes, not an event's fields


class _Console(logging.Formatter):
    """One line per record: INFO as it is, WARNING as ``warning: ...``, its control characters
    escaped and its options spelled by ``render``."""

    def __init__(self, render: Callable[[str], str]) -> None:
        super().__init__()
        self.render = render

    def format(self, record: logging.LogRecord) -> str:
        text = printable(self.render(record.getMessage()), keep_lines=True)
        if record.levelno >= logging.ERROR:
            return f"Error: {text}"
        return f"warning: {text}" if record.levelno >= logging.WARNING else text


class _JsonLines(_Console):
    """One JSON object per record: level, logger, message and the event's fields."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}
        return json.dumps({"level": record.levelname.lower(), "logger": record.name,
                           "message": self.render(record.getMessage()), **fields}, default=str)


class _Stderr(logging.Handler):
    """Writes to whatever ``sys.stderr`` is when a record arrives (a test runner swaps it), flushed;
    keeps the last :data:`KEPT_WARNINGS` warnings it wrote (:func:`warned`)."""

    def __init__(self) -> None:
        super().__init__()
        self.warned: deque[str] = deque(maxlen=KEPT_WARNINGS)    # a server logs for days

    def emit(self, record: logging.LogRecord) -> None:
        try:
            if record.levelno >= logging.WARNING and isinstance(self.formatter, _Console):
                self.warned.append(printable(self.formatter.render(record.getMessage())))
            from tqdm import tqdm

            stream = sys.stderr
            tqdm.write(self.format(record), file=stream)     # below a progress bar on the line, not after it
            stream.flush()
        except Exception:  # noqa: BLE001 - logging's own contract: a handler never raises
            self.handleError(record)


def to_console(*, json_lines: bool = False, quiet: bool = False,
               render: Callable[[str], str] = str) -> logging.Handler:
    """Send ``iaa``'s lines to stderr, replacing a handler that this function installed before.

    Args:
        json_lines: one JSON object per line instead of text.
        quiet: warnings only, no progress.
        render: what each message goes through first (the command line spells its options).
    """
    logger = _ROOT_LOGGER
    for old in [h for h in logger.handlers if isinstance(h, _Stderr)]:
        logger.removeHandler(old)
    handler = _Stderr()
    handler.setFormatter(_JsonLines(render) if json_lines else _Console(render))
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING if quiet else logging.INFO)
    logger.propagate = False          # the one voice: not once more through the root logger's handlers
    return handler


def in_worker() -> None:
    """In a Ray worker process: the console handler, unless the process already has one."""
    if not on_console():
        to_console()


def on_console() -> bool:
    """Whether :func:`to_console` has installed its handler in this process."""
    return any(isinstance(h, _Stderr) for h in _ROOT_LOGGER.handlers)


def progress(desc: str, unit: str, *, total: int | None = None, shown: bool = True, **options: Any) -> Any:
    """A tqdm progress bar on stderr (``shown`` False: none), as every bar of ``iaa`` draws it:
    ten times a second on a terminal; in a log file or a pipe at its start, every
    :data:`LOG_PROGRESS_S` and its end, its last state left on a line of its own (``leave``
    applies on a terminal only), so that the next line of the log starts a line."""
    from tqdm import tqdm

    terminal = sys.stderr.isatty()
    leave = options.pop("leave", True) or not terminal
    return tqdm(total=total, desc=desc, unit=unit, disable=not shown, file=sys.stderr, leave=leave,
                mininterval=0.1 if terminal else LOG_PROGRESS_S, **options)


def warned() -> tuple[str, ...]:
    """The warnings that the console handler (:func:`to_console`) has written since it was
    installed (the last :data:`KEPT_WARNINGS`), each as its message (a command's ``--json``
    object lists them)."""
    return next((tuple(h.warned) for h in _ROOT_LOGGER.handlers if isinstance(h, _Stderr)), ())


def rendered(text: str) -> str:
    """``text`` as the console handler would show it (for a line written around the logging module).

    Takes no lock (not the one :func:`logging.getLogger` takes): it runs after a signal, which may
    have cut a thread short with that lock held."""
    formats = [h.formatter for h in _ROOT_LOGGER.handlers if isinstance(h, _Stderr)]
    return formats[0].render(text) if formats and isinstance(formats[0], _Console) else text


def say(text: str, *, level: int = logging.INFO, event: str | None = None) -> bool:
    """Write ``text`` through the console handler whatever its level (``--quiet`` keeps it): a
    command's closing summary or its error, as one JSON object with ``--log-format json`` (with
    ``event``), else as text; False where :func:`to_console` installed no handler."""
    handlers = [h for h in _ROOT_LOGGER.handlers if isinstance(h, _Stderr)]
    if not handlers:
        return False
    record = _ROOT_LOGGER.makeRecord(ROOT, level, "", 0, text, None, None,
                                     extra={"event": event} if event else None)
    handlers[0].handle(record)
    return True


def json_lines() -> bool:
    """Whether the console handler writes JSON objects (``--log-format json``)."""
    return any(isinstance(h, _Stderr) and isinstance(h.formatter, _JsonLines) for h in _ROOT_LOGGER.handlers)


def event(logger: logging.Logger, name: str, message: str, **fields: Any) -> None:
    """Log ``message`` at INFO as the event ``name`` with ``fields`` (read by the JSON lines)."""
    logger.info(message, extra={"event": name, **fields})
