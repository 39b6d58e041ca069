"""How ``iaa-cli distill`` ends: the student against the teacher ensemble and its best member (how
much of the ensemble's gain over that member the student kept), each accuracy with its error bar,
why the student's training stopped, and the next commands."""

from __future__ import annotations

from typing import Any, Mapping

from iaa.jobs.evaluation import closing, uncertainty
from iaa.jobs.training import summary as train_summary


def comparison(student: float | None, ensemble: Mapping[str, Any]) -> dict[str, Any]:
    """``teacher_valid_acc``, ``best_member_valid_acc`` and ``gain_kept``: (student - best member)
    / (ensemble - best member), None where the ensemble is not above its best member."""
    teacher = ensemble.get("valid_acc")
    members = [a for a in ensemble.get("member_valid_acc") or [] if isinstance(a, (int, float))]
    best = max(members) if members else None
    gain = (None if student is None or teacher is None or best is None or teacher <= best
            else round((student - best) / (teacher - best), 4))
    return {"teacher_valid_acc": teacher, "best_member_valid_acc": best, "gain_kept": gain}


def describe(result: Mapping[str, Any], req: Any = None) -> str:
    """The student's training summary, then how it compares with what it learned from."""
    n = int(result.get("valid_examples") or 0)
    head = train_summary.describe(result, req, what="distill").split("\nnext:\n")[0]
    lines = [head]
    teacher, best, student = (result.get("teacher_valid_acc"), result.get("best_member_valid_acc"),
                              result.get("best_valid_acc"))
    if teacher is not None and student is not None:
        lines.append(f"  teacher:      ensemble of {len(result.get('members') or [])} members, valid accuracy "
                     f"{uncertainty.accuracy_text(teacher, n)}")
    if best is not None and student is not None:
        lines.append(f"  best member:  valid accuracy {best:.4f}; the student is {100 * (student - best):+.1f} points "
                     "from it")
    gain = result.get("gain_kept")
    if gain is not None:
        lines.append(f"  the student kept {100 * gain:.0f}% of the ensemble's gain over its best member")
    elif teacher is not None and best is not None:
        lines.append("  the ensemble is not above its best member: there was no gain to keep")
    if student is not None and n and uncertainty.is_noise(student, n):
        lines.append(f"  on {n} valid questions these differences are noise")
    return "\n".join(lines + [closing.next_block(train_summary.next_commands(result, req))])
