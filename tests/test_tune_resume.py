"""A sweep stopped and resumed, on the fakes of the ports (and the platform's searcher and
callbacks without a cluster): what the stop and the resume say they keep, what a resumed sweep
shows of the trials its earlier run finished, how many trials it runs, how ``--json`` names its
best trial, and that Optuna's own lines stay off the console. Seconds each; the real commands
are in ``test_platform_resume.py``."""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from _faults import assert_says, logged
from _platform import write_space
from _tiny import TINY_SETS, make_tiny_prepared
from fakes import FakeLauncher, FakeTracker, fake_sweeper, tune_on
from iaa.jobs.ports import SweepRequest, TrialRecord

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _sweeps(launcher: FakeLauncher) -> list[SweepRequest]:
    return [r for r in launcher.requests if isinstance(r, SweepRequest)]


class _StoppedLauncher(FakeLauncher):
    """A sweep stopped by Ctrl-C with trial ``a`` finished, ``b`` after a check (so with a
    checkpoint) and ``c`` before its first; resumed, it runs every trial."""

    def can_resume(self, placement) -> bool:
        return True

    def sweep(self, request: SweepRequest):
        if request.resume:
            return super().sweep(request)
        t = request.trials.tracking
        for trial_id, checks, ended in (("a", 2, "FINISHED"), ("b", 1, None), ("c", 0, None)):
            run = t.tracker.start_run(t.experiment, trial_id, tags={"sweep": t.sweep, "trial_id": trial_id},
                                      parent_run_id=t.parent_run_id)
            for check in range(1, checks + 1):
                run.log_metrics({"valid_acc": 0.5, "best_valid_acc": 0.5}, step=check)
            if ended:
                run.end(ended)
            self.saved.append(TrialRecord(trial_id=trial_id, config=request.plan.base, checks=checks,
                                          best_valid_acc=0.5 if checks else None, mlflow_run_id=run.run_id,
                                          status="TERMINATED" if ended else "RUNNING", name=f"trial-{trial_id}"))
        time.sleep(0.3)                           # the sweep ran a while: its record counts it
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)                            # the signal stops the sweep here
        raise AssertionError("the sweep was not stopped")


