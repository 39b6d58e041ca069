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


def notes(trials: Sequence[Mapping[str, Any]], params: Sequence[str]) -> list[str]:
    """One line per parameter of ``params`` that held a single value in all ``trials`` (each the
    searched values of a scored trial), and one when there are too few trials to rank importances."""
    out = []
    for name in params:
        values = {json.dumps(t[name], default=str) for t in trials if name in t}
        if trials and len(values) == 1:
            out.append(f"{name} never varied (every scored trial tried {json.loads(values.pop())}): the sweep did not "
                       "measure its effect, whatever its importance reads")
    if len(trials) < MIN_TRIALS_TO_RANK:
        out.append(f"{len(trials)} scored trial(s) are too few to rank parameter importances (about "
                   f"{MIN_TRIALS_TO_RANK} or more are needed): read them as a sketch")
    return out
