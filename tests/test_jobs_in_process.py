"""Every job's use case on the in-process fakes of its ports (tests/fakes.py): no Ray, no MLflow,
seconds each. The end-to-end tests (test_platform_*.py) run the same jobs on the real adapters."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from fakes import FakeLauncher, FakeTracker
from iaa.jobs.ports import MembersRequest, SweepRequest, TrainRun, WorkersRequest
from _faults import assert_says, logged
from _platform import TINY_SPACE
from _tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _cfg(tiny: Path, *sets: str):
    from iaa.jobs.datasets import resolve

    return resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, *sets))


def test_train_tracks_its_run_params_checks_and_model(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.train import train

    tracker = FakeTracker()
    result = train.run_tracked(TrainRun(_cfg(tiny), tiny, tmp_path / "run", show_progress=False), tracker)

    run = tracker.runs[result.mlflow_run_id]
    assert run.state == "FINISHED" and run.params["model.hidden_dim"] == "8"
    assert run.last("valid_acc") == pytest.approx(max(p.value for p in run.metrics["valid_acc"]))
    assert [m["run_id"] for m in tracker.models] == [run.run_id]
    assert Path(result.checkpoint).is_file()


def test_a_train_run_holds_its_accuracy_beside_its_interval_and_baseline_and_its_model_says_what_it_is(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the store shows of a train run: the valid split's size, the accuracy's standard error
    and the baseline beside it, a description in the console's words, its checkpoint as an absolute
    path (the folder was given relative; the result says it so too), and a registered model's
    description and tags."""
    from iaa.jobs.evaluation import uncertainty
    from iaa.jobs.train import train

    monkeypatch.chdir(tmp_path)
    tracker = FakeTracker()
    result = train.run_tracked(TrainRun(_cfg(tiny), tiny, Path("run"), show_progress=False, register="tiny-reader"),
                               tracker)

    run = tracker.runs[result.mlflow_run_id]
    n, acc, base = result.best_valid_acc_n, result.best_valid_acc, result.baseline_valid_acc
    assert n == result.valid_examples and n > 0 and acc is not None and base is not None
    assert run.params["best_valid_acc_n"] == str(n)
    assert run.last("best_valid_acc_stderr") == pytest.approx(result.best_valid_acc_stderr)
    assert run.last("baseline_valid_acc") == pytest.approx(base)
    checkpoint = str((tmp_path / "run" / "checkpoints" / "best.pt").resolve())
    assert result.checkpoint == run.tags["checkpoint"] == checkpoint     # said as the next commands say it
    assert_says(run.tags["mlflow.note.content"], f"Best valid_acc {uncertainty.accuracy_text(acc, n)}",
                f"baseline {base:.4f}", f"of {result.steps}", "stopped at max-epochs", checkpoint)
    [model] = tracker.models
    card = model["card"]
    assert card.tags == {"kind": "reader", "model": "iaa", "dataset": "cbt-ne", "valid_acc": f"{acc:.4f}",
                         "valid_acc_n": str(n), "baseline_valid_acc": f"{base:.4f}"}
    assert_says(card.description, "A reader of model `iaa` on cbt-ne", uncertainty.accuracy_text(acc, n),
                f"baseline {base:.4f}", f"run run ({run.run_id}) of experiment train-cbt-ne", checkpoint)


