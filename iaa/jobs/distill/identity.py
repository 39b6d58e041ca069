"""The teacher a student learns from, kept in its run folder: a resumed run keeps its teacher.

``RUN_DIR/teacher.json`` names the ensemble and its members' checkpoint digests (config and
weights). ``distill --resume`` on a folder distilled from another teacher (another ensemble, or
the same folder whose members changed) is refused, naming both; a fresh or overwritten run
writes the file anew.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.errors import IaaError
from iaa.files import atomic_write_text
from iaa.jobs.workdir import fields

IDENTITY = "teacher.json"
RULES = {"ensemble": "text", "ensemble_dir": "text?", "members": "list"}


class TeacherChangedError(IaaError):
    """A run is resumed with a teacher other than the one it started with."""


def of(name: str | None, ensemble_dir: Path, digests: Sequence[str]) -> dict[str, Any]:
    """The teacher's identity: the ensemble's name (else its folder's) and folder, and its members'
    digests in order."""
    return {"ensemble": str(name or Path(ensemble_dir).name),
            "ensemble_dir": str(Path(ensemble_dir).absolute()), "members": list(digests)}


def tag(teacher: Mapping[str, Any]) -> str:
    """A short digest of the ensemble's name and its members' digests (the run's ``teacher_id`` tag)."""
    text = json.dumps([teacher["ensemble"], list(teacher["members"])])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def keep(run_dir: Path, teacher: Mapping[str, Any], resume: bool) -> None:
    """Record ``teacher`` in ``run_dir``; with ``resume``, first refuse a folder whose run learnt
    from another teacher (a folder without the record, from an older version, is taken as it is)."""
    path = Path(run_dir) / IDENTITY
    if resume and path.is_file():
        try:
            then = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise IaaError(f"{path}: not valid JSON ({err}); give `overwrite` to start the run afresh") from None
        fields.check(path, then, RULES)
        if [then["ensemble"], then["members"]] != [teacher["ensemble"], list(teacher["members"])]:
            raise TeacherChangedError(
                f"{run_dir}: its run was distilled from ensemble {then['ensemble']} (teacher {tag(then)}, "
                f"{then.get('ensemble_dir') or '?'}), not from ensemble {teacher['ensemble']} (teacher {tag(teacher)}, "
                f"{teacher['ensemble_dir']}); resume it with its own `ensemble_dir`, or give `overwrite` or another `run_dir`")
    atomic_write_text(path, json.dumps(dict(teacher), indent=1))
