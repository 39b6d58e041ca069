"""A sweep's time budget (``tune --time-budget``) without Ray: the flag, the request and the
record, the sweep's clock, the trials it stops and what the cost, the console and the report
say of them. The sweep job on fakes that spends its budget is in test_jobs_in_process.py, the
real sweep in test_platform_sweep.py."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import click
import pytest

from _faults import assert_says
from fakes import FakeTracker

pytestmark = pytest.mark.timeout(300)


# --- the flag, the request, the record -----------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [("90m", 5400), ("2h", 7200), ("1h30m", 5400), ("1.5d", 129600),
                                           ("45s", 45), ("45", 45), (" 2H ", 7200), ("0.5h", 1800)])
def test_a_time_budget_is_read_in_days_hours_minutes_and_seconds(text: str, seconds: float) -> None:
    from iaa.cli.options import Duration

    assert Duration().convert(text, None, None) == seconds


@pytest.mark.parametrize("text, phrase", [("2 hours", "not a length of time"), ("1h30", "not a length of time"),
                                          ("-5m", "not a length of time"), ("0", "above 0"), ("0m", "above 0"),
                                          ("nan", "above 0"), ("inf", "above 0")])
def test_a_bad_time_budget_is_refused_saying_what_a_duration_looks_like(text: str, phrase: str) -> None:
    from iaa.cli.options import Duration

    with pytest.raises(click.BadParameter) as err:
        Duration().convert(text, None, None)
    assert_says(err.value.message, phrase, repr(text))


def test_the_request_refuses_a_budget_of_no_time() -> None:
    from iaa.jobs.config.job_config import ConfigError
    from iaa.jobs.tune.request import TuneRequest

    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError) as err:
            TuneRequest(dataset="demo", time_budget_s=bad)
        assert_says(err.value, "time_budget_s", "above 0")


def fake_tune_trial(trial_id: str, stop_reason: str = "asha", checks: int = 2, status: str = "TERMINATED"):
    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.ports import TrialRecord

    return TrialRecord(trial_id=trial_id, config=JobConfig(dataset="demo"), best_valid_acc=0.5 if checks else None,
                       status=status, checks=checks, stop_reason=stop_reason, name=f"trial-{trial_id}")


def test_a_sweep_whose_budget_stopped_a_trial_is_finished_and_its_record_keeps_the_budget(tmp_path: Path) -> None:
    from iaa.jobs.ports import TIME_BUDGET
    from iaa.jobs.sweeps import record

    running = record.SweepRecord(name="s", num_samples=10, time_budget_s=90.0,
                                 trials=(fake_tune_trial("a"), fake_tune_trial("b", "", status="RUNNING")))
    assert not running.finished and not running.budget_spent
    spent = replace(running, trials=(fake_tune_trial("a"), fake_tune_trial("b", TIME_BUDGET), fake_tune_trial("c", TIME_BUDGET, checks=0)))
    assert spent.finished and spent.budget_spent, "2 of 10 trials begun, but the budget ended the sweep"
    assert [t.cut for t in spent.trials] == [False, True, True]
    path = tmp_path / "sweep.json"
    record.write(path, spent)
    assert json.loads(path.read_text())["time_budget_s"] == 90.0 and record.read(path).time_budget_s == 90.0
    assert "cut" in record.table(spent.trials, []).splitlines()[2]


def test_the_sweep_table_gives_each_trials_time_and_the_record_keeps_it(tmp_path: Path) -> None:
    from iaa.jobs.sweeps import record
    from iaa.jobs.workdir.fields import RecordError

    timed = replace(fake_tune_trial("a"), seconds=125.4)
    sweep = record.SweepRecord(name="s", num_samples=2, trials=(timed, fake_tune_trial("b", checks=0)))
    path = tmp_path / "sweep.json"
    record.write(path, sweep)
    assert json.loads(path.read_text())["trials"][0]["seconds"] == 125.4
    assert record.read(path).trials == sweep.trials
    head, first, second = record.table(record.read(path).trials, []).splitlines()
    assert head.split()[5] == "time" and first.split()[5] == "2m05s" and second.split()[5] == "-"
    path.write_text(path.read_text().replace("125.4", '"2 min"'))
    with pytest.raises(RecordError) as err:
        record.read(path)
    assert_says(err.value, str(path), "trials[0].seconds")


@pytest.mark.parametrize("value", [0, -5, "1h", True])
def test_a_record_with_a_bad_budget_is_refused_naming_the_key(tmp_path: Path, value: object) -> None:
    from iaa.jobs.sweeps import record
    from iaa.jobs.workdir.fields import RecordError

    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"name": "s", "trials": [], "time_budget_s": value}), encoding="utf-8")
    with pytest.raises(RecordError) as err:
        record.read(path)
    assert_says(err.value, str(path), "time_budget_s", "seconds above 0")


# --- the clock ------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _side(budget_s: float | None):
    from iaa.platform.sweeps import driver_side

    return driver_side.DriverSide(tracker=FakeTracker(), experiment="e", parent_run_id=None, dataset="demo",
                                  spec=None, budget=driver_side.TimeBudget(total_s=budget_s))  # type: ignore[arg-type]


def test_the_sweep_clock_ends_the_run_at_the_budget_and_comes_back_with_what_was_spent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from iaa.platform.sweeps import budget, driver_side

    clock = _Clock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))
    stopper = budget.SweepClock("s")
    side = _side(30.0)
    with driver_side.bound("s", side):
        assert not stopper.stop_all()                  # the first step starts the clock
        clock.now += 20
        assert not stopper.stop_all() and stopper.spent_s == 20 and not side.budget.ended
        saved = pickle.dumps(stopper)                  # as Tune saves its experiment state
        clock.now += 10
        assert stopper.stop_all() and side.budget.ended and stopper("t", {}) is False

    clock.now += 3600                                  # the process died; another resumes later
    restored = pickle.loads(saved)
    assert restored.spent_s == 20
    again = _side(25.0)                                # a resume may give another total
    with driver_side.bound("s", again):
        assert not restored.stop_all(), "the time between the processes does not count"
        clock.now += 4
        assert not restored.stop_all() and restored.spent_s == 24 and not again.budget.ended
        clock.now += 1
        assert restored.stop_all() and again.budget.ended


def test_the_sweep_clock_never_stops_a_sweep_without_a_budget_or_a_process_that_runs_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from iaa.platform.sweeps import budget, driver_side

    clock = _Clock()
    monkeypatch.setattr(budget, "time", SimpleNamespace(monotonic=clock))
    stopper = budget.SweepClock("s")
    for _ in range(3):
        clock.now += 1e6
        assert not stopper.stop_all()
    with driver_side.bound("s", _side(None)) as side:
        clock.now += 1e6
        assert not stopper.stop_all() and stopper.spent_s == 3e6 and not side.budget.ended


# --- the trials it stops ------------------------------------------------------------------------


def _tune_trial(trial_id: str, status: str, last_result: dict | None = None):
    return SimpleNamespace(trial_id=trial_id, status=status, last_result=last_result or {}, config={"x": 1},
                           pickled_error_file=None, error_file=None)


def test_the_trials_the_budget_stopped_end_their_runs_and_those_that_ended_before_are_left(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Tune tells no callback of the trials it stops at the budget: the runs' callback finds them
    (unfinished at the last step, or never started) and ends their runs, with the stop reason of
    the budget or the one a trial had just reported; the console says which were cut; a trial
    whose end Tune told, in this process or an earlier one, keeps it."""
    from iaa.jobs.ports import TIME_BUDGET
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.trials.trial_runs import ConsoleCallback, TrialRuns

    ended: list[tuple[str, str, str]] = []
    told: list[tuple[str, str]] = []
    monkeypatch.setattr(TrialRuns, "_end", lambda self, trial, status, reason="": (
        self._ended.add(trial.trial_id), ended.append((trial.trial_id, status, reason))))
    console = SimpleNamespace(tick=lambda: None, trial_ended=lambda name, reason, error=None: told.append((name, reason)))
    monkeypatch.setattr(ConsoleCallback, "console", property(lambda self: console))
    side = _side(10.0)
    runs, shown = TrialRuns("s"), ConsoleCallback("s")
    shown._nodes = SimpleNamespace(tell=lambda *a, **k: None)
    earlier = _tune_trial("earlier", "TERMINATED", {"checks": 4, "stop_reason": "max-epochs"})  # restored, done
    done = _tune_trial("done", "RUNNING", {"checks": 2})
    cut = _tune_trial("cut", "RUNNING", {"checks": 3})
    last = _tune_trial("last", "RUNNING", {"checks": 5})
    waiting = _tune_trial("waiting", "PENDING", {"trial_id": "waiting"})   # Tune's default last result
    sudden = _tune_trial("sudden", "RUNNING", {"trial_id": "sudden", "pid": 7})   # made and started in the last step
    trials = [earlier, done, cut, last, waiting]
    with driver_side.bound("s", side):
        for trial in (done, cut, last):
            runs._runs[trial.trial_id] = object()      # their runs are open
            side.names[trial.trial_id] = f"name-{trial.trial_id}"
        runs.on_step_end(1, trials)
        shown.on_step_end(1, trials)
        done.status = "TERMINATED"
        runs.on_trial_complete(2, trials, done)        # ASHA stopped it: Tune told
        last.last_result = {"checks": 6, "stop_reason": "max-epochs", "best_valid_acc": 0.5}   # its own end, untold
        side.budget.ended = True                       # the budget is spent: Tune stops the rest, untold
        trials.append(sudden)
        runs._runs["sudden"] = object()
        cut.status = last.status = waiting.status = sudden.status = "TERMINATED"
        runs.on_step_end(2, trials)
        shown.on_step_end(2, trials)
        runs.on_step_end(3, trials)                    # told once
        shown.on_step_end(3, trials)

    assert set(side.budget.untold) == {"cut", "last", "waiting", "sudden"}
    assert side.budget.cut == {"cut", "waiting", "sudden"}
    assert ended == [("done", "FINISHED", ""), ("cut", "FINISHED", TIME_BUDGET), ("last", "FINISHED", "max-epochs"),
                     ("sudden", "FINISHED", TIME_BUDGET)]
    assert told == [("name-cut", TIME_BUDGET)], "a trial never started has no run and no line"


