"""Configurations a sweep tries first (``tune --try-first FILE``) without Ray: the file read and
checked against the search space, the searcher that runs them before it proposes anything (in a
real Optuna study, through a stop and a resume), and the sweep job on fakes. The real sweep is in
test_platform_sweep.py."""

from __future__ import annotations

import dataclasses
import json
import logging
import pickle
from pathlib import Path

import pytest

from _faults import assert_says, invoke, logged
from _tiny import make_tiny_prepared
from fakes import FakeLauncher, FakeTracker, fake_sweeper
from iaa.jobs.config.job_config import ConfigError, JobConfig
from iaa.jobs.config.search_space import parse

pytestmark = pytest.mark.timeout(300)

SPACE = {"train.lr": [0.002, 0.004], "model.steps": [1, 2, 3], "model.hidden_dim": {"low": 32, "high": 96, "step": 32},
         "model.dropout": {"low": 0.0, "high": 0.5}, "train.batch_size": 16}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _load(tmp_path: Path, text: str):
    from iaa.jobs.tune import try_first

    path = tmp_path / "try.yaml"
    path.write_text(text, encoding="utf-8")
    return try_first.load(path, parse(SPACE, JobConfig()))


def test_a_file_of_configurations_reads_as_the_trials_hold_their_values(tmp_path: Path) -> None:
    configs = _load(tmp_path, "- {train.lr: 4e-3, model.steps: 3, model.hidden_dim: 64.0}\n"
                              "- model:\n    dropout: 0.25\n")
    assert configs == ({"train.lr": 0.004, "model.steps": 3, "model.hidden_dim": 64}, {"model.dropout": 0.25})
    assert isinstance(configs[0]["model.hidden_dim"], int)
    assert _load(tmp_path, "train.lr: 0.002\n") == ({"train.lr": 0.002},)         # one configuration alone


@pytest.mark.parametrize("text, phrases", [
    ("- {train.lr: 0.004}\n- {train.lr: 0.003}\n", ("line 2", "configuration 2", "train.lr", "not one of its choices")),
    ("- model.steps: 2\n  model.hidden_dim: 128\n", ("line 2", "model.hidden_dim: 128", "outside its range")),
    ("- {model.hidden_dim: 48}\n", ("line 1", "model.hidden_dim: 48", "off its step")),
    ("- {model.steps: 2.5}\n", ("model.steps", "an integer")),
    ("- {model.dropout: high}\n", ("model.dropout", "expected a number")),
    ("- {train.lr: 0.004}\n-\n  train.clip: 1.0\n", ("line 3", "train.clip is not searched", "`sets` train.clip=")),
    ("- {train.batch_size: 16}\n", ("train.batch_size is fixed to 16", "leave it out")),
    ("- {train.lr: 0.004}\n- {model.steps: 1}\n- {train.lr: 4.0e-3}\n", ("line 3", "repeats configuration 1")),
    ("- {train.lr: 0.004}\n- 3\n", ("line 2", "configuration 2", "expected a mapping")),
    ("", ("expected a configuration",)),
    ("just words\n", ("expected a configuration",)),
    ("- {train.lr: 0.004, train.lr: 0.002}\n", ("line 1", "duplicate key")),
])
def test_a_bad_file_is_one_error_naming_the_file_the_line_and_the_key(tmp_path: Path, text: str,
                                                                     phrases: tuple) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, text)
    assert_says(err.value, str(tmp_path / "try.yaml"), *phrases)


# --- the searcher, on a real Optuna study -------------------------------------------------------


def _searcher(given: tuple, sweep: str | None = None):
    from iaa.platform.sweeps.search import search_algorithm as search

    space = parse({"train.lr": [0.001, 0.002, 0.004], "model.steps": [1, 2, 3]}, JobConfig())
    return search.searcher(space, 0, sweep, sampler="tpe", try_first=given)