def test_a_stopped_sweep_and_its_resume_count_as_continuing_only_the_trials_with_a_checkpoint(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from iaa import cli
    from iaa.jobs.reports import sweep_list
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune import stops

    space, tracker, launcher = write_space(tmp_path), FakeTracker(), _StoppedLauncher()
    tune_on(monkeypatch, tracker, launcher)
    work = tmp_path / "work"
    sets = [arg for s in TINY_SETS for arg in ("--set", s)]
    stopped = CliRunner().invoke(cli.cli, ["tune", "--data", str(tiny), "--num-samples", "3", "--search-space",
                                           str(space), *sets, "--name", "k", "--workdir", str(work)])

    assert stopped.exit_code == 130, stopped.output
    [line] = [text for text in stopped.output.splitlines() if text.startswith("interrupted by SIGINT")]
    assert_says(line, "kept 1 finished trial(s) and the last checkpoints of 1 unfinished one(s)",
                "1 unfinished one(s) had made no check")
    assert "had not started" not in line                  # all 3 trials had started
    sweep = record.read(record.sweep_file(work, "k"))
    tally = stops.standing(tracker, sweep.experiment, "k", sweep.parent_run_id)
    assert (tally.finished, tally.unfinished, tally.checkpointed) == (1, 2, 1)
    # the record holds the trials as the run saved them, and the time it ran: listed as interrupted
    assert [(t.label, t.status) for t in sweep.trials] == [("trial-a", "TERMINATED"), ("trial-b", "RUNNING"),
                                                          ("trial-c", "RUNNING")]
    assert sweep.wall_s >= 0.3
    [row] = sweep_list.run(work).sweeps
    assert (row.state, row.trials, row.best_trial) == ("interrupted", 3, "trial-a")

    resumed = CliRunner().invoke(cli.cli, ["tune", "--resume", "k", "--workdir", str(work)])
    assert resumed.exit_code == 0, resumed.output
    [said] = [text for text in resumed.stderr.splitlines() if text.startswith("resuming sweep k:")]
    assert_says(said, "1 of 3 trials finished and kept", "2 left", "of which 1 continue from their last checkpoint",
                "1 start from the beginning")
    assert "starting a local Ray cluster" in resumed.stderr.splitlines()[0]
    assert record.read(record.sweep_file(work, "k")).wall_s > sweep.wall_s      # both parts counted
    [first], (again, second) = sweep.spans, record.read(record.sweep_file(work, "k")).spans
    assert again == first and second[0] >= first[0] + first[1]       # each run's span, the stop between them

    done = CliRunner().invoke(cli.cli, ["tune", "--resume", "k", "--workdir", str(work)])
    assert done.exit_code == 0 and "nothing left to run" in done.stderr, done.output
    assert_says(done.stderr.splitlines()[0], "tune: resuming sweep k", "loading PyTorch, MLflow and Optuna...")
    assert "Ray" not in done.stderr.splitlines()[0]                 # a finished sweep starts no cluster


class _Killed(BaseException):
    """The sweep's process dies here: nothing of it runs any more (SIGKILL, a lost head node)."""


class _KilledLauncher(FakeLauncher):
    """A sweep whose process is killed after its trials stood as ``standing`` (told once, as the
    Ray launcher tells them while they run)."""

    def __init__(self, standing: list[tuple[str, str, float | None]]) -> None:
        super().__init__()
        self.standing = standing

    def can_resume(self, placement) -> bool:
        return True

    def sweep(self, request: SweepRequest):
        assert request.standing is not None, "the sweep's record is not kept as its trials run"
        time.sleep(0.3)                           # the sweep ran a while: its record counts it
        request.standing([TrialRecord(trial_id=trial_id, config=request.plan.base, status=status,
                                      best_valid_acc=best, checks=int(best is not None), name=f"trial-{trial_id}")
                          for trial_id, status, best in self.standing])
        raise _Killed


def test_a_killed_sweeps_record_holds_its_trials_and_time_as_they_last_stood(
        tiny: Path, tmp_path: Path) -> None:
    """No stop is heard when the process is killed: its record is the one kept as its trials ran,
    listed as interrupted with its trials, its best and the time it ran; its resume adds a span."""
    from iaa.jobs.reports import sweep_list
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune import tune

    space, tracker = write_space(tmp_path), FakeTracker()
    launcher = _KilledLauncher([("a", "TERMINATED", 0.75), ("b", "RUNNING", 0.5), ("c", "PENDING", None)])
    request = tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=4, search_space=space, sets=TINY_SETS,
                               workdir=tmp_path / "work", name="k", show_progress=False)
    with pytest.raises(_Killed):
        tune.run(request, lambda uri: tracker, launcher)

    sweep = record.read(record.sweep_file(tmp_path / "work", "k"))
    assert [(t.label, t.status) for t in sweep.trials] == [("trial-a", "TERMINATED"), ("trial-b", "RUNNING"),
                                                          ("trial-c", "PENDING")]
    [(started, seconds)] = sweep.spans
    assert seconds >= 0.3 and sweep.wall_s >= 0.3
    [row] = sweep_list.run(tmp_path / "work").sweeps
    assert (row.state, row.trials, row.ended, row.best_trial) == ("interrupted", 3, 1, "trial-a")

    launcher.standing = [("a", "TERMINATED", 0.75)]
    with pytest.raises(_Killed):                  # killed again on its resume
        tune.run(replace(request, resume="k", name=None), lambda uri: tracker, launcher)
    first, again = record.read(record.sweep_file(tmp_path / "work", "k")).spans
    assert first == (started, seconds) and again[0] >= started + seconds