def test_a_resume_of_a_run_that_had_stopped_trains_nothing_and_logs_nothing_new(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``--resume`` of a finished run: no second logged model, no second final point; it says so."""
    from iaa.jobs.train import train

    caplog.set_level("INFO", logger="iaa")
    tracker = FakeTracker()
    first = train.run_tracked(TrainRun(_cfg(tiny), tiny, tmp_path / "run", show_progress=False), tracker)
    again = train.run_tracked(TrainRun(_cfg(tiny), tiny, tmp_path / "run", resume=True, show_progress=False), tracker)
    [run] = tracker.runs.values()
    assert again.mlflow_run_id == first.mlflow_run_id and again.steps == first.steps
    assert len(tracker.models) == 1 and len(run.metrics["final_best_valid_acc"]) == 1
    assert again.model_uri == first.model_uri is not None
    [said] = logged(caplog, "INFO", "nothing left to train")
    assert_says(said, "had already stopped (max-epochs)", "nothing new is logged")


def test_train_on_workers_goes_through_the_launcher(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.train import train

    tracker, launcher = FakeTracker(), FakeLauncher()
    result = train.run_tracked(TrainRun(_cfg(tiny), tiny, tmp_path / "run", workers=2, storage=str(tmp_path / "storage"),
                                        show_progress=False), tracker, launcher)

    [request] = launcher.requests
    assert isinstance(request, WorkersRequest) and request.workers == 2 and request.folder.path == tmp_path / "run"
    assert Path(result.checkpoint).is_file()
    assert tracker.runs[result.mlflow_run_id].metrics["valid_acc"], "the launcher's checks reach the run"


def test_tune_runs_every_trial_as_a_child_of_the_sweep_and_records_the_best(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.tune import tune

    space = tmp_path / "space.yaml"
    space.write_text(TINY_SPACE, encoding="utf-8")
    tracker, launcher = FakeTracker(), FakeLauncher()
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=3, search_space=space, sets=TINY_SETS,
                           workdir=tmp_path / "work", name="fake", show_progress=False, sampler="gp")
    before = set(sys.modules)
    result = tune.run(req, lambda uri: tracker, launcher)

    assert not {m.split(".")[0] for m in set(sys.modules) - before} & {"ray", "mlflow", "optuna"}

    sweep = json.loads((tmp_path / "work" / "sweeps" / "fake" / "sweep.json").read_text())
    assert len(sweep["trials"]) == 3
    request = next(r for r in launcher.requests if isinstance(r, SweepRequest))
    assert request.trials.tracking.tracker is tracker and request.plan.num_samples == 3
    assert request.plan.sampler == "gp" and sweep["sampler"] == "gp"                  # what proposed the trials
    assert tracker.runs[sweep["parent_run_id"]].params["tune.sampler"] == "gp"
    children = tracker.children(sweep["parent_run_id"])
    assert sorted(c.run_id for c in children) == sorted(t["mlflow_run_id"] for t in sweep["trials"])
    best = max(sweep["trials"], key=lambda t: t["best_valid_acc"])
    assert isinstance(result, tune.TuneResult) and result.best_trial == best["trial_id"]
    assert result.best_valid_acc == pytest.approx(best["best_valid_acc"]) and result.trials == 3
    assert result.best_config.is_file() and result.sweep_json.is_file() and result.parent_run_id == sweep["parent_run_id"]
    assert [c.name for c in result.next] == ["train", "report", "ensemble", "serve"]
    assert all(dict(c.options).get("workdir") for c in result.next)       # each runs as printed from any folder
    assert tracker.runs[sweep["parent_run_id"]].state == "FINISHED"


def _sweeper(tiny: Path, tmp_path: Path, tracker: FakeTracker, launcher: FakeLauncher, *, name: str,
             num_samples: int):
    """``sweep(**more)``: the sweep ``name`` of the tiny data in ``tmp_path/work`` on the fakes,
    with ``more`` of the request (``resume``, ``time_budget_s``)."""
    from iaa.jobs.tune import tune

    space = tmp_path / "space.yaml"
    space.write_text(TINY_SPACE, encoding="utf-8")

    def sweep(**more: object) -> tune.TuneResult:
        req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=num_samples, search_space=space,
                               sets=TINY_SETS, workdir=tmp_path / "work", name=name, show_progress=False, **more)
        return tune.run(req, lambda uri: tracker, launcher)
    return sweep


class _LosingLauncher(FakeLauncher):
    """A sweep whose last trial loses its worker with no restores left; resumed, that trial runs
    again to the end, better than every other."""

    def can_resume(self, placement):
        return True

    def sweep(self, request):
        from dataclasses import replace

        from iaa.jobs.ports import WORKER_LOST

        if not request.resume:
            *done, last = super().sweep(request)
            self.kept = [*done, replace(last, status="ERROR", stop_reason=WORKER_LOST, checks=1)]
            return self.kept
        self.requests.append(request)
        *done, lost = self.kept
        request.trials.tracking.tracker.reopen_run(lost.mlflow_run_id).end("FINISHED")
        return [*done, replace(lost, status="TERMINATED", stop_reason="max-epochs", best_valid_acc=0.99)]


def test_a_sweep_with_a_lost_trial_finishes_without_it_and_its_resume_makes_it_the_best(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The sweep's run takes the best as params only once no trial is left to run again (params
    never change), and a resume that finds a better trial moves ``best_in_sweep`` to it."""
    from iaa.jobs.sweeps import record

    tracker, launcher = FakeTracker(), _LosingLauncher()
    sweep = _sweeper(tiny, tmp_path, tracker, launcher, name="lossy", num_samples=3)

    first = sweep()
    recorded = record.read(record.sweep_file(tmp_path / "work", "lossy"))
    assert first.lost_trials == (recorded.trials[-1].label,) and first.fields()["lost_trials"] == list(first.lost_trials)
    assert tracker.runs[first.parent_run_id].metrics["trials_lost"][-1].value == 1
    assert not recorded.finished and [t.lost for t in recorded.trials] == [False, False, True]
    [warned] = logged(caplog, "WARNING", "lost a worker with no restores left")
    assert f"({recorded.trials[-1].label});" in warned and "runs them again from their last check" in warned
    assert "from the start" not in warned                 # it had made a check
    parent = tracker.runs[first.parent_run_id]
    assert parent.state == "FINISHED" and not [k for k in parent.params if k.startswith("best.")]
    earlier = parent.tags["best_mlflow_run_id"]
    assert tracker.runs[earlier].tags["best_in_sweep"] == "true"

    again = sweep(resume=True)
    lost = recorded.trials[-1]
    assert again.best_trial == lost.trial_id and not parent.lost and parent.state == "FINISHED"
    assert parent.params["best.ray_trial_id"] == lost.trial_id == parent.tags["best_ray_trial_id"]
    assert parent.params["best.trial_id"] == lost.label == parent.tags["best_trial_id"]
    flags = {r.run_id: r.tags.get("best_in_sweep") for r in tracker.children(first.parent_run_id)}
    assert [run for run, flag in flags.items() if flag == "true"] == [lost.mlflow_run_id]
    assert flags[earlier] == "false" and record.read(record.sweep_file(tmp_path / "work", "lossy")).finished
    assert again.lost_trials == () and parent.metrics["trials_lost"][-1].value == 0


class _NamingLauncher(FakeLauncher):
    """A sweep whose trials have their one names (``trial-0000`` ...) beside Tune's ids, as the
    cluster's have."""

    def sweep(self, request):
        from dataclasses import replace

        from iaa.jobs.ports import trial_name

        return [replace(t, name=trial_name(i)) for i, t in enumerate(super().sweep(request))]


def test_the_sweep_run_names_its_best_trial_as_the_console_does_with_its_interval_and_baseline(
        tiny: Path, tmp_path: Path) -> None:
    """The sweep's run names its best trial by its one name (``best.trial_id``, ``best_trial_id``)
    and keeps Tune's id apart (``best.ray_trial_id``, ``best_ray_trial_id``); it holds the valid
    split's size, the best accuracy's standard error and the baseline, its description says the
    accuracy with its interval beside the baseline, and the registered best model says what it is."""
    from iaa.jobs.evaluation import uncertainty

    tracker, launcher = FakeTracker(), _NamingLauncher()
    result = _sweeper(tiny, tmp_path, tracker, launcher, name="named", num_samples=2)(register="tiny-best")

    label, ray_id = result.best_trial_label, result.best_trial
    assert label.startswith("trial-") and label != ray_id
    parent = tracker.runs[result.parent_run_id]
    assert (parent.params["best.trial_id"], parent.tags["best_trial_id"]) == (label, label)
    assert (parent.params["best.ray_trial_id"], parent.tags["best_ray_trial_id"]) == (ray_id, ray_id)
    n, acc, base = result.best_valid_acc_n, result.best_valid_acc, result.baseline_valid_acc
    assert parent.params["best_valid_acc_n"] == str(n) and n > 0 and acc is not None
    assert parent.last("best_valid_acc_stderr") == pytest.approx(result.best_valid_acc_stderr)
    assert parent.last("baseline_valid_acc") == pytest.approx(base)
    assert_says(parent.tags["mlflow.note.content"], f"({label}, run ",
                f"best valid_acc {uncertainty.accuracy_text(acc, n)}", f"baseline {base:.4f}")
    card = tracker.models[-1]["card"]
    assert tracker.models[-1]["register"] == "tiny-best"
    assert card.tags == {"kind": "reader", "model": "iaa", "dataset": "cbt-ne", "valid_acc": f"{acc:.4f}",
                         "valid_acc_n": str(n), "baseline_valid_acc": f"{base:.4f}"}
    assert_says(card.description, uncertainty.accuracy_text(acc, n), f"The best {label}", "of sweep named",
                parent.tags["best_mlflow_run_id"], result.best_checkpoint)


def test_a_sweep_in_a_relative_work_folder_names_its_files_as_its_next_commands_do(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--workdir iaa-work`` (relative): the config, the record and the explain page are given
    as absolute paths, as the next commands beside them are."""
    from iaa.jobs.tune import tune

    monkeypatch.chdir(tmp_path)
    (tmp_path / "space.yaml").write_text(TINY_SPACE, encoding="utf-8")
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=1, search_space=Path("space.yaml"),
                           sets=TINY_SETS, workdir=Path("work"), name="relative", show_progress=False)
    result = tune.run(req, lambda uri: FakeTracker(), FakeLauncher())
    for path in (result.best_config, result.sweep_json, result.explain_page):
        assert path is not None and Path(path).is_absolute() and Path(path).is_file(), path


def _sweeps(launcher: FakeLauncher) -> list[SweepRequest]:
    return [r for r in launcher.requests if isinstance(r, SweepRequest)]


class _BudgetLauncher(FakeLauncher):
    """A sweep whose time budget ends it with its last two trials stopped where they stood, one of
    them before its first check; ``lost``: its first trial lost its worker before."""

    def __init__(self, lost: bool = False) -> None:
        super().__init__()
        self.lost = lost

    def sweep(self, request):
        from dataclasses import replace

        from iaa.jobs.ports import TIME_BUDGET, WORKER_LOST

        first, *done, stood, unchecked = super().sweep(request)
        if self.lost:
            first = replace(first, status="ERROR", stop_reason=WORKER_LOST, checks=1)
        return [first, *done, replace(stood, stop_reason=TIME_BUDGET, checks=2),
                replace(unchecked, stop_reason=TIME_BUDGET, checks=0, best_valid_acc=None)]


def test_a_sweep_that_spends_its_budget_finishes_with_what_ran_and_its_resume_runs_nothing(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from iaa.jobs.sweeps import record

    tracker, launcher = FakeTracker(), _BudgetLauncher()
    sweep = _sweeper(tiny, tmp_path, tracker, launcher, name="timed", num_samples=4)

    with caplog.at_level("INFO"):
        first = sweep(time_budget_s=600)
    [request] = _sweeps(launcher)
    assert request.plan.time_budget_s == 600
    recorded = record.read(record.sweep_file(tmp_path / "work", "timed"))
    assert recorded.time_budget_s == 600 and recorded.finished
    assert first.cut_trials == tuple(t.label for t in recorded.trials[-2:]) and first.best_valid_acc is not None
    assert first.fields()["cut_trials"] == list(first.cut_trials)
    parent = tracker.runs[recorded.parent_run_id]
    assert parent.state == "FINISHED" and parent.tags["time_budget_s"] == "600"
    assert parent.last("trials_cut") == 2 and "best.trial_id" in parent.params
    assert_says(caplog.text, "time budget of 10m00s ended it with 4 of 4 trials begun", "2 stopped where they stood",
                "1 of them had made no check")

    caplog.clear()
    with caplog.at_level("INFO"):
        again = sweep(resume=True, time_budget_s=7200)
    assert again.nothing_left and len(_sweeps(launcher)) == 1
    assert again.model_uri == first.model_uri is not None                     # the best trial's model, looked up
    assert_says(caplog.text, "nothing left to run", "time budget of 10m00s was spent", "search on from its trials", "`warm_start` timed")


def test_a_trial_lost_before_the_budget_was_spent_stays_lost_and_the_best_is_final(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A resume of a sweep that spent its budget runs nothing, so its lost trial is not run again:
    the warning says so, and the best config is the sweep run's params at once."""
    tracker, launcher = FakeTracker(), _BudgetLauncher(lost=True)
    with caplog.at_level("WARNING"):
        result = _sweeper(tiny, tmp_path, tracker, launcher, name="spent", num_samples=4)(time_budget_s=60)
    assert len(result.lost_trials) == 1 and len(result.cut_trials) == 2
    [warning] = logged(caplog, "WARNING", "lost a worker")
    assert_says(warning, "the time budget is spent, so they stay so")
    assert "best.trial_id" in tracker.runs[result.parent_run_id].params


class _UncheckedLauncher(FakeLauncher):
    """A sweep whose time budget ended every trial before its first check."""

    def sweep(self, request):
        from dataclasses import replace

        from iaa.jobs.ports import TIME_BUDGET

        return [replace(r, stop_reason=TIME_BUDGET, checks=0, best_valid_acc=None) for r in super().sweep(request)]


def test_a_budget_that_ends_every_trial_before_its_first_check_is_one_line_and_a_failed_run(
        tiny: Path, tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.jobs.sweeps import record

    tracker, launcher = FakeTracker(), _UncheckedLauncher()
    sweep = _sweeper(tiny, tmp_path, tracker, launcher, name="short", num_samples=2)
    with pytest.raises(IaaError) as failed:
        sweep(time_budget_s=60)
    assert_says(failed.value, "time budget of 1m00s ended it with 2 of 2 trials begun", "2 of them had made no check",
                "the sweep has no result", "a trial's first check comes after", "`time_budget_s`")
    recorded = record.read(record.sweep_file(tmp_path / "work", "short"))
    assert recorded.finished and tracker.runs[recorded.parent_run_id].state == "FAILED"
    assert all(run.state != "RUNNING" for run in tracker.runs.values())

    with pytest.raises(IaaError) as again:                    # a resume has nothing to run, and no result either
        sweep(resume=True, time_budget_s=3600)
    assert_says(again.value, "nothing left to run", "no trial of it finished a validation check")
    assert len(_sweeps(launcher)) == 1


class _InterruptedLauncher(FakeLauncher):
    """A sweep interrupted with its last trial unfinished twice (a first run and a resume);
    the next resume finishes it."""

    def can_resume(self, placement):
        return True

    def sweep(self, request):
        from dataclasses import replace

        *done, last = super().sweep(request)
        unfinished = len(_sweeps(self)) <= 2
        return [*done, replace(last, status="RUNNING", stop_reason="") if unfinished else last]


def test_an_interrupted_sweep_resumes_with_its_recorded_budget_unless_given_another(
        tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune.request import SweepInterrupted

    tracker, launcher = FakeTracker(), _InterruptedLauncher()
    sweep = _sweeper(tiny, tmp_path, tracker, launcher, name="halted", num_samples=2)
    for more in ({"time_budget_s": 600}, {"resume": True}):
        with pytest.raises(SweepInterrupted):
            sweep(**more)
    sweep(resume=True, time_budget_s=900)
    assert [r.plan.time_budget_s for r in _sweeps(launcher)] == [600, 600, 900]
    recorded = record.read(record.sweep_file(tmp_path / "work", "halted"))
    assert recorded.time_budget_s == 900 and tracker.runs[recorded.parent_run_id].tags["time_budget_s"] == "900"


def test_a_sweep_whose_every_trial_lost_its_worker_is_one_error_naming_its_resume(tiny: Path, tmp_path: Path) -> None:
    from dataclasses import replace

    from iaa.jobs.ports import WORKER_LOST
    from iaa.jobs.tune import tune

    class AllLost(FakeLauncher):
        def sweep(self, request):
            return [replace(t, status="ERROR", stop_reason=WORKER_LOST) for t in super().sweep(request)]

    space = tmp_path / "space.yaml"
    space.write_text(TINY_SPACE, encoding="utf-8")
    tracker = FakeTracker()
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=2, search_space=space, sets=TINY_SETS,
                           workdir=tmp_path / "work", name="gone", show_progress=False)
    with pytest.raises(tune.SweepInterrupted) as caught:
        tune.run(req, lambda uri: tracker, AllLost())
    assert_says(caught.value, "no trial finished; 2 trial(s) lost a worker", "`resume` gone")
    [parent] = [r for r in tracker.runs.values() if r.parent_run_id is None]
    assert parent.state == "KILLED"


@pytest.mark.parametrize("recorded, flag, used", [(None, None, "tpe"), (None, "gp", "tpe"), ("random", None, "random"),
                                                  ("gp", "random", "gp"), ("gp", "gp", "gp")])
def test_a_resumed_sweep_keeps_the_sampler_it_recorded(tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                       recorded: str | None, flag: str | None, used: str) -> None:
    """A record written before samplers were recorded reads as tpe; a --sampler naming another
    sampler than the record's is one warning line, and the record's wins."""
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune import tune

    workdir = tmp_path / "work"
    path = record.sweep_file(workdir, "old")
    path.parent.mkdir(parents=True)
    record.write(path, record.SweepRecord.from_json(
        {"name": "old", "dataset": "cbt-ne", "data_dir": str(tiny), "experiment": "tune-cbt-ne",
         "tracking_uri": str(workdir / "mlruns"), "trials": [], "parent_run_id": "p1",
         "storage": str(workdir / "ray"), "num_samples": 2,
         "search_space": {"params": {"model.hidden_dim": {"choices": [8, 12]}}, "fixed": {}},
         "asha": {"grace_period": 1, "reduction_factor": 2.0},
         "optuna": {"storage": f"sqlite:///{workdir / 'optuna.db'}", "study": "old"},
         **({"sampler": recorded} if recorded else {})}))
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, sets=TINY_SETS, workdir=workdir, name="old", resume=True,
                           sampler=flag, show_progress=False)
    assert tune.settle(req).sampler == used
    warnings = logged(caplog, "WARNING", "continues with the sampler it started with")
    assert len(warnings) == (0 if flag in (None, used) else 1)
    assert all(f"{used}, not {flag}" in w for w in warnings)


def test_the_sweep_line_says_how_many_checks_a_trial_makes(tiny: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str], console: None) -> None:
    """The sweep's opening line gives the checks a trial makes, not ASHA's max_t (one more)."""
    import re

    from iaa.jobs.tune import tune

    space = tmp_path / "space.yaml"
    space.write_text("model.hidden_dim: [8]\n", encoding="utf-8")
    req = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=1, search_space=space, sets=TINY_SETS,
                           workdir=tmp_path / "work", name="checks", show_progress=True)
    tracker = FakeTracker()
    tune.run(req, lambda uri: tracker, FakeLauncher())          # the fake runs each trial to its end: no ASHA
    said = re.search(r"a trial makes at most (\d+) checks?;", capsys.readouterr().err)
    [trial] = json.loads((tmp_path / "work" / "sweeps" / "checks" / "sweep.json").read_text())["trials"]
    assert said and int(said.group(1)) == len(tracker.runs[trial["mlflow_run_id"]].metrics["valid_acc"]), said