def test_records_give_the_trials_the_budget_stopped_its_stop_reason(tmp_path: Path) -> None:
    from iaa.jobs.ports import TIME_BUDGET
    from iaa.platform.sweeps.trials.trial import TrialSpec, records

    def result(trial_id: str, **metrics: object):
        return SimpleNamespace(metrics={"trial_id": trial_id, **metrics}, path=f"/runs/{trial_id}", error=None,
                               config={"model.steps": 1}, best_checkpoints=[])

    spec = TrialSpec(name="s", fit=lambda *a, **k: None, storage_path=str(tmp_path), workers=1, threads=1,
                     base={"dataset": "cbt-ne"})
    never = SimpleNamespace(metrics={"trial_id": "a", "pid": 7}, path="/runs/e", error=None,   # a reused actor's
                            config={"model.steps": 1}, best_checkpoints=[])                    # default result
    found = records([result("a", checks=3), result("b", checks=3), result("c", checks=0),
                     result("d", checks=5, stop_reason="max-epochs"), never], spec,
                    statuses={}, run_ids={}, tagged={}, downloads=tmp_path, cut={"b", "c", "d", "e"})
    assert [r.trial_id for r in found] == ["a", "b", "c", "d", "e"], "a trial that never ran is named by its folder"
    assert [r.stop_reason for r in found] == ["asha", TIME_BUDGET, TIME_BUDGET, "max-epochs", TIME_BUDGET]
    assert [r.cut for r in found] == [False, True, True, False, True], "a trial that ended by itself keeps its reason"