def _tell(searcher, trial_id: str, value: float) -> None:
    searcher.on_trial_result(trial_id, {"valid_acc": value, "checks": 1})
    searcher.on_trial_complete(trial_id, {"valid_acc": value, "best_valid_acc": value, "checks": 1,
                                          "stop_reason": "max-epochs"})


def test_the_first_trials_run_the_given_configurations_then_the_design_covers_the_space() -> None:
    from optuna.trial import TrialState

    plain = _searcher(())
    designed = []
    for i in range(3):
        designed.append(plain.suggest(f"p{i}"))
        _tell(plain, f"p{i}", 0.5)
    others = [{"train.lr": lr, "model.steps": steps} for lr in (0.001, 0.002, 0.004) for steps in (1, 2, 3)]
    given = tuple(c for c in others if c not in designed)[:2]
    searcher = _searcher(given)
    proposed = []
    for i in range(5):
        proposed.append(searcher.suggest(f"t{i}"))
        _tell(searcher, f"t{i}", 0.1 * i)

    assert tuple(proposed[:2]) == given
    assert proposed[2:] == designed                          # the space-filling start, whole, after them
    trials = searcher.study.get_trials()
    assert [t.user_attrs.get("tried_first") for t in trials] == [0, 1, None, None, None]
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert not searcher.study.get_trials(states=(TrialState.WAITING,))   # none is left waiting


def test_a_partly_given_configuration_leaves_the_rest_to_the_sampler() -> None:
    searcher = _searcher(({"model.steps": 3},))
    first = searcher.suggest("t0")
    assert first["model.steps"] == 3 and first["train.lr"] in (0.001, 0.002, 0.004)


def test_a_resumed_searcher_goes_on_with_the_next_given_configuration(tmp_path: Path) -> None:
    from tests._study import bound_study

    given = ({"train.lr": 0.001, "model.steps": 1}, {"train.lr": 0.002, "model.steps": 1},
             {"train.lr": 0.004, "model.steps": 1})
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    with bound_study(url, "s"):
        searcher = _searcher(given, sweep="s")
        saved = pickle.dumps(searcher)                          # tuner.pkl, at the run's start
        searcher.suggest("t0")
        _tell(searcher, "t0", 0.3)
        searcher.suggest("t1")                                  # stopped while it runs
        searcher.save(str(tmp_path / "state.json"))
    restored = pickle.loads(saved)
    restored.restore(str(tmp_path / "state.json"))
    with bound_study(url, "s"):
        _tell(restored, "t1", 0.4)                              # Tune continues the trial it kept
        third = restored.suggest("t2")
        fourth = restored.suggest("t3")

    assert third == given[2] and fourth not in given
    asked = [t.user_attrs["tried_first"] for t in restored.study.get_trials()
             if "tried_first" in t.user_attrs and "continues_trial" not in t.user_attrs]
    assert asked == [0, 1, 2]                                   # each asked once (the stopped one continued)


def _carry(searcher, params: dict, **attrs) -> None:
    """A trial that a warm start carried into ``searcher``'s study, as ``warm_start.carry`` adds it."""
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    searcher.study.add_trial(create_trial(
        state=TrialState.COMPLETE, value=0.9, params=params,
        distributions={"train.lr": CategoricalDistribution([0.001, 0.002, 0.004]),
                       "model.steps": CategoricalDistribution([1, 2, 3])},
        user_attrs={**attrs, "carried_from": "earlier", "carried_number": 0}))


def test_a_carried_trials_given_mark_is_not_this_sweeps() -> None:
    searcher = _searcher(({"train.lr": 0.001, "model.steps": 1},))
    _carry(searcher, {"train.lr": 0.002, "model.steps": 1}, tried_first=0)    # given 0 of the earlier sweep
    assert searcher.suggest("t0") == {"train.lr": 0.001, "model.steps": 1}


