"""Names are names: a user-given name never becomes a path that leaves its folder.

Sweep and ensemble names (``--name``, ``--resume NAME``, ``--sweep NAME``) become folder names
under the work folder (``WORKDIR/sweeps/NAME``, ``WORKDIR/ensembles/NAME``) and under Ray's
storage, so they are one path component: letters, digits, ``.``, ``_`` and ``-``, starting with
a letter or digit. Registered model names (``--register NAME``) follow MLflow's own rules
(its model-name validation): not blank, no ``/`` or ``:``, and a name
that a path normalisation would not change (no ``..``, ``//``, leading ``/`` or ``./``).
Both are checked before any work.
"""

from __future__ import annotations

import posixpath
import re

from iaa.errors import IaaError

FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
FOLDER_NAME_RULE = ("one folder name: letters, digits, '.', '_' and '-', starting with a letter or digit, "
                    "at most 128 characters, no '..'")
REGISTERED_NAME_RULE = ("MLflow's rules for a registered model: not blank, no '/' or ':', no '..', no leading "
                        "or trailing spaces, and no control characters")


class BadNameError(IaaError):
    """A user-given name that could leave its folder or that MLflow would refuse."""


def folder_name(name: str | None, flag: str = "`name`") -> str | None:
    """``name`` (None passes) when it is a safe folder name; else BadNameError saying what is allowed."""
    if name is None:
        return None
    if not FOLDER_NAME.fullmatch(name) or ".." in name:
        raise BadNameError(f"{flag} {name!r} is not a valid name: use {FOLDER_NAME_RULE}")
    return name


def component(name: str, what: str) -> str:
    """``name`` when it is one path component (a run or dataset folder made from other names, which
    may hold spaces): not empty, not ``.`` or ``..``, no ``/``, ``\\`` or control character; else
    BadNameError naming ``what``."""
    if name in ("", ".", "..") or any(c in name for c in "/\\") or not name.isprintable():
        raise BadNameError(f"{what} {name!r} is not a valid folder name: it must stay one folder inside its parent "
                           "(no '/', '\\', control characters, and not '.' or '..')")
    return name


def registered_name(name: str | None, flag: str = "`register`") -> str | None:
    """``name`` (None passes) when MLflow accepts it as a registered model name."""
    if name is None:
        return None
    bad = (not name.strip() or name != name.strip() or ".." in name or any(c in name for c in "/:\\")
           or any(ord(c) < 32 or ord(c) == 127 for c in name) or name == "." or posixpath.normpath(name) != name)
    if bad:
        raise BadNameError(f"{flag} {name!r} is not a valid registered model name: use {REGISTERED_NAME_RULE}")
    return name
