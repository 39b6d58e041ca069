"""The output policy: what a command may write, and what it may replace or delete.

Every command that writes goes through these checks, before any work:

- **Never over an input or a store.** An output that resolves to the same file as an input of
  the command (a checkpoint, a question file, a source) or a store it uses (the tracking
  database) is refused (:func:`refuse_inputs`). An output folder may not be an input folder,
  nor hold one.
- **The suffix says what is written** (:func:`check_suffix`): ``--out x.txt`` for a PNG is refused.
- **Replace only our own kind, and only when asked** (:func:`check_folder`): a folder holding
  a manifest of the command's kind is replaced only with ``--overwrite`` (or when the command
  would write the same output again, a repair); a folder holding anything else is refused,
  naming what is there.
- **Delete only what we wrote** (:func:`install`): a rebuild moves its new files in one by one,
  the manifest last, and then deletes the files that the previous manifest recorded and the new
  one does not. Anything else in the folder is left alone.
- **One line for a full or read-only disk** (:func:`iaa.files.writing`): an ``OSError`` while writing is
  an :class:`OutputError` naming the file.

File writes themselves are atomic (``iaa.files.atomic_path``): a reader never sees a
half-written file.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Mapping

from iaa.errors import IaaError
from iaa.files import UnwritableError, remove_dead_leftovers, unwritable_message, writing

__all__ = ["OutputError", "refuse_inputs", "check_suffix", "check_file", "check_file_output", "data_files",
           "check_folder", "install", "building", "files_under", "writing"]

OVERWRITE = "`overwrite`"


class OutputError(IaaError):
    """An output that would replace an input, a store or something the command did not write."""


def same_path(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """True when ``a`` and ``b`` name the same file or folder (links and ``..`` resolved)."""
    try:
        if os.path.exists(a) and os.path.exists(b):
            return os.path.samefile(a, b)
    except OSError:
        pass
    return Path(a).resolve() == Path(b).resolve()


def inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """True when ``path`` is ``folder`` or lies somewhere below it (links resolved)."""
    path, folder = Path(path).resolve(), Path(folder).resolve()
    return path == folder or folder in path.parents


def refuse_inputs(out: str | os.PathLike[str], inputs: Mapping[str, str | os.PathLike[str] | Iterable | None],
                  *, flag: str = "`out`", folder: bool = False) -> None:
    """Refuse ``out`` when it is one of ``inputs`` (label -> path, or several paths, or None).

    With ``folder=True`` (the output is a folder) an input that lies inside ``out`` is refused
    too: a rebuild of the folder could replace it.
    """
    for label, given in inputs.items():
        paths = [given] if isinstance(given, (str, os.PathLike)) else list(given or ())
        for path in paths:
            if path is None or "://" in str(path):     # a remote store or bucket: never a local output
                continue
            if same_path(out, path) or (folder and inside(path, out) and Path(path).exists()):
                how = "is" if same_path(out, path) else "holds"
                raise OutputError(f"{out}: {flag} {how} {label} {path}, which the command uses; "
                                  f"give another {flag} (nothing was written)")


def check_suffix(out: str | os.PathLike[str], suffixes: Iterable[str], what: str, *, flag: str = "`out`") -> None:
    """Refuse ``out`` unless its name ends with one of ``suffixes`` (case-insensitive)."""
    suffixes = tuple(suffixes)
    if not str(Path(out).name).lower().endswith(suffixes):
        raise OutputError(f"{out}: {flag} is written as {what}, so its name must end with "
                          f"{' or '.join(suffixes)} (nothing was written)")


def check_file(out: str | os.PathLike[str], *, flag: str = "`out`") -> None:
    """Refuse a file output that names an existing folder."""
    if Path(out).is_dir():
        raise OutputError(f"{out}: {flag} is a folder; give a file name (nothing was written)")


def check_file_output(out: str | os.PathLike[str], *, suffixes: Iterable[str], what: str,
                      inputs: Mapping[str, str | os.PathLike[str] | Iterable | None], flag: str = "`out`") -> Path:
    """All the checks of a file output, before any work: not a folder, the right suffix, no input,
    and a place where a file can be created (:func:`check_creatable`)."""
    check_file(out, flag=flag)
    check_suffix(out, suffixes, what, flag=flag)
    refuse_inputs(out, inputs, flag=flag)
    check_creatable(out)
    return Path(out)


def check_creatable(out: str | os.PathLike[str]) -> None:
    """Refuse ``out`` where no file can be created, with the error that writing it would meet (a
    read-only or forbidden folder, a parent that is a file, a file system that takes no files),
    before any work. Probed with a temporary file in the nearest existing folder on the way to
    ``out``, deleted at once; no folder is made."""
    folder = next(p for p in Path(out).absolute().parents if p.exists())
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as err:
        raise UnwritableError(unwritable_message(err, out)) from None


def data_files(prepared: str | os.PathLike[str] | None) -> list[Path]:
    """The files of a prepared data folder, as inputs an output may not replace."""
    return [] if prepared is None else [Path(prepared) / rel for rel in files_under(Path(prepared))]


def check_folder(out: Path, *, manifest: str, kind: str, overwrite: bool, same: bool = False,
                 flag: str = "`out`") -> bool:
    """May ``out`` receive a ``kind`` (a folder whose ``manifest`` says what it holds)?

    Returns True when ``out`` holds an earlier ``kind`` that will be replaced. Raises
    :class:`OutputError` when ``out`` is a file, holds an earlier ``kind`` and neither
    ``overwrite`` nor ``same`` (the same output would be written again) is given, or holds
    anything else and no manifest.
    """
    out = Path(out)
    if not out.exists():
        return False
    if not out.is_dir():
        raise OutputError(f"{out}: {flag} exists and is not a folder; give a new or empty folder (nothing was written)")
    if (out / manifest).is_file():
        if not (overwrite or same):
            raise OutputError(f"{out} already holds a {kind} ({manifest}); add {OVERWRITE} to replace it "
                              f"(only the files it recorded are replaced), or give another {flag}")
        return True
    others = sorted(p.name for p in out.iterdir())
    if others:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise OutputError(f"{out}: refusing to write a {kind} into a folder that holds other files ({shown}) "
                          f"and no {manifest}; give a new or empty {flag} folder (nothing was written)")
    return False


def files_under(folder: Path) -> list[str]:
    """Every file below ``folder``, as sorted POSIX paths relative to it."""
    return sorted(p.relative_to(folder).as_posix() for p in Path(folder).rglob("*") if p.is_file())


def install(tmp: Path, out: Path, *, written: Iterable[str], previous: Iterable[str], manifest: str) -> None:
    """Move the new files ``written`` (relative to ``tmp``) into ``out``; delete the stale ones.

    ``manifest`` moves last, so a folder with the new manifest holds every new file. Then the
    files of ``previous`` (what the earlier output recorded) that the new output does not hold
    are deleted, and the folders that this leaves empty. Nothing else in ``out`` is touched.
    """
    written = [w for w in written if w != manifest] + [manifest]
    out.mkdir(parents=True, exist_ok=True)
    with writing(out):
        for rel in written:
            target = out / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / rel, target)
        keep = set(written)
        for rel in previous:
            if rel in keep or not _relative(rel):
                continue
            stale = out / rel
            if stale.is_file() or stale.is_symlink():
                stale.unlink()
                _prune(stale.parent, out)


def _relative(rel: str) -> bool:
    """A recorded name that stays inside its folder (a damaged manifest may hold anything)."""
    parts = Path(rel).parts
    return bool(parts) and not Path(rel).is_absolute() and ".." not in parts


def _prune(folder: Path, root: Path) -> None:
    """Remove ``folder`` and its parents up to ``root`` while they are empty."""
    while folder != root and root in folder.parents:
        try:
            folder.rmdir()
        except OSError:
            return
        folder = folder.parent


def building(out: Path) -> Path:
    """A fresh sibling folder of ``out`` to build in (``out`` itself resolved, so ``.`` works).

    Building folders of ``out`` left by killed runs (``.NAME.building-PID`` of a dead PID) are
    removed first; one of a live process is left alone.
    """
    out = Path(out).resolve()
    name = out.name or "out"
    remove_dead_leftovers(out.parent, rf"\.{re.escape(name)}\.building-(?P<pid>\d+)")
    tmp = out.parent / f".{name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    return tmp
