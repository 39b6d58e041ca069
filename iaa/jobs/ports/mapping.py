"""The mapping port: one piece of a job's work that an adapter maps over a cluster's workers.

- :class:`TagMap`: make-cloze's tagging of its work units, one tagger per worker
  (:func:`iaa.platform.cloze_ray.tag`, on Ray Data), which the job calls as ``tag_map``;
- :class:`MemberScore`: the distillation teacher's scoring of one ensemble member
  (:func:`iaa.jobs.distill.teacher.score_member`), which the job hands the platform's
  :class:`~iaa.jobs.ports.launching.Scorer` (:func:`iaa.platform.teacher_ray.scorer`) to run
  once per member.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from iaa.data.cloze.tagging import Tagger, Unit


class TagMap(Protocol):
    """Maps a tagger over make-cloze's work units on a cluster."""

    def __call__(self, units: Sequence[Unit], factory: Callable[[], Tagger], /, *, workers: int | None,
                 progress: bool) -> list[str]:
        """The encoded tagging of each unit (``iaa.data.cloze.tagging.tag_units``), in ``units``
        order. ``factory`` is a picklable zero-argument function that builds one tagger on each
        worker; ``workers`` is how many taggers run at once (None: one per CPU of the cluster);
        ``progress`` shows a progress bar."""
        ...


class MemberScore(Protocol):
    """Scores one ensemble member for the distillation teacher. It travels to the workers pickled
    by reference, so it is a module-level function."""

    def __call__(self, checkpoint: Path, prepared: Path, split: str, limit: int | None, out: Path, /) -> Path:
        """Write the predictions of the member at ``checkpoint`` on ``split`` of the prepared
        data folder ``prepared`` (its first ``limit`` rows; None: all) to the file ``out``, and
        return that file's path."""
        ...
