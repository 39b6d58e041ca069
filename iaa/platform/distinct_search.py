"""Optuna's TPE through Ray Tune, proposing each configuration of a finite space once.

Trials of one sweep share ``train.seed``, so two trials with the same configuration train the
same model to the same accuracy: the second is pure waste. TPE samples its first
``n_startup_trials`` (10) at random, with replacement, and a small categorical space repeats
itself quickly (8 configurations, 4 trials: a repeat in 59% of sweeps). This searcher asks Optuna
again when a proposal repeats one it already made, and tells Optuna the discarded ask FAILED,
which TPE ignores (it learns from COMPLETE and PRUNED trials only). Once every configuration of
the space has been proposed, repeats are allowed.
"""

from __future__ import annotations

import json
from typing import Any

from optuna.trial import TrialState
from ray.tune.search.optuna import OptunaSearch

MAX_REDRAWS = 50   # asks per proposal before a repeat is accepted (a range space almost never repeats)


class DistinctOptunaSearch(OptunaSearch):
    """``OptunaSearch`` that skips configurations it has already proposed.

    Args:
        size: the number of distinct configurations of the space (None: unbounded, ranges).
        Other arguments are ``OptunaSearch``'s.
    """

    def __init__(self, *args: Any, size: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._size = size
        self._proposed: set[str] = set()

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        config = super().suggest(trial_id)
        exhausted = self._size is not None and len(self._proposed) >= self._size
        for _ in range(MAX_REDRAWS):
            if config is None or exhausted or _key(config) not in self._proposed:
                break
            self._ot_study.tell(self._ot_trials.pop(trial_id), state=TrialState.FAIL)   # a repeat: ask again
            config = super().suggest(trial_id)
        if config is not None:
            self._proposed.add(_key(config))
        return config


def _key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True, default=str)