def test_a_given_configuration_that_a_carried_trial_ran_whole_does_not_run_again() -> None:
    given = ({"train.lr": 0.001, "model.steps": 1}, {"train.lr": 0.002, "model.steps": 1}, {"model.steps": 2})
    searcher = _searcher(given)
    _carry(searcher, dict(given[0]))
    _carry(searcher, {"train.lr": 0.004, "model.steps": 2})     # holds given 2's key, but it is only partly given
    proposed = []
    for i in range(3):
        proposed.append(searcher.suggest(f"t{i}"))
        _tell(searcher, f"t{i}", 0.5)

    assert proposed[0] == given[1] and proposed[1]["model.steps"] == 2
    assert proposed[1] != {"train.lr": 0.004, "model.steps": 2}       # the sampler never proposes a carried one
    assert given[0] not in proposed
    asked = [t.user_attrs.get("tried_first") for t in searcher.study.get_trials() if "carried_from" not in t.user_attrs]
    assert asked == [1, 2, None]


class _TuneTrial:
    def __init__(self, trial_id: str) -> None:
        self.trial_id = trial_id


def _check(asha, trial_id: str, value: float) -> str:
    return asha.on_trial_result(None, _TuneTrial(trial_id), {"valid_acc": value, "checks": 1})


def test_asha_sets_the_given_trials_aside(tmp_path: Path) -> None:
    from iaa.jobs.config.presets import TUNE_PRESETS
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.search import search_algorithm as search
    from tests._study import bound_study

    preset = TUNE_PRESETS["cnn"]                                 # grace 1, keep a third
    plain = search.scheduler(preset, max_t=4)
    for trial_id in ("guess", "t1"):
        plain.on_trial_add(None, _TuneTrial(trial_id))
    assert _check(plain, "guess", 0.99) == "CONTINUE" and _check(plain, "t1", 0.5) == "STOP"   # the guess's bar

    with bound_study(f"sqlite:///{tmp_path / 'optuna.db'}", "s"):
        searcher = _searcher(({"train.lr": 0.001, "model.steps": 1},), sweep="s")
        searcher.suggest("guess")
        searcher.suggest("t1")
        assert driver_side.of("s").given == {"guess"} and searcher.given_ids == {"guess"}
        asha = search.scheduler(preset, max_t=4, sweep="s")
        for trial_id in ("guess", "t1"):
            asha.on_trial_add(None, _TuneTrial(trial_id))
        assert _check(asha, "guess", 0.99) == "CONTINUE" and _check(asha, "t1", 0.5) == "CONTINUE"
        assert _check(asha, "guess", 0.01) == "CONTINUE"           # never stopped: it runs to its end
        asha.on_trial_complete(None, _TuneTrial("guess"), {"valid_acc": 0.99, "checks": 3})
        searcher.save(str(tmp_path / "state.json"))

    with bound_study(f"sqlite:///{tmp_path / 'optuna.db'}", "s"):      # a resumed sweep's process
        restored = _searcher(({"train.lr": 0.001, "model.steps": 1},), sweep="s")
        restored.restore(str(tmp_path / "state.json"))
        assert driver_side.of("s").given == {"guess"}


def test_the_report_names_the_trials_that_ran_a_given_configuration(tmp_path: Path) -> None:
    from tests._study import bound_study

    from iaa.jobs.reports.sweep_report import from_analysis, given_line
    from iaa.platform.sweeps.studies.study import analyze

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    given = ({"train.lr": 0.001, "model.steps": 1}, {"train.lr": 0.002, "model.steps": 1})
    with bound_study(url, "s"):
        searcher = _searcher(given, sweep="s")
        for i, value in enumerate((0.4, 0.7, 0.9)):
            searcher.suggest(f"t{i}")
            _tell(searcher, f"t{i}", value)

    analysis = analyze(url, "s", tmp_path / "report")

    assert [t.tried_first for t in analysis.trials] == [0, 1, None]
    [line] = given_line(from_analysis(analysis, sweep="s"))
    assert_says(line, "2 configuration(s) given to try first ran in trial-0000, trial-0001 of the 3", "0.7000, trial-0001",
                "ASHA left them")
    assert not given_line(from_analysis(dataclasses.replace(analysis, trials=analysis.trials[2:]), sweep="s"))


