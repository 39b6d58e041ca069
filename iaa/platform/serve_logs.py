"""Ray Serve's own lines on starting and stopping go to Ray's log folder, not the terminal.

In the driver, Serve logs each step at INFO on the ``ray.serve`` logger, which writes to stderr
(``Started Serve``, ``Connecting to existing Serve app ... will not be applied``, which every
``serve.run`` after ``serve.start`` logs, ``Application ... is ready``, ``Deleting app``).
:func:`driver_lines_to_log` sends them to ``serve_driver.log`` in the session's log folder
(``/tmp/ray/session_*/logs``) while it is open; warnings and errors still reach the terminal.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

SERVE_LOGGER = "ray.serve"
LOG_FILE = "serve_driver.log"


class _BelowWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno < logging.WARNING


class _AtLeastWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING


def _file_handler() -> logging.Handler:
    """A handler appending to ``serve_driver.log`` in the session's log folder (nowhere without one)."""
    from iaa.platform.cluster.ray_internals import logs_dir

    folder = logs_dir()
    if folder is None or not folder.is_dir():
        return logging.NullHandler()
    handler = logging.FileHandler(folder / LOG_FILE, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(name)s -- %(message)s"))
    return handler


@contextlib.contextmanager
def driver_lines_to_log() -> Iterator[None]:
    """While open, the ``ray.serve`` logger's lines below WARNING go to Serve's driver log file
    only; its terminal handlers keep WARNING and above. The handlers are restored on exit."""
    logger = logging.getLogger(SERVE_LOGGER)
    to_file, to_terminal = _file_handler(), _AtLeastWarning()
    to_file.addFilter(_BelowWarning())
    terminals = list(logger.handlers)
    for handler in terminals:
        handler.addFilter(to_terminal)
    logger.addHandler(to_file)
    try:
        yield
    finally:
        logger.removeHandler(to_file)
        to_file.close()
        for handler in terminals:
            handler.removeFilter(to_terminal)