def test_a_trial_that_runs_again_one_a_stop_cut_off_takes_its_run_and_name(tmp_path: Path) -> None:
    """A resumed sweep's new trial ``c`` that runs again trial ``b``, which a stop cut off before
    Tune saved it (``DriverSide.again``), goes on in ``b``'s run, RUNNING again under its name:
    one run per trial, found by ``c`` from then on, and the sweep's tally counts it once."""
    from iaa.jobs.config.job_config import JobConfig, to_dict
    from iaa.jobs.tune import stops
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.trials.trial import TrialSpec
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns

    tracker = FakeTracker()
    parent = tracker.start_run("e", "s")
    cut = tracker.start_run("e", "trial-0001 h=8", parent_run_id=parent.run_id,
                            tags={"sweep": "s", "trial_id": "b", "trial_number": "0001", "interrupted": "SIGINT"})
    cut.end("KILLED")
    spec = TrialSpec(name="s", fit=None, storage_path=str(tmp_path), workers=1, threads=1, base=to_dict(JobConfig()))
    side = driver_side.DriverSide(tracker=tracker, experiment="e", parent_run_id=parent.run_id, dataset="demo",
                                  spec=spec, numbers={"c": 2}, again={"c": "b"})
    with driver_side.bound("s", side):
        TrialRuns("s").on_trial_start(0, [], _trial("c"))

    assert side.run_ids == {"c": cut.run_id} and side.names == {"c": "trial-0001"}
    assert cut.state == "RUNNING" and cut.tags["trial_id"] == "c" and "interrupted" not in cut.tags
    assert len(tracker.find_runs("e", {"sweep": "s"})) == 1                        # one run for the trial
    tally = stops.standing(tracker, "e", "s", parent.run_id)
    assert (tally.finished, tally.unfinished) == (0, 1)


def test_a_check_a_resumed_trial_makes_again_is_logged_once(tmp_path: Path) -> None:
    """A sweep stopped just after a trial's check, before Tune saved it, resumes the trial from the
    checkpoint before: it makes that check again, with the same values, and its run keeps one."""
    from iaa.jobs.config.job_config import JobConfig, to_dict
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.trials.trial import TrialSpec
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns

    tracker = FakeTracker()
    parent = tracker.start_run("e", "s")
    run = tracker.start_run("e", "trial-0000 h=8", parent_run_id=parent.run_id,
                            tags={"sweep": "s", "trial_id": "a", "trial_number": "0000"})
    for step, acc in ((10, 0.3), (20, 0.5)):
        run.log_metrics({"valid_acc": acc, "train_loss": 2 - acc}, step=step)
    run.end("KILLED")
    spec = TrialSpec(name="s", fit=None, storage_path=str(tmp_path), workers=1, threads=1, base=to_dict(JobConfig()))
    side = driver_side.DriverSide(tracker=tracker, experiment="e", parent_run_id=parent.run_id, dataset="demo",
                                  spec=spec)
    runs, trial = TrialRuns("s"), _trial("a")
    with driver_side.bound("s", side):
        runs.on_trial_start(0, [], trial)
        for step, acc in ((20, 0.5), (30, 0.7)):            # from the checkpoint of step 10
            runs.on_trial_result(0, [], trial, {"valid_acc": acc, "train_loss": 2 - acc, "step": step})

    assert [p.step for p in tracker.metric_history(run.run_id, "valid_acc")] == [10, 20, 30]
    assert [p.step for p in tracker.metric_history(run.run_id, "train_loss")] == [10, 20, 30]


def _trial(trial_id: str, **last: object) -> SimpleNamespace:
    return SimpleNamespace(trial_id=trial_id, config={"model.hidden_dim": 8}, status="TERMINATED",
                           last_result=dict(last), pickled_error_file=None, error_file=None)


