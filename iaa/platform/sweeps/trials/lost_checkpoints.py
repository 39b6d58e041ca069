"""Before a resume: the unfinished trials whose last checkpoint the saved Tune state names, but
whose storage no longer holds it.

Tune keeps a trial's best checkpoint and its latest. It deletes the one a new checkpoint
supersedes as soon as the new one arrives, and saves the run's state a moment later. A sweep
killed in between (a preempted node, ``kill -9``) leaves a saved state that names a deleted
checkpoint. Tune restores a trial only from the checkpoint its state names, so that trial would
fail every restore and end ERROR, on this resume and on every later one.

:func:`mend` copies the newest checkpoint that the trial's folder still holds from before the
lost one, under the lost one's name. Tune had received that checkpoint, so it is whole (it is
usually the trial's best). The trial continues from it and makes its later checks again, as a
trial does after a lost node; its run keeps each check once.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from typing import Any, Iterable

CHECKPOINT_DIR = re.compile(r"checkpoint_(\d+)")


@dataclass(frozen=True)
class Mended:
    """A trial whose ``lost`` checkpoint (its folder's name) now holds a copy of ``used``."""

    trial_id: str
    lost: str
    used: str


def mend(trials: Iterable[Any]) -> list[Mended]:
    """Give each unfinished trial of ``trials`` (Tune's, as its saved state holds them) whose last
    checkpoint is missing the newest checkpoint its folder holds from before that one; returns
    those mended. A trial with no such older checkpoint is left as it is."""
    from pyarrow import fs

    mended = []
    for trial in trials:
        lost = trial.checkpoint if trial.status != "TERMINATED" else None
        if lost is None or lost.filesystem.get_file_info(lost.path).type != fs.FileType.NotFound:
            continue
        used = _newest_before(lost.filesystem, lost.path)
        if used is None:
            continue
        lost.filesystem.create_dir(lost.path, recursive=True)
        fs.copy_files(used, lost.path, source_filesystem=lost.filesystem, destination_filesystem=lost.filesystem)
        mended.append(Mended(trial.trial_id, posixpath.basename(lost.path), posixpath.basename(used)))
    return mended


def _newest_before(filesystem: Any, lost: str) -> str | None:
    """The path of the newest checkpoint folder beside ``lost`` numbered before it, if any."""
    from pyarrow import fs

    number = CHECKPOINT_DIR.fullmatch(posixpath.basename(lost))
    if number is None:
        return None
    older = [(int(m.group(1)), info.path) for info in filesystem.get_file_info(fs.FileSelector(posixpath.dirname(lost)))
             if info.type == fs.FileType.Directory and (m := CHECKPOINT_DIR.fullmatch(info.base_name))
             and int(m.group(1)) < int(number.group(1))]
    return max(older)[1] if older else None
