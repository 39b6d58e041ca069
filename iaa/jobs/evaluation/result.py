"""What a use case hands back: one frozen result, never a dict to index by string.

A result holds its figures as typed fields, the files it wrote, its stop reason where it has one,
its warnings and its next steps (:class:`~iaa.jobs.evaluation.closing.Command` records). The command
line renders it (``iaa/cli/output.py``): :meth:`Result.fields` is the object ``--json`` prints.
Programs parse that object, so a later version of a command may add keys to it, never remove or
rename one.

A use case subclasses :class:`Result` with its own fields, in the order the JSON object lists them.
Three kinds of field shape that object (:func:`spread`, :func:`absent_when_none`, :func:`hidden`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from iaa.jobs.evaluation.closing import Command

_SPREAD = "spread"          # a mapping whose items are keys of the JSON object
_ABSENT = "absent_when_none"
_HIDDEN = "hidden"


def spread() -> Any:
    """A field holding a mapping of figures whose names are open-ended (a training run's metrics of
    its last check, one key per metric): its items are keys of the JSON object, not one nested key."""
    return field(default_factory=dict, metadata={_SPREAD: True})


def absent_when_none() -> Any:
    """A field that only some runs have (an ACT reader's halting steps): no key when it is None."""
    return field(default=None, metadata={_ABSENT: True})


def hidden(default: Any = None) -> Any:
    """A field the caller reads but the JSON object leaves out (the next commands)."""
    return field(default=default, metadata={_HIDDEN: True})


@dataclass(frozen=True, kw_only=True)
class Result:
    """The shape every use case's result shares.

    Attributes:
        warnings: what the caller should know (the command line shows each one on stderr).
        next: the commands to run next, each runnable as the command line spells it; they are the
            closing summary's, and no key of the JSON object.
    """

    warnings: tuple[str, ...] = ()
    next: tuple[Command, ...] = hidden(())

    def fields(self) -> dict[str, Any]:
        """The result as the command's JSON object: its fields in order, paths as strings, tuples
        as lists, a spread mapping's items as keys of their own."""
        found: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get(_HIDDEN) or (f.metadata.get(_ABSENT) and value is None):
                continue
            if f.metadata.get(_SPREAD):
                found.update({key: plain(v) for key, v in value.items() if key not in found})
            else:
                found[f.name] = plain(value)
        return found


class Keyed:
    """A result that may also be indexed by the keys of its JSON object: ``result["html"]`` is
    ``result.fields()["html"]``. New code reads the attributes."""

    def __getitem__(self, key: str) -> Any:
        return self.fields()[key]  # type: ignore[attr-defined]


def plain(value: Any) -> Any:
    """``value`` as JSON holds it: a path as a string, a tuple as a list, a mapping as a dict,
    a nested result as its fields, another dataclass (a record) as a dict of its fields; a
    :class:`Command` stays as it is (the command line spells it)."""
    if isinstance(value, Command):
        return value
    if isinstance(value, Result):
        return value.fields()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {key: plain(v) for key, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value