# --- the sweep job on fakes ---------------------------------------------------------------------


def _sweeper(tiny: Path, tmp_path: Path, tracker: FakeTracker, launcher: FakeLauncher):
    return fake_sweeper(tiny, tmp_path, tracker, launcher, show_progress=True)


def test_a_sweep_plans_records_and_says_its_configurations_to_try_first(tiny: Path, tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from iaa.jobs.ports import SearchPlan, SweepRequest
    from iaa.jobs.sweeps import record

    tracker, launcher = FakeTracker(), FakeLauncher()
    given = tmp_path / "try.yaml"
    given.write_text("- {model.hidden_dim: 12, model.steps: 1}\n- {model.hidden_dim: 8, model.steps: 2}\n",
                     encoding="utf-8")
    configs = ({"model.hidden_dim": 12, "model.steps": 1}, {"model.hidden_dim": 8, "model.steps": 2})
    with caplog.at_level(logging.INFO):
        result = _sweeper(tiny, tmp_path, tracker, launcher)("s", try_first=given)

    [request] = [r for r in launcher.requests if isinstance(r, SweepRequest)]
    assert request.plan.try_first == configs and isinstance(request.plan, SearchPlan)
    path = tmp_path / "work" / "sweeps" / "s" / "sweep.json"
    assert json.loads(path.read_text())["try_first"] == list(configs)
    assert record.read(path).try_first == configs
    parent = tracker.runs[json.loads(path.read_text())["parent_run_id"]]
    assert parent.params["tune.try_first"] == "2"
    [line] = logged(caplog, "INFO", "try the configurations given")
    assert_says(line, "the first 2 trial(s)", "{model.hidden_dim: 12, model.steps: 1}; {model.hidden_dim: 8")
    # both trials ran a given configuration: the best holds its own, and says which
    best = int(result.best_trial[-1]) + 1
    assert result.tried_first == 2 and result.best_tried_first == best
    [held] = logged(caplog, "INFO", "given to try first")
    assert_says(held, f"holds configuration {best} of the 2")
    assert "tried_first" not in _sweeper(tiny, tmp_path, tracker, FakeLauncher())("plain").fields()


def test_a_warm_started_sweep_says_which_given_configurations_a_carried_trial_ran(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from iaa.jobs.ports import Carried

    tracker, launcher = FakeTracker(), FakeLauncher()
    sweep = _sweeper(tiny, tmp_path, tracker, launcher)
    sweep("earlier")
    ran = {"model.hidden_dim": 12, "model.steps": 1}
    launcher.carried = Carried(sweep="", trials=2, best=0.8, ran=((ran, 0.75), ({"model.hidden_dim": 8, "model.steps": 1}, 0.8)))
    given = tmp_path / "try.yaml"
    given.write_text("- {model.hidden_dim: 8, model.steps: 2}\n- {model.hidden_dim: 12, model.steps: 1}\n"
                     "- {model.hidden_dim: 8}\n", encoding="utf-8")

    with caplog.at_level(logging.INFO):
        result = sweep("later", warm_start="earlier", try_first=given, num_samples=3)

    [repeat] = logged(caplog, "WARNING", "given to try first")
    assert_says(repeat, "configuration 2", "sweep earlier", "0.7500", "does not run again")
    [line] = logged(caplog, "INFO", "try the configurations given")
    assert_says(line, "the first 2 trial(s)", "{model.hidden_dim: 8, model.steps: 2}; {model.hidden_dim: 8}")
    assert result.tried_first == 3 and result.best_tried_first != 2      # the file's numbering stands
    assert json.loads((tmp_path / "work" / "sweeps" / "later" / "sweep.json").read_text())["try_first"][1] == ran


@pytest.mark.parametrize("more, phrases", [
    ({"sampler": "grid"}, ("grid sampler", "`try_first`")),
    ({"num_samples": 1}, ("2 configurations to try first", "runs 1 trials", "`num_samples`")),
])
def test_configurations_a_sweep_cannot_try_first_are_refused_before_it_starts(tiny: Path, tmp_path: Path,
                                                                              more: dict, phrases: tuple) -> None:
    from iaa.errors import IaaError

    given = tmp_path / "try.yaml"
    given.write_text("- {model.steps: 1}\n- {model.steps: 2}\n", encoding="utf-8")
    launcher = FakeLauncher()
    with pytest.raises(IaaError) as err:
        _sweeper(tiny, tmp_path, FakeTracker(), launcher)("s", try_first=given, **more)
    assert_says(err.value, *phrases)
    assert not launcher.requests and not (tmp_path / "work" / "sweeps" / "s").exists()


def test_a_resume_keeps_the_configurations_its_record_holds(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.tune.request import TuneRequest
    from iaa.jobs.tune.settle import settle

    given = tmp_path / "try.yaml"
    given.write_text("- {model.steps: 1}\n", encoding="utf-8")
    _sweeper(tiny, tmp_path, FakeTracker(), FakeLauncher())("s", try_first=given)

    plan = settle(TuneRequest(name="s", resume=True, workdir=tmp_path / "work"))
    assert plan.try_first == ({"model.steps": 1},)
    with pytest.raises(ConfigError) as err:
        TuneRequest(name="s", resume=True, workdir=tmp_path / "work", try_first=given)
    assert_says(err.value, "`try_first` begins a new sweep")
    code, output = invoke("tune", "--resume", "s", "--try-first", given, "--workdir", tmp_path / "work")
    assert code == 1 and "--try-first begins a new sweep" in output, output


@pytest.mark.parametrize("space, phrases", [
    ("model.hidden_dim: [8, 12]\n", ("model.steps is not searched by the search space the sweep resumes with",)),
    ("model.steps: [2, 3]\n", ("model.steps: 1 is not one of its choices {2, 3}",)),
])
def test_a_resume_with_a_space_that_does_not_hold_its_given_configurations_is_one_line(
        tiny: Path, tmp_path: Path, space: str, phrases: tuple) -> None:
    from iaa.jobs.tune.request import TuneRequest
    from iaa.jobs.tune.settle import settle

    given = tmp_path / "try.yaml"
    given.write_text("- {model.steps: 1}\n", encoding="utf-8")
    _sweeper(tiny, tmp_path, FakeTracker(), FakeLauncher())("s", try_first=given)
    (tmp_path / "space.yaml").write_text(space, encoding="utf-8")

    with pytest.raises(ConfigError) as err:
        settle(TuneRequest(name="s", resume=True, workdir=tmp_path / "work", search_space=tmp_path / "space.yaml"))
    path = tmp_path / "work" / "sweeps" / "s" / "sweep.json"
    assert_says(err.value, f"{path}: try_first: configuration 1 given to try first", *phrases,
                "resume with the search space the sweep started with")


def test_a_record_whose_configurations_are_not_mappings_is_one_line_naming_the_key(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.sweeps import record
    from iaa.jobs.workdir.fields import RecordError

    given = tmp_path / "try.yaml"
    given.write_text("- {model.steps: 1}\n", encoding="utf-8")
    _sweeper(tiny, tmp_path, FakeTracker(), FakeLauncher())("s", try_first=given)
    path = tmp_path / "work" / "sweeps" / "s" / "sweep.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "try_first": [{"model.steps": 1}, 3]}))

    with pytest.raises(RecordError) as err:
        record.read(path)
    assert_says(err.value, str(path), "try_first[1]", "expected a mapping")
