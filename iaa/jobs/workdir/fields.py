"""Records read back from files are checked like a ``--config``: each key holds its kind of value.

A record (``sweep.json``, ``ensemble.json``, a best_config.yaml's ``sweep`` hand-off) may have been
edited or damaged since it was written. Its names become folders and its words and numbers reach
the console, so a key that holds a name that could leave its folder, an accuracy that is NaN or
outside [0, 1], or a value of the wrong type is refused in one line naming the file and the key.
A key that is absent is left to its reader (older records lack some).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

from iaa.errors import IaaError
from iaa.jobs.workdir import names


class RecordError(IaaError):
    """A record file holds a value of the wrong kind under a key."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


# kind -> (what it must be, the test); a trailing "?" in a rule also allows null.
KINDS: dict[str, tuple[str, Any]] = {
    "name": (f"a name ({names.FOLDER_NAME_RULE})",
             lambda v: isinstance(v, str) and bool(names.FOLDER_NAME.fullmatch(v)) and ".." not in v),
    "text": ("a string", lambda v: isinstance(v, str)),
    "accuracy": ("an accuracy: a finite number in [0, 1]", lambda v: _number(v) and 0.0 <= v <= 1.0),
    "number": ("a finite number", _number),
    "share": ("a finite number >= 0", lambda v: _number(v) and v >= 0),
    "factor": ("a finite number above 1", lambda v: _number(v) and v > 1),
    "seconds": ("a finite number of seconds above 0", lambda v: _number(v) and v > 0),
    "temperature": ("a temperature: a finite number above 0", lambda v: _number(v) and v > 0),
    "integer": ("a whole number", lambda v: isinstance(v, int) and not isinstance(v, bool)),
    "count": ("a whole number >= 0", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
    "positive": ("a whole number >= 1", lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1),
    "list": ("a list", lambda v: isinstance(v, list)),
    "mapping": ("a mapping", lambda v: isinstance(v, Mapping)),
    "spans": ("a list of [start, seconds] pairs of finite numbers, seconds >= 0",
              lambda v: isinstance(v, list) and all(isinstance(s, list) and len(s) == 2 and all(map(_number, s))
                                                    and s[1] >= 0 for s in v)),
}


def check(path: Path | str, data: Any, rules: Mapping[str, str], where: str = "") -> None:
    """Raise RecordError naming ``path`` and ``where + key`` for the first key of ``data`` whose
    value is not of its rule's kind (``rules``: key -> a kind of :data:`KINDS`, ``?`` for nullable)."""
    if not isinstance(data, Mapping):
        raise RecordError(f"{path}: {where.rstrip('.') or 'the top level'}: expected a mapping, got "
                          f"{type(data).__name__}; write the file again with the command that made it")
    for key, rule in rules.items():
        if key not in data:
            continue
        kind = rule.rstrip("?")
        what, test = KINDS[kind]
        value = data[key]
        if (value is None and rule.endswith("?")) or test(value):
            continue
        raise RecordError(f"{path}: {where}{key}: expected {what}, got {_shown(value)}; "
                          "write the file again with the command that made it")


def require(path: Path | str, data: Mapping[str, Any], keys: Any, where: str = "", why: str = "") -> None:
    """Raise RecordError naming ``path`` and ``where + key`` for the first of ``keys`` that ``data``
    lacks (or holds as null); ``why`` says what needs it."""
    for key in keys:
        if data.get(key) is None:
            raise RecordError(f"{path}: {where}{key}: missing{why}; write the file again with the command that "
                              "made it")


def _shown(value: Any) -> str:
    """``value`` short, as repr writes it (so a control character is escaped)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({type(value).__name__})"


def split_known(record_type: Any, data: Mapping[str, Any], rest: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``data`` (a record's JSON object) as the keys that are fields of the dataclass
    ``record_type`` and the others, less ``schema``: a newer version's keys, kept in its field
    ``rest`` and written back as read."""
    from dataclasses import fields as dataclass_fields

    known = {f.name for f in dataclass_fields(record_type)} - {rest}
    return ({k: v for k, v in data.items() if k in known},
            {k: v for k, v in data.items() if k not in known and k != "schema"})
