"""What a command prints: its result (key: value lines, or JSON with ``--json``), its warnings,
and an expected failure as one line (a bug keeps its traceback)."""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import click

from iaa import logs
from iaa.cli.flags import render
from iaa.jobs.evaluation.closing import Command
from iaa.jobs.evaluation.result import Result
from iaa.errors import printable

_log = logging.getLogger(__name__)


def shown(text: object, keep_lines: bool = False) -> str:
    """A job's text as the console shows it: its options spelled as flags, control characters escaped."""
    return printable(render(str(text)), keep_lines=keep_lines)


def _spelled(value: Any) -> Any:
    """``value`` (a result, with nested lists and dicts) with every string's options spelled as flags."""
    if isinstance(value, (str, Command)):
        return render(str(value))
    if isinstance(value, dict):
        return {key: _spelled(v) for key, v in value.items()}
    return [_spelled(v) for v in value] if isinstance(value, (list, tuple)) else value


def emit(result: Result | dict[str, Any], as_json: bool, keys: tuple[str, ...] | None = None,
          err: bool = False) -> None:
    """Print a result (a job's :class:`Result`, or a plain dict): a JSON object (its
    :meth:`~Result.fields`) as the last stdout line with ``--json``, else key: value lines, floats
    to 6 significant digits (only ``keys``, where the command's own summary on stderr has already
    shown the rest). Its ``warnings`` go to stderr first; the JSON object's list those the command
    logged too. ``err``: all of it to stderr (stdout carries the output)."""
    show_warnings(result)
    fields = _spelled(result.fields() if isinstance(result, Result) else result)
    if as_json:
        if "warnings" in fields:          # and those the command logged on its way
            fields["warnings"] = list(dict.fromkeys([*logs.warned(), *fields["warnings"]]))
        click.echo(json.dumps(fields, default=str), err=err)
    else:
        for key, value in fields.items():
            if (keys is None or key in keys) and key != "warnings":   # those went to stderr
                click.echo(f"{printable(key)}: {value_text(value)}", err=err)