def test_the_optuna_trials_the_budget_stopped_end_pruned_at_their_last_check(tmp_path: Path) -> None:
    import optuna

    from iaa.platform.sweeps.studies.endings import end_untold

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    stopped = study.ask()
    stopped.set_user_attr("tune_trial_id", "a")
    study.tell(stopped, state=optuna.trial.TrialState.FAIL)      # a stop, then a resume continued it
    checked, unchecked, own_end, other = study.ask(), study.ask(), study.ask(), study.ask()
    for trial, tune_id in ((checked, "a"), (unchecked, "b"), (own_end, "c"), (other, "d")):
        trial.set_user_attr("tune_trial_id", tune_id)
    checked.report(0.3, 1)
    checked.report(0.4, 2)
    own_end.report(0.7, 1)
    other.report(0.9, 1)
    assert end_untold(storage, "s", {"a": None, "b": None, "c": 0.8}, {"stopped_by": "time-budget"}) == 3
    trials = {t.number: t for t in optuna.load_study(study_name="s", storage=storage).trials}
    assert trials[checked.number].state.name == "PRUNED" and trials[checked.number].value == 0.4
    assert trials[unchecked.number].state.name == "FAIL"
    assert trials[own_end.number].state.name == "COMPLETE" and trials[own_end.number].value == 0.8
    assert trials[checked.number].user_attrs["stopped_by"] == "time-budget"
    assert "stopped_by" not in trials[own_end.number].user_attrs
    assert trials[other.number].state.name == "RUNNING", "a trial it did not stop is left to its sweep"
    assert trials[stopped.number].state.name == "FAIL" and "stopped_by" not in trials[stopped.number].user_attrs
    assert end_untold(storage, "missing", {"a": None}, {}) == 0 and end_untold(storage, "s", {}, {}) == 0


