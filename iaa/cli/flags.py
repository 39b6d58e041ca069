"""The command line's spelling of the options that the jobs name by their Python names.

A job never spells a flag: its messages and next steps name an option as ``` `run_dir` ``` (the
click parameter's name), since a library caller passes ``run_dir=``. :func:`render` turns each such
name into the flag of the command it belongs to: the command that follows ``iaa-cli NAME`` on the
same line, else the running command, else the first command that has it.
"""

from __future__ import annotations

import functools
import re

import click

MARKED = re.compile(r"iaa-cli ([a-z][a-z-]*)|(?<!`)`([a-z][a-z0-9_]*)`(?!`)")
Spellings = dict[str, dict[str, str]]        # command -> Python name -> flag


@functools.cache
def spellings(cli: click.Group) -> Spellings:
    """Each command's options, and the group's under ``""``: Python name -> its first long flag (the
    name its help shows; ``--workers`` is a kept alias of three). An on/off flag's off side is
    ``no_NAME`` (``` `no_calibrate` ``` -> ``--no-calibrate``)."""

    def of(params: list[click.Parameter]) -> dict[str, str]:
        found = {}
        for param in params:
            if not isinstance(param, click.Option) or not param.name:
                continue
            for name, opts in ((param.name, param.opts), (f"no_{param.name}", param.secondary_opts)):
                flags = [o for o in opts if o.startswith("--")]
                if flags:
                    found[name] = flags[0]
        return found

    return {"": of(cli.params), **{name: of(command.params) for name, command in cli.commands.items()}}


def flag(name: str, command: str | None, known: Spellings) -> str | None:
    """``name``'s flag in ``command``, else in the group, else in the first command that has it."""
    for where in (command, ""):
        if where is not None and name in known.get(where, {}):
            return known[where][name]
    return next((options[name] for options in known.values() if name in options), None)


def render(text: str, cli: click.Group | None = None) -> str:
    """``text`` with every ``` `name` ``` of an option of ``cli`` (the running command line's
    group) spelled as its flag; others, and all of it outside a command line, left alone."""
    ctx = click.get_current_context(silent=True)
    root = cli or (ctx.find_root().command if ctx is not None else None)
    if "`" not in text or not isinstance(root, click.Group):
        return text
    known = spellings(root)
    command = ctx.info_name if ctx is not None and ctx.parent is not None else None
    return "\n".join(_line(line, command, known) for line in text.split("\n"))


def _line(line: str, command: str | None, known: Spellings) -> str:
    def spell(match: re.Match[str]) -> str:
        nonlocal command
        if match.group(1) is not None:
            command = match.group(1) if match.group(1) in known else command
            return match.group(0)
        return flag(match.group(2), command, known) or match.group(0)

    return MARKED.sub(spell, line)
