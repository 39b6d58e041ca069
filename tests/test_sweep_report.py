"""``report --sweep``: the three figures and their numbers from a sweep's Optuna study."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from _faults import assert_says
from iaa.jobs.ports import StudyAnalysis, StudyTrial

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
    from iaa.platform.sweeps.studies.study import analyze

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    _study(url)
    result = analyze(url, "demo-x", tmp_path / "report")
    assert set(result.importances) == {"train.lr", "model.steps"}
    assert result.importances["train.lr"] > result.importances["model.steps"]   # lr splits 0.9 from 0.5
    assert sum(t.stopped_by_asha for t in result.trials) == 4
    assert result.trials[1].intermediate_values == {1: 0.5, 2: 0.55}
    for figure in result.figures.values():
        assert Path(figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_two_trials_that_differ_in_every_parameter_get_no_importances_and_whole_check_ticks(tmp_path: Path,
                                                                                           monkeypatch) -> None:
    """Two trials that differ in both parameters cannot say which one made the difference: the
    parallel coordinates show them, and no importance is given. One check each: the checks
    axis is ticked at whole checks."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from iaa.platform.sweeps.studies import study as study_module

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="two", storage=url, direction="maximize")
    dists = {"train.lr": CategoricalDistribution([0.002, 0.004]), "model.steps": CategoricalDistribution([2, 3])}
    for (lr, steps), value in (((0.002, 3), 0.4), ((0.004, 2), 0.6)):
        study.add_trial(create_trial(params={"train.lr": lr, "model.steps": steps}, distributions=dists,
                                     state=TrialState.COMPLETE, intermediate_values={1: value}, value=value))
    ticks = []
    save = study_module._save

    def keep_ticks(plt, path):
        if path.name == "intermediate_values.png":
            low, high = plt.gca().get_xlim()
            ticks.extend(t for t in plt.gca().get_xticks() if low <= t <= high)
        save(plt, path)

    monkeypatch.setattr(study_module, "_save", keep_ticks)
    result = study_module.analyze(url, "two", tmp_path / "report")
    assert result.importances == {}
    assert set(result.figures) == {"parallel_coordinates", "intermediate_values", "history"}
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_the_analyzer_returns_a_record_and_the_json_object_keeps_its_keys(tmp_path: Path) -> None:
    """The study comes back as typed records; ``--json`` lists the same keys, in the same order, as
    when the analyzer returned a dict: a trial's ``carried_from`` and ``tried_first`` only where it
    has them, the best trial and the history as objects."""
    import json

    from iaa.jobs.ports import BestTrial, HistoryPoint
    from iaa.jobs.reports.sweep_report import from_analysis
    from iaa.platform.sweeps.studies.study import analyze

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    _study(url)
    analysis = analyze(url, "demo-x", tmp_path / "report")
    assert isinstance(analysis, StudyAnalysis) and {type(t) for t in analysis.trials} == {StudyTrial}
    assert analysis.best == BestTrial({"train.lr": 0.004, "model.steps": 2}, 0.93)
    assert {type(p) for p in analysis.history} <= {HistoryPoint} and analysis.storage == url
    carried = dataclasses.replace(analysis.trials[0], carried_from="earlier", tried_first=1)
    found = from_analysis(dataclasses.replace(analysis, trials=(carried, *analysis.trials[1:])), sweep="demo-x",
                          recorded=8).fields()
    assert list(found) == ["warnings", "sweep", "sampler", "study", "trials", "importances", "figures",
                           "dashboard_importances", "sweep_trials", "stopped_attempts", "complete_trials",
                           "scored_trials", "storage", "importance_evaluator", "best", "history", "carried_trials",
                           "carried_best", "logged_to_run"]
    plain_trial = ["number", "name", "state", "params", "value", "intermediate_values", "stopped_by_asha",
                   "stopped_by_time_budget"]
    assert [list(t) for t in found["trials"][:2]] == [plain_trial + ["carried_from", "tried_first"], plain_trial]
    assert found["trials"][1]["intermediate_values"] == {1: 0.5, 2: 0.55}
    assert found["best"] == {"params": {"train.lr": 0.004, "model.steps": 2}, "value": 0.93}
    assert found["figures"] == {name: str(tmp_path / "report" / f"{name}.png") for name in analysis.figures}
    assert [list(p) for p in found["history"]] == [["number", "name", "hours", "value", "best", "cut", "running_hours"]] * 8
    assert (found["importance_evaluator"], found["carried_trials"], found["carried_best"]) == ("fANOVA", 0, None)
    json.dumps(found)


