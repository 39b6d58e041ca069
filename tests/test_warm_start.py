"""A sweep that begins with an earlier sweep's trials (``tune --warm-start``) without Ray: what is
carried into a real Optuna study and what is left out, the sampler that then never repeats them,
the settling of the request, the sweep job on fakes, the record and the report. The real sweep
is in test_platform_sweep.py; what a warm start buys the search is measured by
benchmarks/bench_warm_start.py."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from _faults import assert_says, logged
from _platform import TINY_SPACE
from _tiny import TINY_SETS, make_tiny_prepared
from fakes import FakeLauncher, FakeTracker, fake_sweeper

pytestmark = pytest.mark.timeout(300)

SPACE = {"train.lr": [0.002, 0.004], "model.steps": [2, 3]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _dists(space: dict[str, list]) -> dict:
    from optuna.distributions import CategoricalDistribution

    return {name: CategoricalDistribution(values) for name, values in space.items()}


def _warm(**more):
    from iaa.jobs.ports import WarmStart

    return WarmStart(**{"sweep": "earlier", "study_storage": "", "study_name": "earlier", "filled": {}, "fixed": {},
                        **more})


def _source(trials: list[tuple]) -> "object":
    """An in-memory study of ``(state, params, value, checks)`` trials over their own values."""
    import optuna
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import create_trial

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study = optuna.create_study(direction="maximize")
    start = datetime(2026, 1, 2, 3, 4, 5)
    for i, (state, params, value, checks) in enumerate(trials):
        trial = create_trial(state=state, params=params, value=value, intermediate_values=checks,
                             distributions={k: CategoricalDistribution([v]) for k, v in params.items()},
                             user_attrs={"tune_trial_id": f"t{i}"})
        trial.datetime_start = start + timedelta(minutes=i)
        trial.datetime_complete = start + timedelta(minutes=i + 1) if state.is_finished() else None
        study.add_trial(trial)
    return study


# --- what is carried ------------------------------------------------------------------------------


def test_the_scored_trials_that_lie_in_the_space_are_carried_with_their_checks_and_times() -> None:
    import optuna
    from optuna.trial import TrialState

    from iaa.platform.sweeps.studies.carried_trials import carry

    source = _source([
        (TrialState.COMPLETE, {"train.lr": 0.004, "model.steps": 3}, 0.9, {1: 0.5, 2: 0.9}),
        (TrialState.PRUNED, {"train.lr": 0.002, "model.steps": 2}, None, {1: 0.3}),
        (TrialState.COMPLETE, {"train.lr": 0.008, "model.steps": 2}, 0.95, {1: 0.95}),     # lr outside
        (TrialState.FAIL, {"train.lr": 0.004, "model.steps": 2}, None, {1: 0.4}),
        (TrialState.PRUNED, {"train.lr": 0.002, "model.steps": 3}, None, {}),               # no check
        (TrialState.RUNNING, {"train.lr": 0.004, "model.steps": 2}, None, {1: 0.6}),
    ])
    target = optuna.create_study(direction="maximize")

    carried = carry(source, target, _dists(SPACE), _warm())

    assert carried.sweep == "earlier" and carried.trials == 2 and carried.best == pytest.approx(0.9)
    assert sum(carried.left_out.values()) == 4
    reasons = " | ".join(f"{k}: {v}" for k, v in carried.left_out.items())
    assert_says(reasons, "its train.lr lies outside this search space: 1", "it ended FAIL: 1",
                "it made no check: 1", "it had not ended: 1")
    first, second = target.get_trials()
    assert (first.state, first.value, first.intermediate_values) == (TrialState.COMPLETE, 0.9, {1: 0.5, 2: 0.9})
    assert (second.state, second.intermediate_values) == (TrialState.PRUNED, {1: 0.3})
    assert first.params == {"train.lr": 0.004, "model.steps": 3} and first.distributions == _dists(SPACE)
    assert first.user_attrs["carried_from"] == "earlier" and first.user_attrs["carried_number"] == 0
    assert second.user_attrs["carried_number"] == 1 and first.user_attrs["tune_trial_id"] == "t0"
    assert first.datetime_start == datetime(2026, 1, 2, 3, 4, 5)            # when it ran, not when carried


def test_a_trial_carried_twice_keeps_the_sweep_it_ran_in_and_its_number_there() -> None:
    import optuna
    from optuna.trial import TrialState

    from iaa.platform.sweeps.studies.carried_trials import carry

    first = _source([(TrialState.COMPLETE, {"train.lr": 0.002, "model.steps": 2}, 0.5, {1: 0.5}),
                     (TrialState.COMPLETE, {"train.lr": 0.004, "model.steps": 3}, 0.9, {1: 0.9})])
    second, third = optuna.create_study(direction="maximize"), optuna.create_study(direction="maximize")
    carry(first, second, _dists(SPACE), _warm(sweep="first"))
    second.enqueue_trial({"train.lr": 0.004, "model.steps": 2})
    trial = second.ask(fixed_distributions=_dists(SPACE))
    second.tell(trial, 0.7)

    carried = carry(second, third, _dists(SPACE), _warm(sweep="second"))

    assert carried.trials == 3 and carried.best == pytest.approx(0.9)
    assert [(t.user_attrs["carried_from"], t.user_attrs["carried_number"]) for t in third.trials] == [
        ("first", 0), ("first", 1), ("second", 2)]


def test_a_parameter_one_sweep_searched_and_the_other_fixed_carries_only_where_it_agrees() -> None:
    import optuna
    from optuna.trial import TrialState

    from iaa.platform.sweeps.studies.carried_trials import carry

    # the earlier sweep searched train.lr and model.hidden_dim with model.steps fixed at 3; this one
    # searches train.lr and model.steps with model.hidden_dim fixed at 64
    source = _source([(TrialState.COMPLETE, {"train.lr": 0.004, "model.hidden_dim": 64}, 0.8, {1: 0.8}),
                      (TrialState.COMPLETE, {"train.lr": 0.002, "model.hidden_dim": 32}, 0.7, {1: 0.7})])
    target = optuna.create_study(direction="maximize")

    carried = carry(source, target, _dists(SPACE), _warm(filled={"model.steps": 3}, fixed={"model.hidden_dim": 64}))

    assert carried.trials == 1
    assert_says(next(iter(carried.left_out)), "model.hidden_dim", "64")
    [trial] = target.get_trials()
    assert trial.params == {"train.lr": 0.004, "model.steps": 3}          # steps: the value it ran with

    lost = carry(source, optuna.create_study(direction="maximize"), _dists(SPACE), _warm())
    assert lost.trials == 0 and "it has no value of model.steps" in lost.left_out


def test_a_warm_started_study_never_proposes_a_carried_configuration_again() -> None:
    import optuna
    from optuna.trial import TrialState

    from iaa.jobs.config.search_space import parse
    from iaa.jobs.config.job_config import JobConfig
    from iaa.platform.sweeps.search.search_algorithm import build_sampler, to_optuna
    from iaa.platform.sweeps.studies.carried_trials import carry

    space = parse({"train.lr": [0.001, 0.002, 0.004], "model.steps": [1, 2, 3], "model.hidden_dim": [32, 64]},
                  JobConfig())
    earlier = optuna.create_study(direction="maximize", sampler=build_sampler(space, seed=0))
    for _ in range(12):
        trial = earlier.ask(fixed_distributions=to_optuna(space))
        earlier.tell(trial, trial.params["train.lr"] * 100 + trial.params["model.steps"])
    taken = {json.dumps(t.params, sort_keys=True) for t in earlier.trials}
    assert len(taken) == 12

    study = optuna.create_study(direction="maximize", sampler=build_sampler(space, seed=0))
    assert carry(earlier, study, to_optuna(space), _warm()).trials == 12
    proposed = []
    for _ in range(6):                                   # the 6 configurations of 18 left
        trial = study.ask(fixed_distributions=to_optuna(space))
        proposed.append(json.dumps(trial.params, sort_keys=True))
        study.tell(trial, 0.0)
    assert not set(proposed) & taken and len(set(proposed)) == 6
    assert study.trials[12].state == TrialState.COMPLETE and "carried_from" not in study.trials[12].user_attrs


def test_the_new_study_is_made_in_its_storage_and_an_existing_one_is_refused(tmp_path: Path) -> None:
    import optuna
    from optuna.trial import TrialState

    from iaa.errors import IaaError
    from iaa.platform.sweeps.studies.carried_trials import carry_into

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    source = optuna.create_study(storage=url, study_name="earlier", direction="maximize")
    for trial in _source([(TrialState.COMPLETE, {"train.lr": 0.004, "model.steps": 2}, 0.9, {1: 0.9})]).trials:
        source.add_trial(trial)
    warm = _warm(study_storage=url)

    carried = carry_into(warm, url, "later", _dists(SPACE), "maximize", "valid_acc")

    later = optuna.load_study(study_name="later", storage=url)
    assert carried.trials == 1 and len(later.trials) == 1 and later.metric_names == ["valid_acc"]
    with pytest.raises(IaaError) as err:
        carry_into(warm, url, "later", _dists(SPACE), "maximize", "valid_acc")
    assert_says(err.value, "later", "exists already")
    with pytest.raises(IaaError) as err:
        carry_into(replace(warm, study_name="gone"), url, "other", _dists(SPACE), "maximize", "valid_acc")
    assert_says(err.value, "earlier", "no Optuna study", "gone")


# --- the request, settled -------------------------------------------------------------------------


def _sweeper(tiny: Path, tmp_path: Path, tracker: FakeTracker, launcher: FakeLauncher):
    return fake_sweeper(tiny, tmp_path, tracker, launcher)


def _request(tiny: Path, tmp_path: Path, **more):
    from iaa.jobs.tune.request import TuneRequest

    space = tmp_path / "space.yaml"
    space.write_text(TINY_SPACE, encoding="utf-8")
    return TuneRequest(**{"dataset": "cbt-ne", "data": tiny, "num_samples": 2, "search_space": space,
                          "sets": TINY_SETS, "workdir": tmp_path / "work", "name": "later", "show_progress": False,
                          "warm_start": "earlier", **more})


def test_settling_finds_the_earlier_sweep_and_what_its_trials_ran_with(tiny: Path, tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    from iaa.jobs.tune.settle import settle

    _sweeper(tiny, tmp_path, FakeTracker(), FakeLauncher())("earlier")
    wider = tmp_path / "wider.yaml"
    wider.write_text("model.hidden_dim: [8, 12]\ntrain.lr: [0.001, 0.002]\n", encoding="utf-8")

    with caplog.at_level(logging.WARNING):
        plan = settle(_request(tiny, tmp_path, search_space=wider, sets=(*TINY_SETS, "train.clip=1.0")))

    warm = plan.warm_start
    assert warm is not None and warm.sweep == "earlier" and warm.study_name == "earlier"
    assert warm.study_storage.endswith("optuna.db")
    steps = plan.base.model.steps
    assert warm.filled == {"train.lr": plan.base.train.lr} and warm.fixed == {"model.steps": steps}
    [note] = logged(caplog, "WARNING", "sweep earlier ran with")
    assert_says(note, "train.clip 5 (this sweep: 1)")


def test_a_new_sweep_that_would_repeat_an_earlier_one_says_so(tiny: Path, tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    from iaa.jobs.tune.settle import settle

    _sweeper(tiny, tmp_path, FakeTracker(), FakeLauncher())("earlier", seed=3)
    assert json.loads((tmp_path / "work" / "sweeps" / "earlier" / "sweep.json").read_text())["seed"] == 3

    with caplog.at_level(logging.WARNING):
        settle(_request(tiny, tmp_path, warm_start=None, seed=3))
        [note] = logged(caplog, "WARNING", "in this work folder")
        assert_says(note, "sweep earlier", "same config, sampler and `seed`", "`warm_start` earlier")
        caplog.clear()
        settle(_request(tiny, tmp_path, warm_start=None, seed=4))                    # another seed
        settle(_request(tiny, tmp_path, warm_start=None, seed=3, sets=(*TINY_SETS, "train.clip=1.0")))
        settle(_request(tiny, tmp_path, seed=3))                                     # a warm start
        settle(_request(tiny, tmp_path, warm_start=None, seed=3, name="earlier"))    # its own name
        assert not logged(caplog, "WARNING", "in this work folder")


@pytest.mark.parametrize("more, phrases", [
    ({"sampler": "grid"}, ("grid sampler", "`sampler`")),
    ({"warm_start": "nowhere"}, ("no sweep 'nowhere'",)),
    ({"model_kind": "as-reader"}, ("the iaa model", "the as-reader model")),
])
def test_a_warm_start_that_cannot_inform_the_sweep_is_refused_in_one_line(tiny: Path, tmp_path: Path, more: dict,
                                                                        phrases: tuple) -> None:
    from iaa.errors import IaaError
    from iaa.jobs.tune.settle import settle

    _sweeper(tiny, tmp_path, FakeTracker(), FakeLauncher())("earlier")
    with pytest.raises(IaaError) as err:
        settle(_request(tiny, tmp_path, **more))
    assert_says(err.value, *phrases)


def test_a_resume_or_another_dataset_cannot_warm_start(tiny: Path, tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune.settle import settle

    sweep = _sweeper(tiny, tmp_path, FakeTracker(), FakeLauncher())
    sweep("earlier")
    with pytest.raises(IaaError) as err:
        settle(_request(tiny, tmp_path, name="earlier", resume=True))
    assert_says(err.value, "earlier", "`warm_start` begins a new sweep", "`resume`")

    path = record.sweep_file(tmp_path / "work", "earlier")
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "dataset": "cbt-cn"}))
    with pytest.raises(IaaError) as err:
        settle(_request(tiny, tmp_path))
    assert_says(err.value, "searched cbt-cn", "this sweep searches cbt-ne")

    path.write_text(json.dumps({**data, "optuna": None}))
    with pytest.raises(IaaError) as err:
        settle(_request(tiny, tmp_path))
    assert_says(err.value, str(path), "optuna", "no Optuna study")


# --- the sweep job on fakes ---------------------------------------------------------------------


def test_a_warm_started_sweep_records_what_it_carried_and_says_it(tiny: Path, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    from iaa.jobs.ports import Carried, SearchPlan

    tracker, launcher = FakeTracker(), FakeLauncher()
    sweep = _sweeper(tiny, tmp_path, tracker, launcher)
    sweep("earlier")
    launcher.carried = Carried(sweep="", trials=3, best=0.999, left_out={"its model.steps lies outside": 1})

    with caplog.at_level(logging.INFO):
        result = sweep("later", warm_start="earlier")

    [plan] = [r for r in launcher.requests if isinstance(r, SearchPlan)]
    assert plan.warm_start is not None and plan.warm_start.sweep == "earlier" and plan.study_name == "later"
    data = json.loads((tmp_path / "work" / "sweeps" / "later" / "sweep.json").read_text())
    assert data["warm_start"] == {"sweep": "earlier", "trials": 3, "best": 0.999,
                                  "left_out": {"its model.steps lies outside": 1}}
    parent = tracker.runs[data["parent_run_id"]]
    assert parent.tags["warm_start"] == "earlier" and parent.params["tune.warm_start"] == "earlier"
    assert parent.last("trials_carried") == 3
    assert_says(parent.tags["mlflow.note.content"], "began with 3 trial(s) of sweep earlier", "0.9990")
    [line] = logged(caplog, "INFO", "warm start:")
    assert_says(line, "3 scored trial(s) of sweep earlier", "0.9990", "1 left out", "model.steps")
    # the carried best is ahead of the sweep's own: said, and the result keeps them apart
    [ahead] = logged(caplog, "WARNING", "stays ahead")
    assert_says(ahead, "sweep earlier", "0.9990", f"{result.best_valid_acc:.4f}")
    assert result.warm_start == "earlier" and result.carried_trials == 3 and result.carried_best_valid_acc == 0.999
    assert result.best_valid_acc < 0.999
    assert "warm_start" not in sweep("plain").fields()


class _Interrupted(FakeLauncher):
    """A warm-started sweep (or any, with ``every``) stops with its last trial unfinished; its resume runs them all."""

    every = False

    def can_resume(self, placement):
        return True

    def sweep(self, request):
        records = super().sweep(request)
        interrupted = (self.every or request.plan.warm_start is not None) and not request.resume
        return [replace(records[-1], status="RUNNING")] if interrupted else records


def test_a_warm_started_sweep_resumes_with_its_record_and_nothing_carried_again(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.ports import Carried, SearchPlan, SweepRequest
    from iaa.jobs.tune.request import SweepInterrupted

    tracker, launcher = FakeTracker(), _Interrupted()
    sweep = _sweeper(tiny, tmp_path, tracker, launcher)
    sweep("earlier")
    launcher.carried = Carried(sweep="", trials=2, best=0.5)
    with pytest.raises(SweepInterrupted):
        sweep("later", warm_start="earlier")
    launcher.requests.clear()

    result = sweep("later", resume=True)

    assert not [r for r in launcher.requests if isinstance(r, SearchPlan)]      # nothing carried again
    [request] = [r for r in launcher.requests if isinstance(r, SweepRequest)]
    assert request.resume and request.plan.warm_start is None
    data = json.loads((tmp_path / "work" / "sweeps" / "later" / "sweep.json").read_text())
    assert data["warm_start"]["trials"] == 2 and result.carried_trials == 2


def test_a_spent_budget_names_the_warm_start_that_searches_on() -> None:
    from iaa.jobs.evaluation.closing import Command
    from iaa.jobs.sweeps.record import SweepRecord
    from iaa.jobs.tune import stops

    from test_time_budget import fake_tune_trial

    record = SweepRecord(name="spent", num_samples=9, time_budget_s=60.0, trials=(fake_tune_trial("a", "time-budget"),))
    line = stops.nothing_left_line(record, Path("/w/sweeps/spent"), Command.of("tune", dataset="demo",
                                                                                warm_start="spent"))
    assert_says(line, "budget", "`warm_start` spent")


# --- the record and the report ------------------------------------------------------------------


def test_a_record_with_a_bad_warm_start_is_one_line_naming_the_key(tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.jobs.sweeps import record

    path = tmp_path / "sweeps" / "s" / "sweep.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"name": "s", "trials": [], "seed": "x"}))
    with pytest.raises(IaaError) as err:
        record.read(path)
    assert_says(err.value, str(path), "seed", "a whole number")
    for bad, key in (({"sweep": "a", "trials": -1}, "warm_start.trials"),
                     ({"sweep": "a", "trials": 1, "left_out": {"why": "x"}}, "warm_start.left_out.why"),
                     ({"sweep": "a", "trials": 1, "best": 2.0}, "warm_start.best")):
        path.write_text(json.dumps({"name": "s", "trials": [], "warm_start": bad}))
        with pytest.raises(IaaError) as err:
            record.read(path)
        assert_says(err.value, str(path), key)
    path.write_text(json.dumps({"name": "s", "trials": [], "warm_start": {"sweep": "a", "trials": 2, "best": 0.5}}))
    assert record.read(path).warm_start.trials == 2


def test_the_report_counts_carried_trials_in_the_importances_only(tmp_path: Path) -> None:
    import optuna
    from optuna.trial import TrialState, create_trial

    from iaa.jobs.reports.sweep_report import carried_line, from_analysis
    from iaa.platform.sweeps.studies.study import analyze
    from iaa.platform.sweeps.studies.carried_trials import carry

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(storage=url, study_name="later", direction="maximize")
    carry(_source([(TrialState.COMPLETE, {"train.lr": 0.004, "model.steps": 3}, 0.97, {1: 0.97}),
                   (TrialState.PRUNED, {"train.lr": 0.002, "model.steps": 2}, None, {1: 0.3})]),
          study, _dists(SPACE), _warm())
    for params, value in (({"train.lr": 0.004, "model.steps": 2}, 0.8), ({"train.lr": 0.002, "model.steps": 3}, 0.6)):
        study.add_trial(create_trial(params=params, distributions=_dists(SPACE), value=value,
                                     intermediate_values={1: value}))

    analysis = analyze(url, "later", tmp_path / "report")

    assert analysis.scored_trials == 4 and analysis.carried_trials == 2
    assert analysis.carried_best == pytest.approx(0.97)
    assert [t.carried_from for t in analysis.trials] == ["earlier", "earlier", None, None]
    assert [p.number for p in analysis.history] == [2, 3] and analysis.history[-1].best == 0.8
    [line] = carried_line(from_analysis(analysis, sweep="later"))
    assert_says(line, "2 of the 4 trials", "sweep earlier", "0.9700", "importances")


def test_one_process_at_a_time_runs_a_sweep(tiny: Path, tmp_path: Path) -> None:
    """A second process that starts or resumes a sweep another runs now is refused, naming it."""
    import os

    from iaa.errors import IaaError
    from iaa.jobs.tune.request import SweepInterrupted
    from iaa.jobs.workdir import lock
    from iaa.jobs.workdir.paths import Workdir

    sweep = _sweeper(tiny, tmp_path, FakeTracker(), FakeLauncher())
    held = lock.beside(Workdir(tmp_path / "work").sweep("busy"))
    with lock.held(held, busy=IaaError):
        with pytest.raises(IaaError) as err:
            sweep("busy")
        assert_says(err.value, "a sweep named busy is running in another process", f"pid {os.getpid()}",
                    "`sweep_name`")
        assert not (tmp_path / "work" / "sweeps" / "busy").exists()             # nothing claimed
    launcher = _Interrupted()
    launcher.every = True
    sweep = _sweeper(tiny, tmp_path, FakeTracker(), launcher)
    with pytest.raises(SweepInterrupted):
        sweep("busy")
    assert lock.holder(held) is None                                            # let go when it stopped
    with lock.held(held, busy=IaaError):
        with pytest.raises(IaaError) as err:
            sweep("busy", resume=True)
        assert_says(err.value, "sweep busy is running in another process", "continue it with", "`resume` busy")
    assert sweep("busy", resume=True).trials == 2
