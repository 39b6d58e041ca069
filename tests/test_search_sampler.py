"""The sweep's sampler is Optuna's TPE as Optuna runs it: multivariate (``sample_relative``) once its
start-up trials are done, with distinct proposals and the space-filling start on top.

The synthetic functions are small stand-ins for a reader's accuracy surface: parameters that only
pay off together (correlated), a categorical switch that changes which others matter
(conditional), and a finite grid of choices like the presets' (categorical). Over 12 seeds the
sweep's sampler must find optima within noise of plain ``TPESampler``; drawing each parameter on
its own, as a wrapper that never calls ``sample_relative`` does, loses by a wide margin on the
correlated and categorical ones.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

import pytest

optuna = pytest.importorskip("optuna")

from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution  # noqa: E402
from optuna.samplers import TPESampler  # noqa: E402

from iaa.jobs.config.search_space import parse  # noqa: E402
from iaa.jobs.config.job_config import JobConfig  # noqa: E402
from iaa.platform.sweeps.search import search_algorithm as search  # noqa: E402
from iaa.platform.sweeps.search.distinct_search import DistinctSampler  # noqa: E402
from iaa.platform.sweeps.search.space_filling import startup_trials  # noqa: E402

SEEDS = range(12)
TRIALS = 40
Objective = Callable[[dict[str, Any]], float]


def _correlated() -> tuple[dict[str, BaseDistribution], Objective, int | None]:
    space = {f"x{i}": FloatDistribution(-5, 5) for i in range(4)}

    def f(p: dict[str, Any]) -> float:
        x = [p[f"x{i}"] for i in range(4)]
        chain = sum((x[i] - x[i + 1]) ** 2 for i in range(3))
        return chain + 0.1 * sum((v - 1) ** 2 for v in x) + (x[0] + x[3] - 2) ** 2
    return space, f, None


def _conditional() -> tuple[dict[str, BaseDistribution], Objective, int | None]:
    space = {"kind": CategoricalDistribution(["a", "b"]), "u": FloatDistribution(-3, 3), "v": FloatDistribution(-3, 3)}

    def f(p: dict[str, Any]) -> float:
        u, v = p["u"], p["v"]
        if p["kind"] == "a":
            return 10 * (u - v) ** 2 + (u + v - 2) ** 2
        return 1 + 10 * (u + v) ** 2 + (u - v - 2) ** 2
    return space, f, None


def _categorical() -> tuple[dict[str, BaseDistribution], Objective, int | None]:
    space = {f"c{i}": CategoricalDistribution([0, 1, 2, 3, 4, 5]) for i in range(4)}

    def f(p: dict[str, Any]) -> float:
        c = [p[f"c{i}"] for i in range(4)]
        return (c[0] - c[1]) ** 2 + 0.5 * (c[1] + c[2] - 7) ** 2 + (c[2] - c[3] + 1) ** 2 + 0.2 * (c[0] - 3) ** 2
    return space, f, 6 ** 4


def _best(sampler: Any, space: dict[str, BaseDistribution], f: Objective) -> float:
    study = optuna.create_study(sampler=sampler)
    for _ in range(TRIALS):
        trial = study.ask(space)
        study.tell(trial, f(trial.params))
    return study.best_value


@pytest.fixture(autouse=True)
def _quiet_optuna():
    level = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    yield
    optuna.logging.set_verbosity(level)


@pytest.mark.parametrize("make", [_correlated, _conditional, _categorical], ids=lambda m: m.__name__[1:])
def test_the_sweep_sampler_finds_optima_within_noise_of_plain_tpe(make) -> None:
    space, f, size = make()
    plain = statistics.median(_best(TPESampler(seed=s), space, f) for s in SEEDS)
    ours = statistics.median(_best(DistinctSampler(TPESampler(seed=s), space, size, seed=s), space, f) for s in SEEDS)
    assert ours <= 1.5 * plain + 0.1, (ours, plain)


class _Spy(TPESampler):
    """TPE that counts its joint proposals and remembers the last one."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.joint_calls = 0
        self.last: dict[str, Any] = {}

    def sample_relative(self, study, trial, search_space):
        proposal = super().sample_relative(study, trial, search_space)
        if proposal:
            self.joint_calls += 1
            self.last = proposal
        return proposal


