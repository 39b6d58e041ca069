"""How far a sweep's validation set ranks its best trials: those tied with the best, and those
below it by less than chance moves two readers' scores on that many questions
(:func:`iaa.jobs.evaluation.uncertainty.close_to_best`). ``tune`` says it at the sweep's end and
``report --sweep`` from the sweep's record; both name the ensemble that ranks them over seeds."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from iaa.jobs.evaluation import uncertainty

# The configurations that the next ensemble trains on several seeds where the sweep cannot rank its best.
MAX_CLOSE_CONFIGS = 3


@dataclass(frozen=True)
class Ranking:
    """The trials tied with the best (``ties``, the best among them) and those below it by less
    than chance on ``n`` validation questions (``close``, closest first)."""

    ties: tuple[str, ...]
    close: tuple[str, ...]

    @classmethod
    def of(cls, scores: Mapping[str, float | None], n: int) -> Ranking:
        return cls(tuple(uncertainty.tied_best(scores)), tuple(uncertainty.close_to_best(scores, n)))

    @property
    def top_configs(self) -> int:
        """The configurations an ensemble should train on several seeds to rank them: the best, its
        ties and the close ones, at most :data:`MAX_CLOSE_CONFIGS`."""
        return min(max(len(self.ties), 1) + len(self.close), MAX_CLOSE_CONFIGS)

    def note(self, scores: Mapping[str, float | None], best: str, n: int, ensemble: object) -> str:
        """The line that names the close trials and the ``ensemble`` command that ranks them."""
        return uncertainty.close_note(self.close, scores, best, n, (
            f"to rank the {self.top_configs} best configurations, train each on several seeds and see which is "
            f"ahead: {ensemble}"))
