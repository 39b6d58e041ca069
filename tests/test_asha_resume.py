"""A resumed sweep's ASHA holds the rungs its earlier process filled: Tune saves no scheduler, so
the scheduler plays the checks its Optuna study holds through again before its first trial."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from ray.tune.schedulers import TrialScheduler

from iaa.jobs.config.presets import TunePreset
from iaa.platform.sweeps.search import search_algorithm
from iaa.platform.sweeps.driver_side import DriverSide, bound
from iaa.platform.sweeps.studies.given import TRIED_FIRST
from iaa.platform.sweeps.studies.carried_trials import CARRIED_FROM


class _Trial:
    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def _study(url: str, trials: dict[str, tuple[dict[int, float], dict[str, object]]]) -> None:
    study = optuna.create_study(study_name="s", storage=url, direction="maximize")
    for trial_id, (checks, attrs) in trials.items():
        asked = study.ask()
        asked.set_user_attr("tune_trial_id", trial_id)
        for key, value in attrs.items():
            asked.set_user_attr(key, value)
        for step, value in checks.items():
            asked.report(value, step)
        study.tell(asked, max(checks.values()))


def _scheduler(tmp_path: Path, url: str | None):
    preset = TunePreset(num_samples=8, max_epochs=4.0, grace_period=1, reduction_factor=2.0, space={})
    scheduler = search_algorithm.scheduler(preset, max_t=5, sweep="s")
    side = DriverSide(tracker=None, experiment="e", parent_run_id=None, dataset="d", spec=None,   # type: ignore[arg-type]
                      study_storage=url, study_name="s")
    return scheduler, side


@pytest.mark.parametrize("remembered", [True, False])
def test_a_resumed_sweeps_asha_stops_a_trial_its_earlier_rungs_would_have(tmp_path: Path, remembered: bool) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    _study(url, {"a": ({1: 0.80, 2: 0.85}, {}), "b": ({1: 0.70, 2: 0.90}, {}),
                 "old": ({1: 0.99}, {CARRIED_FROM: "earlier"}), "guess": ({1: 0.95}, {TRIED_FIRST: 0})})
    scheduler, side = _scheduler(tmp_path, url if remembered else None)
    low, fair = _Trial("low"), _Trial("fair")
    with bound("s", side):
        said = []
        for trial, value in ((low, 0.72), (fair, 0.76)):
            scheduler.on_trial_add(None, trial)
            said.append(scheduler.on_trial_result(None, trial, {"checks": 1, "valid_acc": value}))
    # rung 1 holds a (0.80) and b (0.70), not the carried nor the given trial (which would put its
    # bar at 0.875): 0.72 is below its bar of 0.75, 0.76 above it
    assert said == ([TrialScheduler.STOP, TrialScheduler.CONTINUE] if remembered
                    else [TrialScheduler.CONTINUE, TrialScheduler.CONTINUE])


def test_a_fresh_sweeps_asha_begins_empty(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    scheduler, side = _scheduler(tmp_path, url)                       # no study yet
    with bound("s", side):
        scheduler.on_trial_add(None, _Trial("t0"))
        assert scheduler.on_trial_result(None, _Trial("t0"), {"checks": 1, "valid_acc": 0.1}) == TrialScheduler.CONTINUE