def test_a_resumed_sweep_does_not_start_or_finish_again_on_the_console_a_trial_its_earlier_run_finished(
        tmp_path: Path) -> None:
    """Tune restores a trial that finished after its last saved state from its final checkpoint
    and ends it at once: the console says nothing of it (it was kept, with its checks), and its
    run stays as it ended. One that does report here is told with what it reports."""
    from iaa.jobs.config.job_config import JobConfig, to_dict
    from iaa.jobs.sweeps.console import SweepConsole
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.trials.trial import TrialSpec
    from iaa.platform.sweeps.trials.trial_runs import ConsoleCallback, TrialRuns

    tracker, said = FakeTracker(), []
    parent = tracker.start_run("e", "s")
    kept = {}
    for trial_id, number in (("a", "0002"), ("c", "0003")):
        kept[trial_id] = tracker.start_run("e", f"trial-{number}", parent_run_id=parent.run_id,
                                           tags={"sweep": "s", "trial_id": trial_id, "trial_number": number})
        kept[trial_id].log_metrics({"valid_acc": 0.8295}, step=2)
        kept[trial_id].end("FINISHED")
    console = SweepConsole(None, ["model.hidden_dim"], say=said.append)
    spec = TrialSpec(name="s", fit=None, storage_path=str(tmp_path), workers=1, threads=1, base=to_dict(JobConfig()))
    side = driver_side.DriverSide(tracker=tracker, experiment="e", parent_run_id=parent.run_id, dataset="demo",
                                  spec=spec, console=console, numbers={"b": 4})
    runs, shown = TrialRuns("s"), ConsoleCallback("s")
    finished = {"checks": 2, "best_valid_acc": 0.8295, "valid_acc": 0.8295, "stop_reason": "max-epochs"}
    a, b, c = _trial("a", **finished), _trial("b"), _trial("c", **finished)
    with driver_side.bound("s", side):
        for trial in (a, b, c):                        # as Tune calls them: the runs' callback first
            runs.on_trial_start(0, [], trial)
            shown.on_trial_start(0, [], trial)
        b.last_result = {"checks": 1, "valid_acc": 0.5, "best_valid_acc": 0.5, "epoch": 1.0, "stop_reason": "max-epochs"}
        for trial in (b, c):
            runs.on_trial_result(0, [], trial, trial.last_result)
            shown.on_trial_result(0, [], trial, trial.last_result)
        for trial in (a, b, c):
            runs.on_trial_complete(0, [], trial)
            shown.on_trial_complete(0, [], trial)

    assert "trial-0002" not in console.trials and not [line for line in said if "trial-0002" in line]
    assert kept["a"].state == "FINISHED" and "stop_reason" not in kept["a"].tags     # left as it ended
    assert console.trials["trial-0004"].state == "finished" and console.trials["trial-0004"].checks == 1
    assert (console.trials["trial-0003"].checks, console.trials["trial-0003"].best) == (2, 0.8295)
    [ended] = [line for line in said if "trial-0003 finished" in line]
    assert_says(ended, "after 2 checks", "0.8295")
    assert side.finished_before == {"a", "c"}


def test_the_trials_standing_is_told_once_tunes_save_holds_a_start_or_end_and_every_half_minute(
        tmp_path: Path) -> None:
    """Told on the step after a trial's start or end has had time to be saved, then not again
    until a trial starts or ends or ``EVERY_S`` passes; pickled, the callback holds only its name."""
    import pickle

    from iaa.jobs.config.job_config import JobConfig, to_dict
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.trials import standing as kept
    from iaa.platform.sweeps.trials.trial import TrialSpec

    now, told = [0.0], []
    spec = TrialSpec(name="s", fit=None, storage_path=str(tmp_path), workers=1, threads=1, base=to_dict(JobConfig()))
    side = driver_side.DriverSide(tracker=FakeTracker(), experiment="e", parent_run_id=None, dataset="demo", spec=spec,
                                  standing=lambda live: told.append((now[0], [t.trial_id for t in live])))
    callback, lag = kept.StandingCallback("s", clock=lambda: now[0]), kept.saved_within()
    a, b = _trial("a"), _trial("b")

    def step(at: float) -> None:
        now[0] = at
        callback.on_step_end(0, [a, b])

    with driver_side.bound("s", side):
        callback.on_trial_start(0, [a], a)
        step(lag - 0.5)
        assert told == []                                 # Tune's save may not hold it yet
        step(lag)
        assert told == [(lag, ["a", "b"])]
        step(lag + 1)
        callback.on_trial_complete(0, [a, b], a)
        step(2 * lag + 0.5)
        step(2 * lag + 1)
        assert [at for at, _ in told] == [lag, 2 * lag + 1]
        step(2 * lag + 1 + kept.EVERY_S - 1)
        step(2 * lag + 1 + kept.EVERY_S)                  # nothing started or ended: every EVERY_S
        assert [at for at, _ in told] == [lag, 2 * lag + 1, 2 * lag + 1 + kept.EVERY_S]
    step(1000.0)                                          # no process runs the sweep: no one to tell
    assert len(told) == 3
    assert vars(pickle.loads(pickle.dumps(callback)))["sweep"] == "s"


