"""Ctrl-C and SIGTERM (:mod:`iaa.jobs.interrupt`): a command stops at once, leaves no run
RUNNING, and says in one line what it kept and the exact command that resumes; a resumed sweep
needs only its name. In-process on the fakes of the ports (tests/fakes.py), seconds each; the
real commands in their own processes are in ``test_interrupt_commands.py``."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from _faults import assert_says
from fakes import FakeLauncher, FakeRun, FakeTracker, tune_on
from iaa.jobs.ports import SweepRequest
from _platform import write_space
from _tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _sets() -> list[str]:
    return [arg for s in TINY_SETS for arg in ("--set", s)]


@pytest.mark.parametrize("relative", [False, True], ids=["absolute-run-dir", "relative-run-dir-default-workdir"])
def test_train_stopped_by_sigint_ends_its_run_killed_and_its_resume_line_runs(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool) -> None:
    """The resume line continues the run's tracked run, also where the run was started with a
    relative ``--run-dir`` in the default work folder, and the line is run from another folder:
    it names both by their absolute paths (the tag names the folder's resolved place)."""
    from iaa import cli

    tracker = FakeTracker()
    monkeypatch.setattr(cli.training, "open_tracker", lambda uri: tracker)
    logged = FakeRun.log_metrics
    sent: list[int] = []

    def log_then_ctrl_c(self: FakeRun, metrics, step=None) -> None:       # Ctrl-C after the first check
        logged(self, metrics, step)
        if not sent and "valid_acc" in metrics:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(FakeRun, "log_metrics", log_then_ctrl_c)
    run_dir = tmp_path / "my run"
    monkeypatch.chdir(tmp_path)
    given = "my run" if relative else str(run_dir)
    workdir = ["iaa-work"] if relative else [str(tmp_path / "work")]
    args = ["train", "--data", str(tiny), *_sets(), "--run-dir", given, "--workdir", *workdir]
    before = signal.getsignal(signal.SIGINT)     # Python's handler, or SIG_IGN under a background shell job
    stopped = CliRunner().invoke(cli.cli, args)

    assert stopped.exit_code == 130, stopped.output
    [line] = [text for text in stopped.output.splitlines() if text.startswith("interrupted by SIGINT")]
    assert "Traceback" not in stopped.output and "Aborted" not in stopped.output
    [run] = tracker.runs.values()
    assert run.state == "KILLED" and run.tags["interrupted"] == "SIGINT" and run.tags["run_dir"] == str(run_dir.resolve())
    assert signal.getsignal(signal.SIGINT) is before                            # the handlers are given back

    command = line.split("resume with: ", 1)[1]
    argv = shlex.split(command)
    assert argv[:2] == ["iaa-cli", "train"] and argv[-1] == "--resume" and str(run_dir) in argv
    assert argv[argv.index("--workdir") + 1] == str(tmp_path / ("iaa-work" if relative else "work"))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    resumed = CliRunner().invoke(cli.cli, argv[1:])
    assert resumed.exit_code == 0, resumed.output
    assert list(tracker.runs) == [run.run_id] and run.state == "FINISHED"   # the same run, continued


def test_train_stopped_before_its_first_checkpoint_says_to_run_it_again_not_to_resume(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C before the first check leaves no checkpoint: the line says there is nothing to
    resume and gives the command that starts the run again, which runs as printed."""
    from iaa import cli

    tracker = FakeTracker()
    monkeypatch.setattr(cli.training, "open_tracker", lambda uri: tracker)
    logged = FakeRun.log_params

    def log_then_ctrl_c(self: FakeRun, params) -> None:                   # as the run starts
        logged(self, params)
        os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(FakeRun, "log_params", log_then_ctrl_c)
    run_dir = tmp_path / "run"
    args = ["train", "--data", str(tiny), *_sets(), "--run-dir", str(run_dir), "--workdir", str(tmp_path / "work")]
    stopped = CliRunner().invoke(cli.cli, args)

    assert stopped.exit_code == 130, stopped.output
    [line] = [text for text in stopped.output.splitlines() if text.startswith("interrupted by SIGINT")]
    assert_says(line, "before its first checkpoint, so there is nothing to resume", "run it again with: iaa-cli train")
    argv = shlex.split(line.split("run it again with: ", 1)[1])
    assert "--resume" not in argv and str(run_dir) in argv
    monkeypatch.setattr(FakeRun, "log_params", logged)
    again = CliRunner().invoke(cli.cli, argv[1:])
    assert again.exit_code == 0, again.output


def test_a_second_signal_exits_at_once_after_the_marks(tmp_path: Path) -> None:
    marks = tmp_path / "marks.txt"
    script = textwrap.dedent(f"""
        import os, signal, time
        from iaa.jobs import interrupt

        def mark(name):
            if not os.path.exists({str(marks)!r}):
                open({str(marks)!r}, "w").close()
                os.kill(os.getpid(), signal.SIGINT)  # the second Ctrl-C arrives while the marks run
                time.sleep(5)
            with open({str(marks)!r}, "a") as f:
                f.write(name + "\\n")

        with interrupt.stoppable("iaa-cli tune --resume s") as stop:
            stop.on_stop(mark)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
        print("not reached")
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert time.monotonic() - started < 4.5            # neither the first mark's 5 s nor the block's 30 s
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    assert marks.read_text().splitlines()[-1] == "SIGTERM"                # marked before it exited
    assert "interrupted by SIGTERM: resume with: iaa-cli tune --resume s" in proc.stderr
    assert "not reached" not in proc.stdout and "Traceback" not in proc.stderr


def _second_signal(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """Run ``script`` (with ``MARKS`` and ``CHILD`` files under ``tmp_path``); a hang fails the test."""
    marks, child = tmp_path / "marks.txt", tmp_path / "child.pid"
    code = f"MARKS, CHILD = {str(marks)!r}, {str(child)!r}\n" + textwrap.dedent(script)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def test_a_second_signal_marks_even_while_the_main_thread_holds_what_the_marks_need(tmp_path: Path) -> None:
    proc = _second_signal("""
        import os, signal, threading, time
        from iaa.jobs import interrupt

        store = threading.Lock()          # as a tracking store's write transaction

        def mark(name):
            with store:
                with open(MARKS, "a") as f:
                    f.write(name + "\\n")

        with interrupt.stoppable("iaa-cli train --resume") as stop:
            stop.on_stop(mark)
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(30)
            finally:
                with store:                   # the second Ctrl-C comes in the middle of a write
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(0.5)
        print("not reached")
    """, tmp_path)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    assert "SIGINT" in (tmp_path / "marks.txt").read_text().splitlines()
    assert [line for line in proc.stderr.splitlines() if line.startswith("interrupted by")] == [
        "interrupted by SIGINT: resume with: iaa-cli train --resume"]
    assert "Traceback" not in proc.stderr and "not reached" not in proc.stdout


def test_a_second_signal_ends_the_processes_this_one_started(tmp_path: Path) -> None:
    proc = _second_signal("""
        import os, signal, subprocess, sys, time
        from iaa.jobs import interrupt

        with interrupt.stoppable("iaa-cli ensemble") as stop:
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            with open(CHILD, "w") as f:
                f.write(str(child.pid))
            stop.on_stop(lambda name: (os.kill(os.getpid(), signal.SIGINT), time.sleep(5)))
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(30)
    """, tmp_path)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not _alive(int((tmp_path / "child.pid").read_text()))


def _alive(pid: int, within_s: float = 2.0) -> bool:
    """Whether ``pid`` still runs (a zombie does not) after ``within_s`` seconds at most."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return False
        except OSError:
            return False
        time.sleep(0.05)
    return True


class _Killed(BaseException):
    """Stands for a kill -9 of the sweep's process in the middle of its trials."""


class _DyingLauncher(FakeLauncher):
    """A sweep that starts one trial's child run and dies; a resumed one runs every trial."""

    def can_resume(self, placement) -> bool:
        return True

    def sweep(self, request: SweepRequest):
        if not request.resume:
            t = request.trials.tracking
            t.tracker.start_run(t.experiment, "lost", tags={"sweep": t.sweep, "trial_id": "t0"},
                                parent_run_id=t.parent_run_id)
            raise _Killed
        return super().sweep(request)


def test_tune_resume_by_name_alone_marks_leftovers_and_prints_the_console(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from iaa import cli

    space, tracker, launcher = write_space(tmp_path), FakeTracker(), _DyingLauncher()
    tune_on(monkeypatch, tracker, launcher)
    work = tmp_path / "work"
    with pytest.raises(_Killed):
        CliRunner().invoke(cli.cli, ["tune", "--data", str(tiny), "--num-samples", "2", "--search-space", str(space),
                                     *_sets(), "--name", "k", "--workdir", str(work)], catch_exceptions=False)
    for run in tracker.runs.values():                 # what a kill -9 leaves: nothing marked
        run.state = "RUNNING"
    [lost] = [r for r in tracker.runs.values() if r.name == "lost"]

    resumed = CliRunner().invoke(cli.cli, ["tune", "--resume", "k", "--workdir", str(work)])

    assert resumed.exit_code == 0, resumed.output
    assert lost.state == "KILLED" and "killed" in lost.tags
    assert launcher.failed_trials and "killed" in launcher.failed_trials[0]   # the study's unfinished trials
    request = next(r for r in launcher.requests if isinstance(r, SweepRequest) and r.resume)
    assert request.plan.base.model.embed_dim == 16 and request.plan.num_samples == 2   # the record's, not presets
    assert sorted(request.plan.space.params) == ["model.hidden_dim", "model.steps"]
    err = resumed.stderr
    # the lost trial's run made no check, so it has no checkpoint: it starts again from the beginning
    assert_says(err, "resuming sweep k:", "0 of 2 trials finished", "2 left", "0 continue", "2 start from the beginning")
    assert "cost: " in err and "trial trial00000 started" in err and "sweep took" in err
    assert "rank  trial" in err                                                  # the final table


def test_a_stop_fails_the_studys_running_trials_and_a_resumed_trial_goes_on_in_a_new_one(
        tiny: Path, tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    pytest.importorskip("ray")
    from optuna.trial import TrialState

    from iaa.jobs.config import search_space
    from iaa.jobs.datasets import resolve
    from iaa.platform.sweeps.search import search_algorithm
    from iaa.platform.sweeps.studies.endings import fail_unfinished
    from tests._study import bound_study

    base = resolve.job_config("cbt-ne", tiny, sets=TINY_SETS)
    space = search_space.parse({"model.hidden_dim": [8, 12]}, base)
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    with bound_study(url, "s"):
        searcher = search_algorithm.searcher(space, 0, "s")
        config = searcher.suggest("t1")
        searcher.on_trial_result("t1", {"valid_acc": 0.4, "checks": 1})

        assert fail_unfinished(url, "s", {"interrupted": "SIGINT"}) == 1
        study = searcher.study
        [stopped] = study.get_trials()
        assert stopped.state == TrialState.FAIL and stopped.user_attrs["interrupted"] == "SIGINT"

        searcher.on_trial_result("t1", {"valid_acc": 0.6, "checks": 2})             # the resumed trial goes on
        searcher.on_trial_complete("t1", {"valid_acc": 0.6, "best_valid_acc": 0.6, "checks": 2,
                                          "stop_reason": "max-epochs"})
        [_, continued] = study.get_trials()
        assert continued.state == TrialState.COMPLETE and continued.value == pytest.approx(0.6)
        assert continued.params == stopped.params == {k: v for k, v in config.items() if k in space.params}
        assert continued.intermediate_values == {1: 0.4, 2: 0.6}
        assert continued.user_attrs["continues_trial"] == stopped.number and "interrupted" not in continued.user_attrs


def test_a_first_signal_inside_a_held_block_stops_right_after_it_not_halfway() -> None:
    from iaa import signals
    from iaa.jobs import interrupt

    steps: list[str] = []
    with pytest.raises(interrupt.Interrupted):
        with interrupt.stoppable("iaa-cli train --resume"):
            with signals.held():
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(1000):           # the handler has run by now, and only recorded it
                    pass
                steps.append("write finished")
            steps.append("after the write")
    assert steps == ["write finished"]


def test_a_first_signal_raised_inside_a_garbage_collection_callback_still_stops_the_block(tmp_path: Path) -> None:
    proc = _second_signal("""
        import os, signal, time, weakref
        from iaa.jobs import interrupt

        class Collected:
            pass

        def gced(ref):                     # as SQLAlchemy's weakref callbacks, whose exceptions are dropped
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100000):        # the handler runs here, inside the callback
                pass

        with interrupt.stoppable("iaa-cli tune --resume s") as stop:
            stop.on_stop(lambda name: open(MARKS, "a").write(name + "\\n"))
            collected = Collected()
            ref = weakref.ref(collected, gced)
            del collected
            started = time.monotonic()
            try:
                time.sleep(15)                 # the signal raised again ends the sleep at once
            finally:
                open(MARKS, "a").write(f"slept {time.monotonic() - started:.1f}\\n")
        print("not reached")
    """, tmp_path)
    assert proc.returncode == 1 and "interrupted by SIGINT" in proc.stderr, proc.stderr   # Interrupted, uncaught
    assert "Exception ignored" not in proc.stderr and "not reached" not in proc.stdout
    marks = (tmp_path / "marks.txt").read_text().splitlines()
    assert len(marks) == 2 and marks[1] == "SIGINT" and float(marks[0].split()[1]) < 5, marks


def test_a_third_signal_ends_the_process_at_once_and_still_says_the_line(tmp_path: Path) -> None:
    proc = _second_signal("""
        import os, signal, threading, time
        from iaa.jobs import interrupt

        def mark(name):                       # a mark that hangs (a store another process holds)
            if threading.current_thread() is threading.main_thread():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)

        with interrupt.stoppable("iaa-cli tune --resume s") as stop:
            stop.on_stop(mark)
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
    """, tmp_path)
    assert proc.returncode == 128 + signal.SIGINT, proc.stderr
    [line] = [line for line in proc.stderr.splitlines() if line.startswith("interrupted by")]
    assert line.startswith("interrupted by SIGINT: ended before its runs and trials were marked"), line
    assert line.endswith("resume with: iaa-cli tune --resume s") and "Traceback" not in proc.stderr


def test_the_signals_of_a_forked_child_do_not_count_as_the_commands_own(tmp_path: Path) -> None:
    proc = _second_signal("""
        import os, signal, time
        from iaa.jobs import interrupt

        with interrupt.stoppable("iaa-cli tune --resume s") as stop:
            stop.on_stop(lambda name: open(MARKS, "a").write(name + "\\n"))
            child = os.fork()
            if child == 0:                    # a group's Ctrl-C reaching a child before it starts its program
                try:
                    os.kill(os.getpid(), signal.SIGINT)
                    time.sleep(1)
                finally:
                    os._exit(0)
            os.waitpid(child, 0)
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGINT)     # the command's first
            time.sleep(30)
    """, tmp_path)
    assert proc.returncode == 1 and "interrupted by SIGINT: resume with" in proc.stderr, proc.stderr  # not ended
    assert (tmp_path / "marks.txt").read_text().splitlines() == ["SIGINT"]                   # by a second


def test_a_signal_during_a_fork_is_handled_after_the_fork_leaving_logging_unlocked() -> None:
    # The signal arrives while logging's fork hook holds its lock (a hook registered before logging's
    # runs inside it); a handler raising there would keep that lock taken.
    script = textwrap.dedent("""
        import os, signal, sys, threading
        os.register_at_fork(before=lambda: (os.kill(os.getpid(), signal.SIGINT), sum(range(10000))))
        import logging
        from iaa import signals

        seen, dropped = [], []
        def handler(signum, frame):
            if signals.holding():
                seen.append("held")
                signals.hold(signum)
                return
            seen.append("raised")
            raise KeyboardInterrupt

        signal.signal(signal.SIGINT, handler)
        sys.unraisablehook = lambda unraisable: dropped.append(type(unraisable.exc_value).__name__)
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        other = threading.Thread(target=logging.getLogger, args=("another",), daemon=True)
        other.start()
        other.join(2)
        print(seen, dropped, "logging locked" if other.is_alive() else "logging free")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["['held',", "'raised']", "['KeyboardInterrupt']", "logging", "free"], proc.stdout


@pytest.mark.parametrize("stopped", ["the job's", "a bare KeyboardInterrupt"])
def test_a_signal_right_after_the_command_arms_its_last_handler_says_the_whole_line(monkeypatch, stopped) -> None:
    """The console's handler of a next signal is armed before the line is made; a signal in
    between still says the job's line (what is kept, the resume command), never a bare word."""
    from iaa.cli import output
    from iaa.jobs import interrupt

    class Ended(Exception):
        pass

    said: list[str] = []
    monkeypatch.setattr(output, "EXIT_AT_ONCE", True)
    monkeypatch.setattr(interrupt, "arm", lambda handler: handler(signal.SIGINT, None))   # the signal comes now
    monkeypatch.setattr(interrupt, "say", said.append)
    monkeypatch.setattr(interrupt, "end_process", lambda code: (_ for _ in ()).throw(Ended(code)))
    err = (interrupt.Interrupted("SIGTERM", "kept the run; resume with: iaa-cli train --resume")
           if stopped == "the job's" else KeyboardInterrupt())
    with pytest.raises(Ended) as ended:
        output._interrupted(err)
    assert ended.value.args == (130,)                          # the second signal's status
    expected = "resume with: iaa-cli train --resume" if stopped == "the job's" else "interrupted by SIGINT"
    assert_says(said[0], expected)