def test_after_the_start_up_trials_every_proposal_is_tpes_joint_one() -> None:
    space, f, size = _categorical()
    spy = _Spy(seed=0, n_startup_trials=5)
    study = optuna.create_study(sampler=DistinctSampler(spy, space, size, seed=0))
    designed = startup_trials(space)                  # the space-filling start: 6 trials
    for number in range(16):
        trial = study.ask(space)
        if number >= designed:
            assert spy.joint_calls > 0 and trial.params == spy.last, number
        study.tell(trial, f(trial.params))
    assert spy.joint_calls >= 10


def test_the_sampler_tune_builds_proposes_jointly_once_tpe_starts(monkeypatch) -> None:
    joint: list[dict[str, Any]] = []
    original = TPESampler.sample_relative

    def counted(self, study, trial, search_space):
        proposal = original(self, study, trial, search_space)
        joint.append(proposal)
        return proposal
    monkeypatch.setattr(TPESampler, "sample_relative", counted)
    space = parse({"train.lr": [1e-3, 2e-3, 4e-3, 8e-3], "model.steps": [1, 2, 3, 4], "model.hidden_dim": [32, 64]},
                  JobConfig())
    distributions = search.to_optuna(space)
    study = optuna.create_study(sampler=search.build_sampler(space, seed=3))
    for _ in range(14):
        trial = study.ask(distributions)
        study.tell(trial, trial.params["train.lr"] * 100 + trial.params["model.steps"])
    assert sum(1 for proposal in joint if set(proposal) == set(distributions)) >= 3


def test_a_restored_searcher_writes_to_the_study_of_the_process_that_resumes_it(tmp_path) -> None:
    """Tune pickles the searcher and saves its state; resumed from a copied work folder, it must
    write to the copy's study, never to the one it was built with."""
    import pickle
    import shutil

    from tests._study import bound_study

    space = parse({"model.steps": [1, 2, 3]}, JobConfig())
    (tmp_path / "a").mkdir()
    first = f"sqlite:///{tmp_path / 'a' / 'optuna.db'}"
    with bound_study(first, "s"):
        searcher = search.searcher(space, seed=0, sweep="s")
        saved = pickle.dumps(searcher)                         # tuner.pkl, at the run's start
        searcher.suggest("t1")
        searcher.on_trial_result("t1", {"valid_acc": 0.4, "checks": 1})
        searcher.save(str(tmp_path / "state.json"))            # the experiment's searcher state
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    before = (tmp_path / "a" / "optuna.db").read_bytes()

    restored = pickle.loads(saved)
    restored.restore(str(tmp_path / "state.json"))
    with bound_study(f"sqlite:///{tmp_path / 'b' / 'optuna.db'}", "s"):
        restored.on_trial_result("t1", {"valid_acc": 0.5, "checks": 2})
        restored.on_trial_complete("t1", {"valid_acc": 0.5, "best_valid_acc": 0.5, "checks": 2,
                                          "stop_reason": "max-epochs"})
        restored.suggest("t2")
    assert (tmp_path / "a" / "optuna.db").read_bytes() == before
    copy = optuna.load_study(study_name="s", storage=f"sqlite:///{tmp_path / 'b' / 'optuna.db'}")
    states = [t.state.name for t in copy.trials]
    assert states == ["FAIL", "COMPLETE", "RUNNING"]           # asked by a gone process, continued, new
    assert copy.trials[1].intermediate_values == {1: 0.4, 2: 0.5}


# --- the samplers ``tune --sampler`` names -----------------------------------------------------------

SMALL = {"train.lr": [1e-3, 2e-3, 4e-3], "model.steps": [1, 2], "model.hidden_dim": [32, 64]}   # 12 configurations
INNER = {"tpe": optuna.samplers.TPESampler, "gp": optuna.samplers.GPSampler, "random": optuna.samplers.RandomSampler,
         "cmaes": optuna.samplers.CmaEsSampler}


def _proposals(sampler: Any, space: Any, trials: int) -> list[tuple]:
    distributions = search.to_optuna(space)
    study = optuna.create_study(sampler=sampler, direction="maximize")
    out = []
    for _ in range(trials):
        trial = study.ask(distributions)
        params = trial.params
        study.tell(trial, params["train.lr"] * 100 + params["model.steps"] - params["model.hidden_dim"] / 64)
        out.append(tuple(sorted(trial.params.items())))
    return out