def value_text(value: Any) -> str:
    """A result's value on a ``key: value`` line: floats to 6 significant digits, true/false/null
    and lists and mappings as in JSON (as ``--json`` gives them), anything else as it reads."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if value is None or isinstance(value, (bool, dict, list, tuple)):
        return printable(json.dumps(value, default=str))
    return printable(value)


# What a training command prints on stdout without --json, after its summary on stderr (--json: every key).
CLOSING_KEYS = ("checkpoint", "best_valid_acc", "model_uri", "run_dir", "mlflow_run_id")


def print_summary(describe: Callable[..., str], *args: Any) -> None:
    """The command's closing summary (``describe(*args)``) on stderr, with or without ``--json``
    (which changes stdout only), as ``tune`` and ``ensemble`` log theirs: with ``--log-format
    json``, one JSON object (event ``summary``)."""
    text = describe(*args)
    if not (logs.json_lines() and logs.say(text, event="summary")):
        click.echo(shown(text, keep_lines=True), err=True)


def show_warnings(result: Result | dict[str, Any]) -> None:
    """A result's warnings, through the console's handler: ``warning: ...`` lines, or JSON objects
    with ``--log-format json``, as the jobs' own warnings (as lines where no handler is installed:
    a command run outside the ``iaa-cli`` group)."""
    for warning in result.warnings if isinstance(result, Result) else result.get("warnings", ()):
        if logs.on_console():
            _log.warning(str(warning))
        else:
            click.echo(f"warning: {shown(warning)}", err=True)


def progress_shown() -> bool:
    """Progress bars and lines on stderr: on unless ``iaa-cli --quiet`` (``--json`` keeps them: it
    changes stdout only)."""
    ctx = click.get_current_context(silent=True)
    root = ctx.find_root() if ctx is not None else None
    return not (root is not None and root.params.get("quiet"))


@contextmanager
def progress_bar(desc: str, unit: str = "q") -> Iterator[Callable[[int], Any]]:
    """A tqdm bar on stderr (off with ``--quiet``); yields its ``update``. The bar opens at the
    first update, so a command refused before any work shows its one error line alone."""
    bars: list[Any] = []

    def update(n: int) -> Any:
        if not bars:
            bars.append(logs.progress(desc, unit, shown=progress_shown(), leave=False))
        return bars[0].update(n)

    try:
        yield update
    finally:
        for bar in bars:
            bar.close()


def _debug(ctx: click.Context | None) -> bool:
    root = ctx.find_root() if ctx is not None else None
    flag = bool(root.params.get("debug")) if root is not None and root.params else False
    return flag or os.environ.get("IAA_DEBUG", "") not in ("", "0")


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Show an expected failure (an ``IaaError``: bad data, bad setting, damaged file; or a full or
    read-only disk met anywhere) as one line, its control characters escaped (:func:`printable`:
    the message may quote a file). With ``--json`` (the command's ``as_json``), stdout's last line
    is then ``{"error": LINE, "exit_code": 1}``, and a stop's ``{"error": LINE, "interrupted":
    SIGNAL, "exit_code": 130}``: a script reads every outcome from the same line.

    Anything else is a bug and keeps its traceback; ``--debug`` or ``IAA_DEBUG=1`` keeps it for all.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import errno

        from iaa.errors import IaaError
        from iaa.files import unwritable_message

        as_json = bool(kwargs.get("as_json"))
        try:
            return fn(*args, **kwargs)
        except KeyboardInterrupt as err:
            _interrupted(err, as_json)
        except IaaError as err:
            if _debug(click.get_current_context(silent=True)):
                raise
            raise expected_failure(shown(err), as_json) from err
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) or _debug(click.get_current_context(silent=True)):
                raise
            if err.filename is None and err.errno != errno.EROFS:
                # no file: no free space to tell (the working folder's is another disk's)
                raise expected_failure(
                    f"no space left on device ({err.strerror or err}); the write named no file: free some space "
                    "on the disks this command writes (its outputs, the work folder) and run it again",
                    as_json) from err
            raise expected_failure(shown(unwritable_message(err, err.filename or "the output")), as_json) from err

    return wrapper


def expected_failure(line: str, as_json: bool) -> click.ClickException:
    """The one ``Error:`` line of an expected failure (exit status 1), said first on stdout as a
    JSON object with ``--json``; with ``--log-format json`` the line is a JSON object too (level
    ``error``, event ``failed``)."""
    failure: click.ClickException = click.ClickException(line)
    if as_json:
        click.echo(json.dumps({"error": line, "exit_code": failure.exit_code}))
    if logs.json_lines() and logs.say(line, level=logging.ERROR, event="failed"):
        failure = _Said(line)
    return failure


class _Said(click.ClickException):
    """An expected failure whose line the console handler has already written."""

    def show(self, file: Any = None) -> None:
        pass


def _interrupted(err: KeyboardInterrupt, as_json: bool = False) -> None:
    """SIGINT or SIGTERM: the job's one line (what is kept, how to resume), no traceback; exit
    status 128 + the signal's number (130 for Ctrl-C); with ``as_json`` also a JSON object on stdout."""
    from iaa.jobs import interrupt

    if EXIT_AT_ONCE:                     # another signal from here on ends the process, with the line
        interrupt.arm(lambda signum, frame: (interrupt.say(_stop_line(err)), interrupt.end_process(128 + signum)))
    line = _stop_line(err)
    code = err.exit_code if isinstance(err, interrupt.Interrupted) else 128 + signal.SIGINT
    if as_json:
        name = err.signal_name if isinstance(err, interrupt.Interrupted) else "SIGINT"
        click.echo(json.dumps({"error": line, "interrupted": name, "exit_code": code}))
        sys.stdout.flush()
    if EXIT_AT_ONCE:
        # everything is marked: a local Ray's orderly shutdown would take seconds more, so the
        # processes this one started end with it (interrupt.end_process)
        interrupt.say(line)
        interrupt.end_process(code)
    click.echo(line, err=True)
    raise SystemExit(code)


def _stop_line(err: KeyboardInterrupt) -> str:
    """The stop's one line: the job's (what is kept, how to resume), else ``interrupted by SIGINT``."""
    from iaa.jobs import interrupt

    return shown(err.message or str(err) if isinstance(err, interrupt.Interrupted) else str(interrupt.Interrupted()))


EXIT_AT_ONCE = False     # set by main(): the process is the command's own, not a test runner's
