"""The trials of a sweep's study that ran a configuration given to try first (``tune --try-first``):
marked with the user attribute ``tried_first``, the configuration's index in what was given."""

from __future__ import annotations

from typing import Any

from iaa.platform.sweeps.studies.carried_trials import CARRIED_FROM

TRIED_FIRST = "tried_first"


def is_given(trial: Any) -> bool:
    """Whether the Optuna ``trial`` ran a configuration its sweep was given to try first (a trial
    carried from an earlier sweep keeps that sweep's attributes, and is not)."""
    return TRIED_FIRST in trial.user_attrs and CARRIED_FROM not in trial.user_attrs
