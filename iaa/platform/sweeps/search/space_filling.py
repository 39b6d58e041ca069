"""A sweep's first trials spread over the space: every searched value tried at least once.

TPE starts from random draws, and a small sweep (the demo's 4 trials over 2 x 2 x 2 values) can
draw the same value of a parameter every time: that sweep never compares it, and its importance
reads 0 (or, in a tool that does not say so, anything at all). :func:`stratified_config` gives
the first ``startup_trials`` trials a Latin-hypercube design instead: each parameter walks
through its values (choices, the points of a small integer range, or equal strata of a
continuous range) in its own seeded order, so that the first ``k`` trials hold all ``k`` values
of a parameter with ``k`` of them, and no two of them share a configuration. It is a pure
function of (space, seed, trial number): deterministic, and a resumed study goes on where it was.
"""

from __future__ import annotations

import math
import random
from typing import Any, Mapping

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution

RANGE_STRATA = 4       # strata of a continuous (or large integer) range in the start-up design
MAX_POINTS = 8         # an integer or stepped range with at most this many points is walked point by point


def points(dist: BaseDistribution) -> list[Any] | None:
    """The values of a finite distribution in order; None for a continuous or large range."""
    if isinstance(dist, CategoricalDistribution):
        return list(dist.choices)
    step = getattr(dist, "step", None)
    if isinstance(dist, (IntDistribution, FloatDistribution)) and step and not dist.log:
        count = int(round((dist.high - dist.low) / step)) + 1
        if count <= MAX_POINTS:
            kind = int if isinstance(dist, IntDistribution) else float
            return [kind(dist.low + i * step) for i in range(count)]
    if isinstance(dist, IntDistribution) and not dist.log and dist.high - dist.low + 1 <= MAX_POINTS:
        return list(range(dist.low, dist.high + 1))
    return None


def startup_trials(space: Mapping[str, BaseDistribution]) -> int:
    """How many trials the design spans: the most values any parameter has (a range counts
    :data:`RANGE_STRATA`); 0 for an empty space."""
    sizes = [len(p) if (p := points(d)) is not None else RANGE_STRATA for d in space.values()]
    return max(sizes, default=0)


def stratified_config(space: Mapping[str, BaseDistribution], seed: int, number: int) -> dict[str, Any] | None:
    """The configuration of trial ``number`` in the start-up design, or None past it."""
    k = startup_trials(space)
    if number >= k:
        return None
    config: dict[str, Any] = {}
    for name, dist in space.items():
        rng = random.Random(f"{seed}:{name}")            # str seeds are hashed deterministically
        values = points(dist)
        order = list(range(len(values) if values is not None else k))
        rng.shuffle(order)
        slot = order[number % len(order)]
        if values is not None:
            config[name] = values[slot]
        else:
            u = (slot + random.Random(f"{seed}:{name}:{number}").random()) / k   # within stratum ``slot``
            config[name] = _in_range(dist, u)
    return config


def _in_range(dist: BaseDistribution, u: float) -> Any:
    """The point at fraction ``u`` of a range (in log space where the range is log)."""
    low, high = float(dist.low), float(dist.high)   # type: ignore[attr-defined]
    if dist.log:                                      # type: ignore[attr-defined]
        value = math.exp(math.log(low) + u * (math.log(high) - math.log(low)))
    else:
        value = low + u * (high - low)
    step = getattr(dist, "step", None)
    if step:
        value = low + round((value - low) / step) * step
    value = min(max(value, low), high)
    return int(round(value)) if isinstance(dist, IntDistribution) else value
