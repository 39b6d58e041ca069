"""``report --sweep``: the three figures and their numbers from a sweep's Optuna study."""

from __future__ import annotations

from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")


def _study(url: str) -> None:
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    study = optuna.create_study(study_name="demo-x", storage=url, direction="maximize")
    dists = {"train.lr": CategoricalDistribution([0.002, 0.004]), "model.steps": CategoricalDistribution([2, 3])}
    runs = [((0.004, 2), TrialState.COMPLETE, {1: 0.8, 2: 0.9, 3: 0.93}),
            ((0.002, 2), TrialState.PRUNED, {1: 0.5, 2: 0.55}),
            ((0.004, 3), TrialState.COMPLETE, {1: 0.75, 2: 0.88, 3: 0.9}),
            ((0.002, 3), TrialState.PRUNED, {1: 0.45, 2: 0.5}),
            ((0.004, 2), TrialState.COMPLETE, {1: 0.81, 2: 0.9, 3: 0.92}),
            ((0.002, 3), TrialState.PRUNED, {1: 0.46, 2: 0.52}),
            ((0.004, 3), TrialState.COMPLETE, {1: 0.8, 2: 0.89, 3: 0.91}),
            ((0.002, 2), TrialState.PRUNED, {1: 0.47, 2: 0.53})]
    for (lr, steps), state, checks in runs:
        study.add_trial(create_trial(params={"train.lr": lr, "model.steps": steps}, distributions=dists,
                                     state=state, intermediate_values=checks,
                                     value=max(checks.values()) if state == TrialState.COMPLETE else None))


def test_the_study_gives_importances_and_three_figures_with_asha_stops(tmp_path: Path) -> None:
    from iaa.platform.sweeps.study import analyze

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    _study(url)
    result = analyze(url, "demo-x", tmp_path / "report")
    assert set(result["importances"]) == {"train.lr", "model.steps"}
    assert result["importances"]["train.lr"] > result["importances"]["model.steps"]   # lr splits 0.9 from 0.5
    assert sum(t["stopped_by_asha"] for t in result["trials"]) == 4
    assert result["trials"][1]["intermediate_values"] == {1: 0.5, 2: 0.55}
    for figure in result["figures"].values():
        assert Path(figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_missing_study_is_one_clear_error(tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.platform.sweeps.study import analyze

    with pytest.raises(IaaError, match="no Optuna study 'nope'"):
        analyze(f"sqlite:///{tmp_path / 'optuna.db'}", "nope", tmp_path / "report")