def test_ensemble_trains_the_missing_seeds_of_a_sweep_as_members(tiny: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str], console: None) -> None:
    from iaa.errors import IaaError
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
    from iaa.jobs.tune import tune
    from iaa.jobs.workdir import lock
    from iaa.jobs.workdir.paths import Workdir

    space = tmp_path / "space.yaml"
    space.write_text("model.hidden_dim: [8]\n", encoding="utf-8")
    tracker, launcher = FakeTracker(), FakeLauncher()
    work = tmp_path / "work"
    tune.run(tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=1, search_space=space, sets=TINY_SETS,
                              workdir=work, name="one", show_progress=False), lambda uri: tracker, launcher)
    request = EnsembleRequest(sweep="one", data=tiny, top_configs=1, seeds=2, workdir=work,
                              show_progress=False)
    with lock.held(lock.beside(Workdir(work).ensemble("one")), busy=IaaError):   # another process builds it
        with pytest.raises(IaaError) as err:
            ensemble.run(request, tracker, launcher)
        assert_says(err.value, "the ensemble one is being built by another process", "pid", "run the same command")
    assert not [r for r in launcher.requests if isinstance(r, MembersRequest)]
    result = ensemble.run(request, tracker, launcher)

    [members] = [r for r in launcher.requests if isinstance(r, MembersRequest)]
    assert [c.train.seed for c in members.configs] == [1]            # seed 0 is the sweep's own trial
    assert_says(capsys.readouterr().err, "reusing 1 checkpoint,", "training 1 member on")
    # one trial per member, with the threads the members' configs ask for (the largest)
    assert members.connection.num_trials == 1
    assert members.connection.threads == (members.configs[0].train.threads or None)
    assert len(result.members) == 2 and 0 <= result.valid_acc <= 1
    run = tracker.runs[result.mlflow_run_id]
    assert run.state == "FINISHED"
    # the split sizes and standard errors beside its accuracies, as its result names them
    assert run.params["valid_acc_n"] == str(result.valid_acc_n) and result.valid_acc_n > 0
    assert run.last("valid_acc_stderr") == pytest.approx(result.valid_acc_stderr)
    card = tracker.models[-1]["card"]
    assert card.tags == {"kind": "ensemble", "model": "iaa", "dataset": "cbt-ne",
                         "valid_acc": f"{result.valid_acc:.4f}", "valid_acc_n": str(result.valid_acc_n),
                         "baseline_valid_acc": f"{result.baseline_valid_acc:.4f}"}
    assert_says(card.description, "An ensemble of model `iaa` on cbt-ne", "2 of 2 members",
                f"run {run.run_id}", str((work / "ensembles" / "one").resolve()))