def test_the_trials_standing_that_cannot_be_read_is_one_warning_and_a_full_disk_stops_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from iaa.files import DiskFullError
    from iaa.jobs.config.job_config import JobConfig, to_dict
    from iaa.jobs.ports import TrialTracking
    from iaa.platform.sweeps import driver_side, launch
    from iaa.platform.sweeps.trials.trial import TrialSpec

    spec = TrialSpec(name="s-run", fit=None, storage_path=str(tmp_path), workers=1, threads=1,
                     base=to_dict(JobConfig()))
    side = driver_side.DriverSide(tracker=FakeTracker(), experiment="e", parent_run_id=None, dataset="demo", spec=spec)
    tracking = TrialTracking(tracker=side.tracker, experiment="e", parent_run_id=None, sweep="s", dataset="demo",
                             data_dir=tmp_path)
    request = SimpleNamespace(standing=lambda trials: None, trials=SimpleNamespace(tracking=tracking))
    failures = iter([OSError("the results are being written"), OSError("again"), DiskFullError("disk full")])

    def unreadable(*args, **kwargs):
        raise next(failures)

    monkeypatch.setattr(launch, "_saved_trials", unreadable)
    with caplog.at_level(logging.WARNING):
        for _ in range(2):
            launch._tell_standing(request, spec, side, [_trial("a")])
    [said] = logged(caplog, "WARNING", "sweep s:")
    assert_says(said, "not kept up to date", "the results are being written", "written when the sweep ends")
    assert side.full == []
    launch._tell_standing(request, spec, side, [_trial("a")])
    assert [str(err) for err in side.full] == ["disk full"]          # the run ends at its next step


