"""What a sweep's trials cannot tell: a searched parameter that never varied, too few trials.

A parameter that held one value in every scored trial was never compared: an importance of 0
(fANOVA) or any other number (another evaluator) says nothing about it. And importances from a
handful of trials are a sketch, not a ranking. ``tune``'s summary, ``report --sweep`` and the
Optuna study (a study note, shown by optuna-dashboard) all say so with these lines.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

MIN_TRIALS_TO_RANK = 10   # scored trials below which importances are not a ranking (TPE's own start-up)
RANKED_FROM = 2           # scored trials that importances and parallel coordinates need at all (they compare trials)


def varied(trials: Sequence[Mapping[str, Any]], params: Sequence[str]) -> list[str]:
    """The parameters of ``params`` that took more than one value over ``trials``."""
    return [name for name in params if len({json.dumps(t[name], default=str) for t in trials if name in t}) > 1]


def separable(trials: Sequence[Mapping[str, Any]], params: Sequence[str]) -> bool:
    """Whether ``trials`` can tell the effects of the parameters that varied apart: one trial more
    than there are such parameters at least (two trials that differ in three parameters cannot
    say which of the three made the difference)."""
    return len(trials) >= RANKED_FROM and len(trials) > len(varied(trials, params))


def notes(trials: Sequence[Mapping[str, Any]], params: Sequence[str]) -> list[str]:
    """One line per parameter of ``params`` that held a single value in all ``trials`` (each the
    searched values of a scored trial), and one when there are too few trials to rank importances:
    one line in all when fewer than :data:`RANKED_FROM` trials were scored (nothing was compared)."""
    if len(trials) < RANKED_FROM:
        return [f"{len(trials)} scored trial(s): no two trials were compared, so the sweep measured no "
                "parameter's effect"]
    out = []
    for name in params:
        values = {json.dumps(t[name], default=str) for t in trials if name in t}
        if len(values) == 1:
            out.append(f"{name} never varied (every scored trial tried {json.loads(values.pop())}): the sweep did not "
                       "measure its effect, whatever its importance reads")
    moved = varied(trials, params)
    if not separable(trials, params):
        out.append(f"{len(trials)} scored trials cannot separate the effects of the {len(moved)} parameters that "
                   f"varied ({', '.join(moved)}): importances need {len(moved) + 1} or more trials")
    elif len(trials) < MIN_TRIALS_TO_RANK:
        out.append(f"{len(trials)} scored trial(s) are too few to rank parameter importances (about "
                   f"{MIN_TRIALS_TO_RANK} or more are needed): read them as a sketch")
    return out