def test_a_missing_study_is_one_clear_error(tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.platform.sweeps.studies.study import analyze

    with pytest.raises(IaaError, match="no Optuna study 'nope'"):
        analyze(f"sqlite:///{tmp_path / 'optuna.db'}", "nope", tmp_path / "report")


def _pedanova(study) -> dict[str, float]:
    """PED-ANOVA as optuna-dashboard calls it: default evaluator, the maximised value negated."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return optuna.importance.get_param_importances(
            study, evaluator=optuna.importance.PedAnovaImportanceEvaluator(), target=lambda t: -t.values[0])


def test_the_report_gives_the_dashboards_importances_beside_its_own(tmp_path: Path) -> None:
    from iaa.jobs.reports.sweep_report import describe, from_analysis
    from iaa.platform.sweeps.studies.study import analyze

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    _study(url)
    result = analyze(url, "demo-x", tmp_path / "report")
    expected = _pedanova(optuna.load_study(study_name="demo-x", storage=url))
    assert result.dashboard_importances == pytest.approx(expected)
    assert list(result.dashboard_importances) == list(expected)           # the same order
    assert (result.complete_trials, result.scored_trials) == (4, 8)
    text = describe(from_analysis(result, sweep="demo-x"))
    line = next(line for line in text.splitlines() if line.startswith("optuna-dashboard shows PED-ANOVA"))
    assert all(f"{k} {v:.3f}" in line for k, v in expected.items())
    assert "4 COMPLETE" in line and "all 8 scored" in line


def test_the_dashboard_importances_that_tie_are_in_the_order_of_their_names(tmp_path: Path, monkeypatch) -> None:
    """PED-ANOVA orders tied importances by chance: the report orders them by name, so two runs
    of it print the same line."""
    from iaa.platform.sweeps.studies.study import dashboard_importances

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    _study(url)
    study = optuna.load_study(study_name="demo-x", storage=url)
    monkeypatch.setattr(optuna.importance, "get_param_importances",
                        lambda *args, **kwargs: {"train.lr": 0.0, "model.steps": 0.0, "model.hidden_dim": 0.5})
    assert list(dashboard_importances(study)) == ["model.hidden_dim", "model.steps", "train.lr"]


def test_the_dashboard_importances_are_optuna_dashboards_own(tmp_path: Path) -> None:
    """Against optuna-dashboard's code where it is installed (the ``dashboard`` extra)."""
    importance = pytest.importorskip("optuna_dashboard._importance", reason="optuna-dashboard is not installed")
    from optuna_dashboard._inmemory_cache import InMemoryCache

    from iaa.platform.sweeps.studies.study import dashboard_importances

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    _study(url)
    study = optuna.load_study(study_name="demo-x", storage=url)
    shown = importance.get_param_importance_from_trials_cache(InMemoryCache(), study._storage, study._study_id, 0,
                                                             study.get_trials(deepcopy=False))
    assert dashboard_importances(study) == pytest.approx({row["name"]: row["importance"] for row in shown})


@pytest.mark.parametrize("recorded, shown", [(None, "tpe"), ("grid", "grid")])
def test_the_report_names_the_sampler_of_the_sweep_and_tpe_for_an_older_record(tmp_path: Path, recorded, shown) -> None:
    from iaa.jobs.reports import sweep_report
    from iaa.jobs.sweeps import record

    workdir = tmp_path / "work"
    path = record.sweep_file(workdir, "old")
    path.parent.mkdir(parents=True)
    record.write(path, record.SweepRecord(name="old", optuna=record.Study("sqlite:///x.db", "old"), sampler=recorded))
    def analyze(storage: str, study: str, folder: Path, spans=()) -> StudyAnalysis:
        return _analysis_of(study, ())
    result = sweep_report.run("old", workdir, analyze, open_tracker=lambda uri: None)
    assert result.sampler == shown
    first = sweep_report.describe(result).splitlines()[0]
    assert first == f"sweep old: 0 trials in study old, proposed by the {shown} sampler"


def test_the_report_reads_asha_s_first_comparison_at_the_grace_period_the_sweep_recorded(tmp_path: Path) -> None:
    from iaa.jobs.reports import sweep_report
    from iaa.jobs.sweeps import record

    workdir = tmp_path / "work"
    path = record.sweep_file(workdir, "s")
    path.parent.mkdir(parents=True)
    record.write(path, record.SweepRecord(name="s", optuna=record.Study("sqlite:///x.db", "s"),
                                          asha=record.Asha(grace_period=2, reduction_factor=2.0)))
    trials = tuple(StudyTrial(number=n, name=f"trial-{n:04d}", state="COMPLETE", params={}, value=0.5,
                              intermediate_values={1: 0.1 * n, 2: 0.2 * n, 3: 0.3 * n}) for n in (1, 2, 3))
    result = sweep_report.run("s", workdir, lambda storage, study, folder, spans: _analysis_of(study, trials),
                              open_tracker=lambda uri: None)
    assert result.first_comparison == {"check": 2, "compared": 3, "stopped": 0, "went_on": 3, "spearman": 1.0}


def test_the_history_gives_the_best_so_far_as_the_trials_ended(tmp_path: Path) -> None:
    """Trials end out of their order (three ran at once): the best so far follows their ends, a
    stopped trial counting with its best check; a trial still running is not in it."""
    from datetime import datetime, timedelta

    from optuna.distributions import CategoricalDistribution
    from optuna.trial import FrozenTrial, TrialState

    from iaa.platform.sweeps.studies.study import analyze

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="h", storage=url, direction="maximize")
    t0 = datetime(2026, 1, 1, 12, 0, 0)
    dists = {"model.steps": CategoricalDistribution([1, 2, 3])}
    # (steps, state, value, checks, start and end in minutes)
    for steps, state, value, checks, start, end in (
            (1, TrialState.COMPLETE, 0.5, {1: 0.4, 2: 0.5}, 0, 60),
            (2, TrialState.PRUNED, None, {1: 0.7, 2: 0.6}, 0, 30),
            (3, TrialState.COMPLETE, 0.8, {1: 0.7, 2: 0.8}, 0, 90),
            (1, TrialState.PRUNED, None, {1: 0.65}, 30, 45),               # stopped by the time budget
            (2, TrialState.RUNNING, None, {1: 0.99}, 60, None)):
        cut = {"stopped_by": "time-budget"} if (state, start) == (TrialState.PRUNED, 30) else {}
        study.add_trial(FrozenTrial(number=0, trial_id=0, state=state, value=value, params={"model.steps": steps},
                                    distributions=dists, user_attrs=cut, system_attrs={}, intermediate_values=checks,
                                    datetime_start=t0 + timedelta(minutes=start),
                                    datetime_complete=None if end is None else t0 + timedelta(minutes=end)))
    result = analyze(url, "h", tmp_path / "report")
    assert [(p.number, p.hours, p.value, p.best) for p in result.history] == [
        (1, 0.5, 0.7, 0.7), (3, 0.75, 0.65, 0.7), (0, 1.0, 0.5, 0.7), (2, 1.5, 0.8, 0.8)]
    assert [p.cut for p in result.history] == [False, True, False, False]     # drawn as a square
    assert Path(result.figures["history"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    from _faults import assert_says
    from iaa.jobs.reports.sweep_report import describe, from_analysis

    assert_says(describe(from_analysis(result, sweep="s")), "best trial (trial-0002, valid_acc 0.8000) ended 1h30m",
                "the last one at 1h30m")


def test_the_history_leaves_out_the_time_a_sweep_stood_stopped(tmp_path: Path) -> None:
    """A sweep ran 40 minutes, stood stopped 10 hours, and was resumed for an hour: its trials'
    ends count the time it ran (its runs' spans), not the night between; where a trial ended
    outside every recorded run (a run killed before it could record itself), the history keeps
    to the wall clock, and says so."""
    from datetime import datetime, timedelta

    from optuna.distributions import CategoricalDistribution
    from optuna.trial import FrozenTrial, TrialState

    from iaa.jobs.reports.sweep_report import describe, from_analysis
    from iaa.platform.sweeps.studies.study import analyze

    t0 = datetime(2026, 1, 1, 12, 0, 0)
    resumed = t0 + timedelta(hours=10, minutes=40)
    spans = ((t0.timestamp(), 40 * 60.0), (resumed.timestamp(), 60 * 60.0))
    dists = {"model.steps": CategoricalDistribution([1, 2, 3])}

    def study(url: str, trials) -> None:
        made = optuna.create_study(study_name="p", storage=url, direction="maximize")
        for steps, value, start, end in trials:
            made.add_trial(FrozenTrial(number=0, trial_id=0, state=TrialState.COMPLETE, value=value,
                                       params={"model.steps": steps}, distributions=dists, user_attrs={},
                                       system_attrs={}, intermediate_values={1: value}, datetime_start=start,
                                       datetime_complete=end))

    ran = [(1, 0.5, t0, t0 + timedelta(minutes=30)),                               # in the first run
           (2, 0.6, resumed, resumed + timedelta(minutes=30)),                     # in the resume
           (3, 0.7, resumed + timedelta(minutes=1), resumed + timedelta(minutes=50))]
    study(f"sqlite:///{tmp_path / 'a.db'}", ran)
    result = analyze(f"sqlite:///{tmp_path / 'a.db'}", "p", tmp_path / "a", spans)
    assert [(p.hours, p.running_hours) for p in result.history] == [(0.5, 0.5), (11 + 10 / 60, 70 / 60), (11.5, 1.5)]
    assert_says(describe(from_analysis(result, sweep="s")), "best trial (trial-0002, valid_acc 0.7000) ended 1h30m",
                "the last one at 1h30m", "of the sweep's running time")

    without = analyze(f"sqlite:///{tmp_path / 'a.db'}", "p", tmp_path / "b")          # a record without spans
    assert [(p.hours, p.running_hours) for p in without.history] == [(0.5, None), (11 + 10 / 60, None), (11.5, None)]
    assert_says(describe(from_analysis(without, sweep="s")), "ended 11h30m", "by the wall clock")

    study(f"sqlite:///{tmp_path / 'c.db'}", [*ran, (1, 0.4, t0 + timedelta(hours=2), t0 + timedelta(hours=3))])
    unrecorded = analyze(f"sqlite:///{tmp_path / 'c.db'}", "p", tmp_path / "c", spans)   # ended in no run
    assert [p.running_hours for p in unrecorded.history] == [0.5, None, 70 / 60, 1.5]
    assert_says(describe(from_analysis(unrecorded, sweep="s")), "ended 11h30m", "by the wall clock")


def _recorded_sweep(workdir: Path, name: str, trials: int, failed: int = 0):
    """A sweep record of ``trials`` trials (the last ``failed`` of them ERROR), searching lr and steps."""
    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.ports import TrialRecord
    from iaa.jobs.sweeps import record

    rows = tuple(TrialRecord(trial_id=f"id{i}", config=JobConfig(dataset="demo"), name=f"trial-{i:04d}",
                             best_valid_acc=None if i >= trials - failed else 0.5 + 0.1 * i,
                             status="ERROR" if i >= trials - failed else "TERMINATED", checks=2)
                 for i in range(trials))
    space = {"params": {"train.lr": {"choices": [0.002, 0.004]}, "model.steps": {"choices": [2, 3]}}}
    path = record.sweep_file(workdir, name)
    path.parent.mkdir(parents=True)
    record.write(path, record.SweepRecord(name=name, optuna=record.Study("sqlite:///x.db", name), trials=rows,
                                          num_samples=trials, search_space=space, sampler="tpe"))


def _analysis_of(study: str, trials: tuple[StudyTrial, ...], **fields) -> StudyAnalysis:
    """The analysis of a study of ``trials`` that drew nothing, but for ``fields``."""
    return StudyAnalysis(**{"study": study, "storage": "sqlite:///x.db", "importances": {},
                            "importance_evaluator": "fANOVA", "dashboard_importances": {}, "scored_trials": 0,
                            "complete_trials": 0, "best": None, "history": (), "carried_trials": 0,
                            "carried_best": None, "trials": trials, "figures": {}, **fields})


def _analysis(states: list[str]):
    """An analyzer of a study whose trials ended in ``states``: it draws only what it can."""
    trials = tuple(StudyTrial(number=n, name=f"trial-{n:04d}", state=state, value=0.5 if state == "COMPLETE" else None,
                              params={"train.lr": 0.002 * (1 + n % 2), "model.steps": 2 + n % 2},
                              intermediate_values={1: 0.4, 2: 0.5} if state == "COMPLETE" else {1: 0.3})
                   for n, state in enumerate(states))
    scored = sum(state in ("COMPLETE", "PRUNED") for state in states)

    def analyze(storage: str, study: str, folder: Path, spans=()) -> StudyAnalysis:
        drawn = ("intermediate_values", "history") + (("importances", "parallel_coordinates") if scored >= 2 else ())
        return _analysis_of(study, trials, scored_trials=scored, complete_trials=scored,
                            dashboard_importances={"train.lr": 0.5, "model.steps": 0.5} if scored >= 2 else {},
                            figures={name: folder / f"{name}.png" for name in drawn},
                            importances={"train.lr": 0.7, "model.steps": 0.3} if scored >= 2 else {})
    return analyze


def test_a_resumed_sweep_counts_its_own_trials_and_the_attempts_its_stop_ended(tmp_path: Path) -> None:
    """Stopped with two trials unfinished (FAIL in the study), then resumed: the study holds 6
    trials, the sweep 4."""
    from iaa.jobs.reports import sweep_report

    workdir = tmp_path / "work"
    _recorded_sweep(workdir, "s1", trials=4)
    states = ["COMPLETE", "FAIL", "FAIL", "COMPLETE", "COMPLETE", "COMPLETE"]
    result = sweep_report.run("s1", workdir, _analysis(states), open_tracker=lambda uri: None)

    assert (result.sweep_trials, result.stopped_attempts, len(result.trials)) == (4, 2, 6)
    assert (result.fields()["sweep_trials"], result.fields()["stopped_attempts"]) == (4, 2)
    first = sweep_report.describe(result).splitlines()[0]
    assert_says(first, "sweep s1: 4 trials", "tpe sampler", "study s1 holds 6", "2 of them", "FAIL", "stopped",
                "resume")


def test_a_failed_trial_of_the_sweep_is_no_stopped_attempt(tmp_path: Path) -> None:
    """A trial that ended ERROR is FAIL in the study and one of the sweep's trials: the counts agree."""
    from iaa.jobs.reports import sweep_report

    workdir = tmp_path / "work"
    _recorded_sweep(workdir, "s2", trials=3, failed=1)
    result = sweep_report.run("s2", workdir, _analysis(["COMPLETE", "COMPLETE", "FAIL"]), open_tracker=lambda uri: None)

    assert (result.sweep_trials, result.stopped_attempts) == (3, 0)
    assert sweep_report.describe(result).splitlines()[0] == "sweep s2: 3 trials in study s2, proposed by the tpe sampler"


def test_one_scored_trial_draws_what_it_can_and_warns_of_the_importances_only(tmp_path: Path) -> None:
    from iaa.jobs.reports import sweep_report

    workdir = tmp_path / "work"
    _recorded_sweep(workdir, "one", trials=1)
    result = sweep_report.run("one", workdir, _analysis(["COMPLETE"]), open_tracker=lambda uri: None)

    assert result.importances == {} and set(result.figures) == {"intermediate_values", "history"}
    [warning] = result.warnings                          # not a "never varied" line per parameter
    assert_says(warning, "1 scored trial(s)", "importances", "2 or more", "checks per trial")
    text = sweep_report.describe(result)
    assert "parameter importance (fANOVA" not in text and "optuna-dashboard shows" not in text
    assert_says(text, "intermediate_values:", "history:")
    assert "scored trial(s)" not in text                         # warnings go to the console, as every command's


def test_a_trial_a_resume_continued_keeps_its_name_in_the_report(tmp_path: Path) -> None:
    """A stop ends trial 0 FAIL; its resume asks it again as trial 1 of the study, with the name
    the console, its MLflow run and sweep.json give it (``trial-0000``): the report uses that name."""
    from datetime import datetime, timedelta

    from optuna.distributions import CategoricalDistribution
    from optuna.trial import FrozenTrial, TrialState

    from _faults import assert_says
    from iaa.jobs.reports.sweep_report import describe, from_analysis
    from iaa.platform.sweeps.studies.study import analyze

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="r", storage=url, direction="maximize")
    t0, dists = datetime(2026, 1, 1, 12, 0, 0), {"model.steps": CategoricalDistribution([1, 2])}
    for state, value, attrs, end in ((TrialState.FAIL, None, {"trial_name": "trial-0000"}, 10),
                                     (TrialState.COMPLETE, 0.6, {"trial_name": "trial-0000", "continues_trial": 0}, 40)):
        study.add_trial(FrozenTrial(number=0, trial_id=0, state=state, value=value, params={"model.steps": 2},
                                    distributions=dists, user_attrs=attrs, system_attrs={}, intermediate_values={1: 0.6},
                                    datetime_start=t0, datetime_complete=t0 + timedelta(minutes=end)))
    result = analyze(url, "r", tmp_path / "report")
    assert [p.name for p in result.history] == ["trial-0000"]
    assert [t.name for t in result.trials] == ["trial-0000", "trial-0000"]
    assert_says(describe(from_analysis(result, sweep="r")), "best trial (trial-0000, valid_acc 0.6000)")


@pytest.mark.parametrize("states", [("COMPLETE", "FAIL"), ("FAIL",), ()], ids=["one-scored", "none-scored", "empty"])
def test_a_study_of_under_two_scored_trials_draws_the_checks_and_history_without_importances(tmp_path: Path,
                                                                                              states) -> None:
    """A sweep stopped after its first trial: no importances, and the rest of the report is written."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from _faults import invoke
    from iaa.jobs.sweeps import record
    from iaa.platform.sweeps.studies.study import analyze

    workdir = tmp_path / "work"
    url = f"sqlite:///{workdir / 'optuna.db'}"
    _recorded_sweep(workdir, "s1", trials=1)
    study = optuna.create_study(study_name="s1", storage=url, direction="maximize")
    dists = {"train.lr": CategoricalDistribution([0.002, 0.004])}
    for state in states:
        done = state == "COMPLETE"
        study.add_trial(create_trial(params={"train.lr": 0.002}, distributions=dists, state=TrialState[state],
                                     intermediate_values={1: 0.4, 2: 0.55} if done else {1: 0.3},
                                     value=0.55 if done else None))
    path = record.sweep_file(workdir, "s1")
    record.write(path, dataclasses.replace(record.read(path), optuna=record.Study(url, "s1")))

    result = analyze(url, "s1", tmp_path / "report")
    assert result.importances == {} and set(result.figures) == {"intermediate_values", "history"}
    assert result.scored_trials == states.count("COMPLETE")
    for figure in result.figures.values():
        assert Path(figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (tmp_path / "report" / "importances.png").exists()

    code, output = invoke("report", "--sweep", "s1", "--workdir", workdir)
    assert code == 0, output
    assert_says(output, f"{states.count('COMPLETE')} scored trial(s)", "2 or more", "intermediate_values:")
    assert output.count("scored trial(s)") == 1                     # each warning once, on stderr
    code, output = invoke("report", "--sweep", "s1", "--workdir", workdir, "--json")
    assert code == 0 and output.count("scored trial(s)") == 2       # on stderr, and in the JSON's warnings
    assert (workdir / "sweeps" / "s1" / "report" / "intermediate_values.png").is_file()