def test_a_resumed_searcher_opens_its_study_without_optunas_own_lines(tmp_path: Path) -> None:
    """Tune brings the searcher back from its pickle, not through ``searcher()``: opening the
    study there must hold Optuna's INFO lines back all the same."""
    import pickle

    import optuna

    from iaa.jobs.config import search_space
    from iaa.jobs.config.job_config import JobConfig
    from iaa.platform.sweeps.search import search_algorithm as search
    from tests._study import bound_study

    class Kept(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(record.getMessage())

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    kept, level = Kept(), optuna.logging.get_verbosity()
    logging.getLogger("optuna").addHandler(kept)
    try:
        with bound_study(url, "s"):
            search.searcher(space, seed=0, sweep="s").suggest("a")
            saved = pickle.dumps(search.searcher(space, seed=0, sweep="s"))
            optuna.logging.set_verbosity(optuna.logging.INFO)          # a new process's Optuna
            pickle.loads(saved).suggest("b")                          # the resumed sweep's searcher
    finally:
        logging.getLogger("optuna").removeHandler(kept)
        optuna.logging.set_verbosity(level)
    assert len(optuna.load_study(study_name="s", storage=url).trials) == 2
    assert kept.lines == []


class _NamedLauncher(FakeLauncher):
    """Trials named as the Ray launcher names them (``trial-0000`` ...), their Tune ids apart."""

    def sweep(self, request: SweepRequest):
        return [replace(r, name=f"trial-{i:04d}") for i, r in enumerate(super().sweep(request))]


def test_tune_json_names_its_best_trial_by_tune_id_and_by_the_name_the_rest_use(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.sweeps import record

    result = fake_sweeper(tiny, tmp_path, FakeTracker(), _NamedLauncher())("named")
    shown = json.loads(json.dumps(result.fields()))
    rows = record.read(record.sweep_file(tmp_path / "work", "named")).trials
    [best] = [r for r in rows if r.trial_id == shown["best_trial"]]         # the key keeps its meaning
    assert shown["best_trial_label"] == best.name == best.label and best.name.startswith("trial-")
    assert shown["best_trial_label"] in shown["tied_trials"]


def test_a_finished_sweeps_resume_says_a_new_num_samples_is_not_used(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from iaa.jobs.sweeps import record

    launcher = FakeLauncher()
    sweep = fake_sweeper(tiny, tmp_path, FakeTracker(), launcher)
    sweep("done")
    path = record.sweep_file(tmp_path / "work", "done")
    before = path.read_bytes()
    with caplog.at_level(logging.INFO):
        again = sweep("done", resume=True, num_samples=4)
    assert again.nothing_left and len(_sweeps(launcher)) == 1 and path.read_bytes() == before
    [warning] = logged(caplog, "WARNING", "num_samples")
    assert_says(warning, "`num_samples` 4 is not used", "sweep done is finished", "`warm_start` done")

    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert sweep("done", resume=True).nothing_left                              # its own number: no warning
    assert not logged(caplog, "WARNING", "num_samples")

    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert sweep("done", resume=True, time_budget_s=7200.0).nothing_left     # more time: not used either
    [warning] = logged(caplog, "WARNING", "time_budget_s")
    assert_says(warning, "`time_budget_s` 2h00m is not used", "no more trials nor time")


def test_a_finished_sweeps_resume_makes_the_best_outputs_a_failure_left_unmade(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The sweep failed after its trials (a full store, a crash) before its best trial's explain
    page and logged model were made: its resume makes them, and makes nothing twice."""
    tracker = FakeTracker()
    sweep = fake_sweeper(tiny, tmp_path, tracker, FakeLauncher())
    first = sweep("done")
    page, figure = Path(first.explain_page), Path(first.explain_png)
    page.unlink()
    figure.unlink()
    tracker.models = [m for m in tracker.models if m["run_id"] != first.best_mlflow_run_id]
    with caplog.at_level(logging.INFO):
        again = sweep("done", resume=True)
    assert again.nothing_left and page.is_file() and figure.is_file() and again.explain_page == str(page)
    assert again.model_uri == f"runs:/{first.best_mlflow_run_id}/model" and again.best_mlflow_run_id
    [line] = logged(caplog, "INFO", "made now")
    assert_says(line, "explain page", "logged model", first.best_trial_label)
    models = len(tracker.models)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert sweep("done", resume=True).model_uri == again.model_uri
    assert len(tracker.models) == models and not logged(caplog, "INFO", "made now")


class _ResumableLauncher(FakeLauncher):
    def can_resume(self, placement) -> bool:
        return True


def test_a_finished_sweep_whose_record_was_given_more_trials_is_refused_in_one_line_naming_the_key(
        tiny: Path, tmp_path: Path) -> None:
    """Its run holds its best config as params, which more trials could not change: the resume
    runs nothing and says how to search on, never that trials are left."""
    from iaa.jobs.sweeps import record
    from iaa.jobs.workdir.fields import RecordError

    tracker, launcher = FakeTracker(), _ResumableLauncher()
    sweep = fake_sweeper(tiny, tmp_path, tracker, launcher)
    sweep("raised")
    path = record.sweep_file(tmp_path / "work", "raised")
    path.write_text(json.dumps({**json.loads(path.read_text()), "num_samples": 4}), encoding="utf-8")
    before, runs = path.read_bytes(), {r.run_id: (r.state, dict(r.params)) for r in tracker.runs.values()}

    with pytest.raises(RecordError) as refused:
        sweep("raised", resume=True)
    assert_says(refused.value, str(path), "num_samples", "finished with 2 trials", "asks for 4",
                "takes no more trials", "`warm_start` raised")
    assert len(_sweeps(launcher)) == 1 and path.read_bytes() == before
    assert {r.run_id: (r.state, dict(r.params)) for r in tracker.runs.values()} == runs


class _InterruptedLauncher(FakeLauncher):
    """A sweep whose first run leaves its last trial unfinished; a resume finishes it."""

    def can_resume(self, placement) -> bool:
        return True

    def sweep(self, request: SweepRequest):
        *done, last = super().sweep(request)
        return [*done, last if request.resume else replace(last, status="RUNNING", stop_reason="")]


def test_a_resume_runs_the_number_of_trials_it_is_given_and_its_record_keeps_it(tiny: Path, tmp_path: Path) -> None:
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune.request import SweepInterrupted

    launcher, tracker = _InterruptedLauncher(), FakeTracker()
    sweep = fake_sweeper(tiny, tmp_path, tracker, launcher)
    with pytest.raises(SweepInterrupted):
        sweep("more")
    result = sweep("more", resume=True, num_samples=3)
    assert [r.plan.num_samples for r in _sweeps(launcher)] == [2, 3] and result.trials == 3
    recorded = record.read(record.sweep_file(tmp_path / "work", "more"))
    assert recorded.num_samples == 3 and recorded.finished
    parent = tracker.runs[recorded.parent_run_id]
    assert parent.params["tune.num_samples"] == "2" and parent.tags["num_samples"] == "3"   # began with 2, asks 3


def test_a_resume_runs_its_trials_on_what_the_sweep_began_with_unless_told_otherwise(
        tiny: Path, tmp_path: Path) -> None:
    """``--resume NAME`` alone (the line a stop prints) places the trials left as the first ones
    were (workers per trial, GPUs per worker) and registers the best under the name the sweep
    began with; a value the resume's command line gives wins, and the record keeps it."""
    from iaa.jobs.ports import ConnectRequest
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune.request import SweepInterrupted

    launcher, tracker = _InterruptedLauncher(), FakeTracker()
    sweep = fake_sweeper(tiny, tmp_path, tracker, launcher)
    with pytest.raises(SweepInterrupted):
        sweep("placed", workers_per_trial=2, gpus_per_worker=0.5, register="reader", max_concurrent=1)
    path = record.sweep_file(tmp_path / "work", "placed")
    began = record.read(path)
    assert (began.workers_per_trial, began.gpus_per_worker, began.register) == (2, 0.5, "reader")

    result = sweep("placed", resume=True, gpus_per_worker=0.0)
    connects = [r for r in launcher.requests if isinstance(r, ConnectRequest)]
    assert [(c.workers_per_trial, c.gpus_per_worker, c.max_concurrent) for c in connects] == [(2, 0.5, 1),
                                                                                                (2, 0.0, 1)]
    assert tracker.models[-1]["register"] == "reader" and result.model_uri.startswith("models:/reader/")
    assert record.read(path).gpus_per_worker == 0.0          # what the resume ran on, for the next one


def test_a_resumed_sweeps_resume_line_names_the_store_it_recorded(tiny: Path, tmp_path: Path) -> None:
    """A sweep tracked on a server, resumed without `--tracking-uri` (its record names the store),
    prints lines that reach that server again, not a new store in the work folder."""
    from iaa.jobs.tune.request import SweepInterrupted

    class Served(FakeTracker):
        uri = "http://mlflow.example:5000"

    launcher = _InterruptedLauncher()
    sweep = fake_sweeper(tiny, tmp_path, Served(), launcher)
    with pytest.raises(SweepInterrupted) as first:
        sweep("served", tracking_uri=Served.uri)
    assert_says(first.value, f"`tracking_uri` {Served.uri}")
    resumed = sweep("served", resume=True)
    recording = [c for c in resumed.next if c.name in ("train", "ensemble")]
    assert recording and all(dict(c.options).get("tracking_uri") == Served.uri for c in recording)


def test_a_sweep_on_a_cluster_prints_lines_that_go_back_to_it(tiny: Path, tmp_path: Path) -> None:
    """Run as printed, a resume line reaches the cluster the sweep ran on, not a local Ray; its
    training next lines name the cluster's storage too, and its record the address."""
    from iaa.jobs.reports import sweep_list
    from iaa.jobs.sweeps import record
    from iaa.jobs.tune.request import SweepInterrupted

    head, shared = "10.0.0.7:6379", str(tmp_path / "shared")
    sweep = fake_sweeper(tiny, tmp_path, FakeTracker(), _InterruptedLauncher())
    with pytest.raises(SweepInterrupted) as stopped:
        sweep("far", address=head, storage_path=shared)
    assert_says(stopped.value, f"`resume` far `workdir` {tmp_path / 'work'} `address` {head}")
    path = record.sweep_file(tmp_path / "work", "far")
    assert record.read(path).address == head
    listed = sweep_list.summary(record.read(path), path.parent, {"workdir": str(tmp_path / "work")})
    assert f"`address` {head}" in listed.resume
    resumed = sweep("far", resume=True, address=head)
    trains = {c.name: dict(c.options) for c in resumed.next if c.name in ("train", "ensemble")}
    assert trains and all(o["address"] == head and o["storage_path"] == shared for o in trains.values())
    report = next(c for c in resumed.next if c.name == "report")
    assert "address" not in dict(report.options)                     # report takes no cluster


def test_a_restored_search_creates_trials_up_to_the_number_the_resume_asks_for(tmp_path: Path) -> None:
    """Tune restores its search generator with the number of trials the run was saved with; a
    resume that asks for more (a raised ``num_samples``, given or in the record) must get them,
    or the sweep would say trials are left and run none."""
    from iaa.jobs.config import search_space
    from iaa.jobs.config.job_config import JobConfig
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.search import search_algorithm as search
    from iaa.platform.sweeps.launch import ResumableSearch
    from iaa.platform.sweeps.trials.trial import TrialSpec

    space = search_space.parse({"model.steps": [1, 2, 3]}, JobConfig())
    spec = TrialSpec(name="s", fit=None, storage_path=str(tmp_path), workers=1, threads=1)
    saved = {"counter": 4, "total_samples": 4, "finished": False, "experiment": None}   # a run that made its 4
    for asked, left in ((6, True), (None, False)):
        side = driver_side.DriverSide(tracker=None, experiment="s", parent_run_id=None, dataset="", spec=spec,
                                      num_samples=asked)
        with driver_side.bound("s", side):
            restored = ResumableSearch(search.searcher(space, seed=0), max_concurrent=1, sweep="s")
            restored.set_state(dict(saved))
        assert restored.total_samples == (asked or 4) and restored.is_finished() is not left


def test_a_stopped_sweep_counts_the_trials_that_had_not_started(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from iaa import cli

    tune_on(monkeypatch, FakeTracker(), _StoppedLauncher())
    sets = [arg for s in TINY_SETS for arg in ("--set", s)]
    stopped = CliRunner().invoke(cli.cli, ["tune", "--data", str(tiny), "--num-samples", "5", "--search-space",
                                           str(write_space(tmp_path)), *sets, "--name", "k",
                                           "--workdir", str(tmp_path / "work")])

    assert stopped.exit_code == 130, stopped.output
    [line] = [text for text in stopped.output.splitlines() if text.startswith("interrupted by SIGINT")]
    assert_says(line, "kept 1 finished trial(s)", "2 of its 5 trials had not started")
