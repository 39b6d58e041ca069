"""How well ASHA's first comparison ranked a sweep's trials, read from the trials themselves.

ASHA first compares trials at check ``grace_period`` and lets the best of them go on. Where that
check came too early for the data (on real text, a first check of 8,000 examples ranked
configurations worse than chance: docs/search.md), the trials it let go on end in an order that
has little to do with the one it put them in. The sweep's end (:mod:`iaa.jobs.tune.tune`) and
``report --sweep`` say so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from iaa.jobs.evaluation.closing import Command

# Below this rank correlation between ASHA's first comparison and how the trials that went on past
# it ended, the comparison came too early to rank them (on cbt-recon CN, the first check of 8,000
# examples ranked 32 configurations at -0.16, that of 16,000 at 0.56; replayed, a warning below
# 0.3 fired on 94% of sweeps that compared at 8,000 and on a fifth of those at 16,000:
# benchmarks/bench_first_comparison.py).
RANKED_POORLY = 0.3


@dataclass(frozen=True)
class Checked:
    """One trial's validation checks: ``valid_acc`` by check number (1 first), and whether ASHA
    stopped it (at its last check)."""

    values: Mapping[int, float]
    stopped_by_asha: bool = False


def first_comparison(trials: Sequence[Checked], grace_period: int) -> dict[str, Any]:
    """ASHA's first comparison of ``trials``, at check ``grace_period``: how many it compared and
    stopped there, and how the trials that went on past it ended against the order it put them in
    (``spearman``: the rank correlation of their accuracy at that check with their best; None
    under 3 such trials, or where every value ties). Those trials are the ones it ranked high, so a
    low correlation among them says the check ranked even its leaders by chance."""
    compared = [t for t in trials if grace_period in t.values]
    went_on = [t for t in compared if max(t.values) > grace_period]
    stopped = sum(1 for t in compared if t.stopped_by_asha and max(t.values) == grace_period)
    rho = None
    if len(went_on) >= 3:
        from scipy.stats import spearmanr

        value = float(spearmanr([t.values[grace_period] for t in went_on],
                                [max(t.values.values()) for t in went_on]).statistic)
        rho = None if math.isnan(value) else round(value, 3)
    return {"check": grace_period, "compared": len(compared), "stopped": stopped, "went_on": len(went_on),
            "spearman": rho}


def ranked_poorly(compared: Mapping[str, Any] | None) -> list[str]:
    """A warning where :func:`first_comparison` found the order of the trials that went on poorly
    kept, naming the later grace period for the next sweep; else nothing."""
    if compared is None or compared["spearman"] is None or compared["spearman"] >= RANKED_POORLY:
        return []
    return [f"ASHA's first comparison (check {compared['check']}) ranked the {compared['went_on']} trials that went on "
            f"past it poorly against how they ended (Spearman {compared['spearman']:.2f}): it may have stopped trials "
            f"that would have ended best; a sweep that compares later ranks on more training "
            f"({Command.of('tune', grace_period=compared['check'] + 1)} or more, with its other options)"]