def test_a_trial_a_resume_continued_and_the_budget_stopped_ends_pruned_in_the_study(tmp_path: Path) -> None:
    """A resumed sweep's trial continues from its checkpoint as a new Optuna trial, asked in no
    process: once the budget stops it, that trial too ends PRUNED at its last check."""
    import optuna

    from iaa.jobs.config import search_space
    from iaa.jobs.config.job_config import JobConfig
    from iaa.platform.sweeps import driver_side, launch
    from iaa.platform.sweeps.search import search_algorithm as search
    from tests._study import bound_study, stopped_and_resumed

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    with bound_study(url, "s"):
        first = search.searcher(space, seed=0, sweep="s")
        first.suggest("a")
        first.on_trial_result("a", {"valid_acc": 0.4, "best_valid_acc": 0.4, "checks": 1})
        first.save(str(tmp_path / "searcher.json"))
        resumed = stopped_and_resumed(url, "s", space, tmp_path / "searcher.json")
        resumed.on_trial_result("a", {"valid_acc": 0.5, "best_valid_acc": 0.5, "checks": 2})
        side = driver_side.of("s")
        side.budget.untold["a"] = {"checks": 2, "valid_acc": 0.5}
        launch._end_untold_trials(SimpleNamespace(study_storage=url, study_name="s"), side)
    stopped, continued = optuna.load_study(study_name="s", storage=url).trials
    assert stopped.state.name == "FAIL" and continued.state.name == "PRUNED" and continued.value == 0.5
    assert continued.user_attrs["stopped_by"] == "time-budget"


# --- what the sweep makes of them ---------------------------------------------------------------


def test_the_cost_and_the_console_say_when_the_budget_ends_the_sweep() -> None:
    from iaa.jobs.ports import TIME_BUDGET
    from iaa.jobs.sweeps.console import SweepConsole
    from iaa.jobs.sweeps.cost import SweepCost

    cost = SweepCost(trials=8, epochs=2, examples=1000, examples_per_s=10, concurrency=2, gpus=False, budget_s=600)
    assert_says(cost.describe(), "time budget stops the trials after 10m00s")
    assert_says(replace(cost, budget_s=3600 * 10).describe(), "within its time budget of 10h00m")
    assert_says(replace(cost, examples_per_s=0, gpus=True).describe(), "time budget stops the trials after 10m00s")
    assert "budget" not in replace(cost, budget_s=None).describe()

    clock = _Clock()
    lines: list[str] = []
    console = SweepConsole(cost, ["x"], say=lines.append, clock=clock)
    console.trial_started("trial-0000", {"x": 1})
    clock.now += 100
    console.trial_checked("trial-0000", {"checks": 1, "epoch": 0.5, "valid_acc": 0.3})
    assert_says(lines[-1], "its time budget ends it at about 10m00s")
    assert console.left_s() == pytest.approx(500)
    console.trial_ended("trial-0000", TIME_BUDGET)
    assert_says(lines[-1], "trial-0000 stopped by the time budget after 1 check")


def test_the_report_tells_the_trials_the_budget_stopped_from_those_asha_stopped(tmp_path: Path) -> None:
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from iaa.platform.sweeps.studies.study import analyze

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    space = {"h": CategoricalDistribution([8, 12])}
    for h, state, attrs in ((8, TrialState.COMPLETE, {}), (12, TrialState.PRUNED, {}),
                            (8, TrialState.PRUNED, {"stopped_by": "time-budget"})):
        study.add_trial(create_trial(params={"h": h}, distributions=space, state=state, user_attrs=attrs,
                                     value=0.5 if state == TrialState.COMPLETE else None,
                                     intermediate_values={1: 0.2, 2: 0.3}))
    trials = analyze(storage, "s", tmp_path / "figures").trials
    assert [(t.stopped_by_asha, t.stopped_by_time_budget) for t in trials] == [
        (False, False), (True, False), (False, True)]
