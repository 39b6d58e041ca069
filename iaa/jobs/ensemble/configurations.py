"""The configurations of a sweep's ensemble (``iaa-cli ensemble --sweep NAME --top-configs K``),
ranked over their seeds.

A sweep ranks its configurations by one trial each, and another seed moves a trial's accuracy by
about as much as the gaps between the best configurations. An ensemble of the K best trains each
on N seeds; here the configurations are ranked by their mean over those seeds, and the leader's
lead is weighed against the standard error of the difference of the two means (the seeds' own
spread, which holds the validation set's chance as well): more than twice that, and the seeds say
the leader is better.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from iaa.jobs.config.job_config import JobConfig, config_label
from iaa.jobs.ensemble.members import config_key
from iaa.jobs.ports import TrialRecord

APART = 2.0     # standard errors of the difference of two means beyond which the seeds rank them


@dataclass(frozen=True)
class ConfigScores:
    """One configuration's members: its place in the sweep's ranking (0: the sweep's best), the
    values the sweep searched, and each seed's valid accuracy."""

    config: int
    label: str
    seeds: tuple[int, ...]
    valid_acc: tuple[float, ...]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.valid_acc)

    @property
    def stdev(self) -> float | None:
        """The seeds' sample standard deviation; None for a single seed."""
        return statistics.stdev(self.valid_acc) if len(self.valid_acc) > 1 else None

    def fields(self) -> dict[str, object]:
        return {"config": self.config, "label": self.label, "seeds": list(self.seeds),
                "valid_acc": [round(a, 10) for a in self.valid_acc], "mean_valid_acc": round(self.mean, 10),
                "stdev_valid_acc": None if self.stdev is None else round(self.stdev, 10)}


@dataclass(frozen=True)
class Lead:
    """The first configuration by mean over the second: the gap and its standard error in points,
    and whether the seeds rank them (the gap is more than :data:`APART` standard errors)."""

    first: ConfigScores
    second: ConfigScores
    gap_points: float
    stderr_points: float

    @property
    def apart(self) -> bool:
        return self.gap_points > APART * self.stderr_points

    def fields(self) -> dict[str, object]:
        return {"first": self.first.config, "second": self.second.config, "gap_points": round(self.gap_points, 4),
                "stderr_points": round(self.stderr_points, 4), "apart": self.apart}


def scores(configs: Sequence[JobConfig], valid_acc: Sequence[float], trials: Sequence[TrialRecord]) -> list[ConfigScores]:
    """The members (``configs``, each with its seed, and their accuracies, in the same order) grouped
    by configuration in the order they come, which is the sweep's; each named by the searched
    values of the sweep's trial that ran it."""
    searched = {config_key(t.config, ignore_seed=True): t.params for t in trials}
    groups: dict[str, list[tuple[int, float]]] = {}
    for cfg, acc in zip(configs, valid_acc):
        groups.setdefault(config_key(cfg, ignore_seed=True), []).append((cfg.train.seed, float(acc)))
    return [ConfigScores(i, config_label(searched.get(key, {})) or f"config{i}", tuple(s for s, _ in members),
                         tuple(a for _, a in members))
            for i, (key, members) in enumerate(groups.items())]


def lead(ranked: Sequence[ConfigScores]) -> Lead | None:
    """The best configuration by mean over the runner-up; None with fewer than two configurations,
    or one with a single seed (no spread to weigh the gap against)."""
    if len(ranked) < 2:
        return None
    first, second = sorted(ranked, key=lambda c: -c.mean)[:2]
    if first.stdev is None or second.stdev is None:
        return None
    stderr = math.sqrt(first.stdev ** 2 / len(first.valid_acc) + second.stdev ** 2 / len(second.valid_acc))
    return Lead(first, second, 100.0 * (first.mean - second.mean), 100.0 * stderr)


def lines(ranked: Sequence[ConfigScores], found: Lead | None) -> str:
    """Each configuration over its seeds, and what the seeds say of the leader."""
    rows = [f"config{c.config} ({c.label}): mean valid accuracy {c.mean:.4f} over {len(c.seeds)} seed(s)"
            + ("" if c.stdev is None else f", {min(c.valid_acc):.4f} to {max(c.valid_acc):.4f}")
            + (" (the sweep's best)" if c.config == 0 else "")
            for c in sorted(ranked, key=lambda c: -c.mean)]
    if found is None:
        verdict = "with one seed a configuration has no spread to rank it by: give `seeds` 3 or more"
    else:
        gap = (f"config{found.first.config} leads config{found.second.config} by {found.gap_points:.2f} points, "
               f"{found.gap_points / found.stderr_points if found.stderr_points else math.inf:.1f} standard errors "
               f"of the gap ({found.stderr_points:.2f})")
        verdict = (f"{gap}: the seeds rank it first" if found.apart
                   else f"{gap}: less than {APART:g}, so these seeds cannot rank them either (more seeds "
                        "narrow the standard error as one over their square root)")
        if found.apart and found.first.config != 0:
            verdict += ", above the sweep's own pick config0"
    return "configurations over their seeds:\n" + "\n".join(f"  {row}" for row in rows) + f"\n  {verdict}"