def test_every_sampler_name_is_mapped_once() -> None:
    from iaa.jobs.config.presets import DEFAULT_SAMPLER, SAMPLERS

    assert list(search.SAMPLERS) == list(SAMPLERS) and DEFAULT_SAMPLER == "tpe"


@pytest.mark.parametrize("name", ["tpe", "gp", "random", "cmaes"])
def test_each_sampler_is_seeded_and_wrapped_distinct_with_the_space_filling_start(name: str) -> None:
    if name == "cmaes":
        pytest.importorskip("cmaes")
    space = parse(SMALL, JobConfig())
    built = search.build_sampler(space, 5, name)
    assert isinstance(built, DistinctSampler) and type(built.inner) is INNER[name] and built.seed == 5
    first = _proposals(built, space, 12)
    assert len(set(first)) == 12                                 # every configuration once
    assert first == _proposals(search.build_sampler(space, 5, name), space, 12)   # the seed fixes the order
    assert first != _proposals(search.build_sampler(space, 6, name), space, 12)


def test_grid_tries_every_configuration_once_in_a_seeded_order_unwrapped() -> None:
    space = parse(SMALL, JobConfig())
    built = search.build_sampler(space, 5, "grid")
    assert isinstance(built, optuna.samplers.GridSampler) and not isinstance(built, DistinctSampler)
    first = _proposals(built, space, 12)                         # the last tell does not raise (no study.stop)
    assert len(set(first)) == 12
    assert first == _proposals(search.build_sampler(space, 5, "grid"), space, 12)
    assert first != _proposals(search.build_sampler(space, 6, "grid"), space, 12)


def test_cmaes_without_its_package_is_one_line_naming_what_to_install(monkeypatch) -> None:
    import importlib.util

    from iaa.errors import IaaError

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cmaes" else real(name, *a))
    with pytest.raises(IaaError, match=r"pip install 'iaa\[cmaes\]'"):
        search.build_sampler(parse(SMALL, JobConfig()), 0, "cmaes")


def test_tune_with_cmaes_missing_fails_before_any_record_or_cluster(monkeypatch, tmp_path) -> None:
    import importlib.util

    from click.testing import CliRunner

    from _faults import assert_one_message
    from iaa.cli import cli
    from tests._tiny import make_tiny_prepared

    tiny = make_tiny_prepared(tmp_path / "tiny")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "cmaes" else real(name, *a))
    result = CliRunner().invoke(cli, ["tune", "--data", str(tiny), "--sampler", "cmaes", "--workdir", str(tmp_path / "w")])
    assert_one_message(result.exit_code, result.output, "cmaes sampler needs the cmaes package",
                       "pip install -e '.[cmaes]'")
    assert not (tmp_path / "w" / "sweeps").exists() and not (tmp_path / "w" / "mlflow.db").exists()


def test_a_sampler_that_keeps_proposing_a_taken_configuration_is_redrawn_at_random() -> None:
    """A deterministic proposal (a GP's acquisition optimum) would otherwise be accepted as a repeat
    after every redraw."""
    class Stubborn(optuna.samplers.RandomSampler):
        def infer_relative_search_space(self, study, trial):
            return dict(distributions)

        def sample_relative(self, study, trial, search_space):
            return {"train.lr": 1e-3, "model.steps": 1, "model.hidden_dim": 32}

    space = parse(SMALL, JobConfig())
    distributions = search.to_optuna(space)
    assert len(set(_proposals(DistinctSampler(Stubborn(seed=0), distributions, space.size), space, 12))) == 12


def test_a_stopped_trial_and_its_continuation_take_one_point_of_the_start_up_design() -> None:
    """A stop ends trial 0 FAIL and its resume asks it again as trial 1 with its configuration: the
    next trial takes the design's second point, so no searched value is passed by."""
    from optuna.trial import TrialState

    from iaa.platform.sweeps.search.space_filling import stratified_config

    space = parse(SMALL, JobConfig())
    distributions = search.to_optuna(space)
    study = optuna.create_study(sampler=DistinctSampler(TPESampler(seed=3), distributions, space.size, seed=3))
    first = study.ask(distributions)
    study.tell(first, state=TrialState.FAIL)                             # the stop
    study.enqueue_trial(first.params, user_attrs={"continues_trial": first.number})
    again = study.ask(distributions)
    assert again.params == first.params == stratified_config(distributions, 3, 0)
    study.tell(again, 0.5)
    assert study.ask(distributions).params == stratified_config(distributions, 3, 1)
