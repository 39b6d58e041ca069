"""How ``iaa-cli distill`` ends: the student against the teacher ensemble and its best member, in
points (and how many points of the ensemble's gain over that member the student kept), each
accuracy with its error bar,
why the student's training stopped, and the next commands."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iaa.jobs.evaluation import closing, uncertainty
from iaa.jobs.evaluation.ensembling.ensemble_record import EnsembleRecord
from iaa.jobs.training import summary as train_summary
from iaa.jobs.training.summary import TrainResult


@dataclass(frozen=True, kw_only=True)
class DistillResult(TrainResult):
    """The student: its training run's result, with its teacher (the Parquet file of the ensemble's
    averaged distributions, and whether this run computed it), the ensemble's members and how the
    student compares with them (:func:`comparison`)."""

    teacher: str
    teacher_computed: bool
    dataset: str
    members: tuple[str, ...]                    # the teacher's member checkpoints
    teacher_valid_acc: float | None
    best_member_valid_acc: float | None
    gain_points: float | None                   # the ensemble over its best member, in points
    gain_kept_points: float | None              # how many of those the student kept


COMPARED = ("teacher_valid_acc", "best_member_valid_acc", "gain_points", "gain_kept_points")   # comparison's keys


def comparison(student: float | None, ensemble: EnsembleRecord) -> dict[str, Any]:
    """``teacher_valid_acc``, ``best_member_valid_acc``, ``gain_points`` (the ensemble's valid accuracy
    over its best member's, in points; None where either is unknown) and ``gain_kept_points`` (how
    many of those points the student kept: 0 where it is not above the best member, at most the
    gain; None where there is no gain to keep). Points, not a share of the gain: a share of a gain
    of a fraction of a point swings to thousands of percent."""
    teacher, best = ensemble.valid_acc, ensemble.best_member_valid_acc
    gain = None if teacher is None or best is None else round(100 * (teacher - best), 2)
    kept = (None if student is None or gain is None or gain <= 0
            else round(min(max(100 * (student - best), 0.0), gain), 2))
    return dict(zip(COMPARED, (teacher, best, gain, kept)))


def run_note(result: DistillResult) -> str:
    """The student's run description (MLflow's runs page shows it): the train run's
    (:func:`~iaa.jobs.training.summary.run_note`), then the teacher's and its best member's valid
    accuracies and how many points of the ensemble's gain over that member the student kept."""
    note = train_summary.run_note(result, result.checkpoint)
    teacher, best, gain, kept = (result.teacher_valid_acc, result.best_member_valid_acc, result.gain_points,
                                 result.gain_kept_points)
    figures = [f"teacher_valid_acc {teacher:.4f}" if teacher is not None else "",
               f"best_member_valid_acc {best:.4f}" if best is not None else ""]
    shown = ", ".join(f for f in figures if f)
    if shown:
        note += f" Its teacher is an ensemble of {_members(len(result.members))} ({shown})."
    if gain is not None and kept is not None:
        said = _gain_line(gain, kept).strip()
        note += f" {said[0].upper()}{said[1:]} (gain_kept_points {kept:g} of gain_points {gain:g})."
    elif gain is not None:
        note += f" The ensemble is not above its best member (gain_points {gain:g}): there was no gain to keep."
    return note


def _points_from(student: float, other: float) -> str:
    """``12.3 points below``, ``0.4 points above`` or ``level with``, of ``student`` against ``other``."""
    points = 100 * (student - other)
    if round(points, 1) == 0:
        return "level with"
    return f"{abs(points):.1f} points {'above' if points > 0 else 'below'}"


def _gain_line(gain: float, kept: float) -> str:
    if kept <= 0:
        return f"  the ensemble is {gain:.1f} points above its best member; the student kept none of that gain"
    if kept >= gain:
        return f"  the student kept all of the ensemble's {gain:.1f} points over its best member"
    return f"  the student kept {kept:.1f} of the ensemble's {gain:.1f} points over its best member"


def describe(result: DistillResult) -> str:
    """The student's training summary, then how it compares with what it learned from."""
    n = int(result.valid_examples or 0)
    lines = train_summary.head_lines(result, what="distill")
    teacher, best, student = result.teacher_valid_acc, result.best_member_valid_acc, result.best_valid_acc
    if teacher is not None and student is not None:
        lines.append(f"  teacher:      ensemble of {_members(len(result.members))}, valid accuracy "
                     f"{uncertainty.accuracy_text(teacher, n)}; the student is {_points_from(student, teacher)} it")
    if best is not None and student is not None:
        lines.append(f"  best member:  valid accuracy {best:.4f}; the student is {_points_from(student, best)} it")
    gain, kept = result.gain_points, result.gain_kept_points
    if gain is not None and kept is not None:
        lines.append(_gain_line(gain, kept))
    elif gain is not None:
        lines.append("  the ensemble is not above its best member: there was no gain to keep")
    if student is not None and n and uncertainty.is_noise(student, n):
        lines.append(f"  on {n} valid questions these differences are noise")
    return "\n".join(lines + [closing.next_block(result.next)])


def _members(n: int) -> str:
    return f"{n} member{'' if n == 1 else 's'}"