@pytest.fixture(scope="module")
def reader(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint trained on ``tiny``."""
    from iaa.jobs.train import train

    folder = tmp_path_factory.mktemp("reader")
    return Path(train.run_tracked(TrainRun(_cfg(tiny), tiny, folder / "run", show_progress=False), FakeTracker()).checkpoint)


def test_an_ensemble_shows_its_accuracies_beside_the_baseline_and_warns_when_not_above_it(
        tiny: Path, reader: Path, tmp_path: Path) -> None:
    """As train, tune and distill do: the most-frequent-candidate accuracies in the result, its
    JSON and its run's metrics, beside its own in the closing lines, and a warning where the
    ensemble is not above the one on valid."""
    from iaa.jobs.ensemble import ensemble, ensemble_result
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
    from iaa.jobs.evaluation import frequency

    tracker = FakeTracker()
    request = EnsembleRequest(members=(reader,), data=tiny, workdir=tmp_path / "work", show_progress=False)
    result = ensemble.run(request, tracker)
    valid, test = frequency.run(tiny, "valid").accuracy, frequency.run(tiny, "test").accuracy
    assert (result.baseline_valid_acc, result.baseline_test_acc) == (valid, test)
    assert {"baseline_valid_acc": valid, "baseline_test_acc": test}.items() <= result.fields().items()
    run = tracker.runs[result.mlflow_run_id]
    assert run.last("baseline_valid_acc") == pytest.approx(valid) and run.last("baseline_test_acc") == pytest.approx(test)
    assert json.loads((Path(result.ensemble_dir) / "ensemble.json").read_text())["baseline_test_acc"] == test
    assert_says(ensemble_result.describe(result), f"(most-frequent-candidate baseline {valid:.4f}",
                f"(most-frequent-candidate baseline {test:.4f}")
    assert result.warnings == () or result.valid_acc <= valid

    record = {k: v for k, v in result.fields().items() if k != "warnings"}
    below = ensemble_result.of_record({**record, "valid_acc": valid, "test_acc": test}, request)
    assert_says(ensemble_result.describe(below), f"{valid:.4f}", f"baseline {valid:.4f}, and not above it",
                f"baseline {test:.4f}, and not above it")
    [warning] = below.warnings
    assert_says(warning, f"the ensemble {result.name}'s valid accuracy {valid:.4f} is not above the "
                         f"most-frequent-candidate baseline {valid:.4f}")


def test_members_of_another_vocabulary_are_refused_before_the_ensemble_opens_its_run(
        reader: Path, tmp_path: Path) -> None:
    """A `data` folder whose vocabulary is not the members': one clear error, and no FAILED run left."""
    from iaa.errors import IaaError
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest

    other = make_tiny_prepared(tmp_path / "other", {"train": 60, "valid": 64, "test": 64})   # another vocabulary
    tracker = FakeTracker()
    with pytest.raises(IaaError) as err:
        ensemble.run(EnsembleRequest(members=(reader,), data=other, workdir=tmp_path / "work",
                                     show_progress=False), tracker)
    assert {run.name: run.state for run in tracker.runs.values()} == {}
    assert_says(err.value, str(reader), "was trained on other data than", str(other), "share one vocabulary")


def test_a_store_that_fails_during_a_sweep_costs_the_trial_its_tracking_not_its_training(tiny: Path) -> None:
    """The real Tune callback on the fake tracker: a store that is down is a warning per trial."""
    pytest.importorskip("ray.tune", reason="the callback is Ray Tune's")
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns

    class Trial:
        trial_id, config, last_result = "t1", {}, {"stop_reason": "patience"}

    tracker = FakeTracker()
    runs = TrialRuns("s")
    side = driver_side.DriverSide(tracker=tracker, experiment="x", parent_run_id=None, dataset="cbt-ne", spec=None)
    with driver_side.bound("s", side):
        tracker.down = True
        runs.on_trial_complete(0, [], Trial())          # warns, does not raise
    assert tracker.runs == {}
