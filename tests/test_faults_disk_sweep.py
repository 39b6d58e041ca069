"""Fault suite, a disk that fills in the middle of a sweep: wherever the full disk strikes (a trial's
checkpoint, Tune's copy of the run's state, the MLflow or the Optuna store, from the driver or from a
trial), ``iaa-cli tune`` ends in one ``Error:`` line that names the path and the free space of that
path's own file system, prints no traceback, stops its trials, and marks what it can KILLED and FAIL;
the next command that opens the work folder marks the rest.

The pieces are tested one by one in this process (no Ray starts); the end-to-end tests run a tiny
sweep in a process of its own and fill its tmpfs (this needs root) once its first check is reported.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _faults import assert_one_message, fill, invoke, small_fs

REPO = Path(__file__).resolve().parents[1]


def _free_kib(line: str) -> int:
    """The free space an Error line tells, in KiB (a MiB figure is another, larger disk's)."""
    found = re.search(r"\((\d+) KiB free", line)
    assert found, line
    return int(found.group(1))


def _side(tmp_path: Path, tracker=None, storage: str | None = None):
    from iaa.jobs.config.job_config import JobConfig, to_dict
    from iaa.platform.sweeps.driver_side import DriverSide
    from iaa.platform.sweeps.trials.trial import TrialSpec

    spec = TrialSpec(name="s", fit=lambda *a, **k: {}, storage_path=str(tmp_path / "ray"), workers=1, threads=1,
                     base=to_dict(JobConfig()))
    return DriverSide(tracker=tracker, experiment="tune-cbt-ne", parent_run_id=None, dataset="cbt-ne", spec=spec,
                      study_storage=storage, study_name="s")


# --- the pieces, in this process -----------------------------------------------------------------


def test_a_trials_enospc_names_the_trials_folder_and_its_own_free_space(tmp_path):
    from iaa.files import DiskFullError
    from iaa.platform.sweeps.trials.full_disk import in_trial

    with small_fs(tmp_path / "small", size="64k") as folder:
        fill(folder)
        err = in_trial(OSError(errno.ENOSPC, "Error writing bytes to file"), f"{folder}/ray/s/t1")
    assert isinstance(err, DiskFullError)
    assert str(err).startswith(f"no space left on device writing {folder}/ray/s/t1 (") and _free_kib(str(err)) <= 64
    other = ValueError("not a disk")
    assert in_trial(other, str(folder)) is other


def test_a_trials_full_disk_in_tunes_log_record_is_noted_once_and_not_printed(tmp_path, caplog):
    from iaa.files import DiskFullError
    from iaa.platform.sweeps.trials import full_disk
    from iaa.platform.sweeps.trials.full_disk import TRIAL_LOGGER, stopped_by, watching

    side = _side(tmp_path)
    first = DiskFullError("no space left on device writing /w/ray/s/t1 (0 KiB free): first")

    class Wrapped(DiskFullError):                   # as Ray hands a trial's error over: its text a traceback
        def __init__(self, cause):
            super().__init__("Traceback (most recent call last): ...")
            self.cause = cause

    logger = logging.getLogger(TRIAL_LOGGER)
    with caplog.at_level(logging.ERROR), watching(side, str(tmp_path / "ray" / "s")):
        logger.error("Trial task failed for trial t1", exc_info=Wrapped(first))
        logger.error("Trial task failed for trial t2", exc_info=OSError(errno.ENOSPC, "No space left on device"))
        logger.error("an unrelated error")
    assert side.full == [first] and stopped_by(side, None, "") is first
    assert [r.getMessage() for r in caplog.records if r.name == TRIAL_LOGGER] == ["an unrelated error"]
    # the watch ends with the run (the filter that keeps lost workers' records off the console stays)
    assert not [f for f in logger.filters if isinstance(f, full_disk._FullDiskRecords)]


@pytest.mark.parametrize("source", ["syncer", "state"])
def test_tunes_failed_copy_of_the_run_state_names_the_runs_folder(tmp_path, caplog, source):
    from iaa.platform.cluster.ray_internals import SYNC_LOGGER
    from iaa.platform.sweeps.trials.full_disk import STATE_LOGGER, watching

    side = _side(tmp_path)
    with small_fs(tmp_path / "small", size="64k") as folder:
        fill(folder)
        with caplog.at_level(logging.WARNING), watching(side, str(folder / "s")):
            if source == "syncer":
                logging.getLogger(SYNC_LOGGER).warning("Last sync command failed with the following error:\n"
                                                       "OSError: [Errno 28] No space left on device")
            else:
                logging.getLogger(STATE_LOGGER).error("Saving experiment state failed with exception: ",
                                                      exc_info=OSError(errno.ENOSPC, "No space left on device"))
    [full] = side.full
    assert str(full).startswith(f"no space left on device writing {folder / 's'} (") and _free_kib(str(full)) <= 64
    assert "could not keep the run's state" in str(full) and not caplog.records


def test_a_full_optuna_store_mid_sweep_is_noted_and_tune_is_told_nothing(tmp_path):
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.search.search_algorithm import searcher
    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.config import search_space

    space = search_space.parse({"model.hidden_dim": [8, 12]}, JobConfig())
    with small_fs(tmp_path / "small", size="512k") as folder:
        url = f"sqlite:///{folder / 'optuna.db'}"
        side = _side(tmp_path, storage=url)
        with driver_side.bound("s", side):
            search = searcher(space, 0, "s")
            assert search.suggest("t1") is not None           # the store is made, a trial asked
            fill(folder)
            assert search.suggest("t2") is None               # Tune's loop goes on to its stop
            search.on_trial_complete("t1", {"valid_acc": 0.5, "best_valid_acc": 0.5, "stop_reason": "max-epochs"})
    [full] = side.full
    assert str(full).startswith(f"no space left on device for the Optuna store {folder / 'optuna.db'} (")
    assert _free_kib(str(full)) <= 512 and "t1" not in search.completed      # never told: marked FAIL later


def test_a_full_mlflow_store_mid_sweep_is_noted_and_ends_the_tune_loop(tmp_path):
    from iaa.files import DiskFullError
    from iaa.platform.sweeps import driver_side
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns
    from iaa.platform.tracking.tracker import MlflowTracker

    class Trial:
        trial_id, config, last_result = "t1", {"model.hidden_dim": 8}, {}

    with small_fs(tmp_path / "small", size="2m") as folder:
        tracker = MlflowTracker(f"sqlite:///{folder / 'mlflow.db'}")
        side = _side(tmp_path, tracker=tracker)
        runs = TrialRuns("s")
        with driver_side.bound("s", side):
            runs.on_trial_start(0, [], Trial())
            runs.on_step_end(0, [])                            # nothing met: the loop goes on
            fill(folder)
            runs.on_trial_result(0, [], Trial(), {"valid_acc": 0.5, "step": 1})
            with pytest.raises(DiskFullError) as caught:
                runs.on_step_end(1, [])
    message = str(caught.value)
    assert message.startswith(f"no space left on device for the MLflow store {folder / 'mlflow.db'} ("), message
    assert _free_kib(message) <= 2048


def test_a_sweep_stopped_by_a_full_disk_marks_its_runs_and_trials_and_says_how_to_resume(tmp_path):
    from fakes import FakeLauncher, FakeTracker
    from iaa.files import DiskFullError
    from iaa.jobs.tune import stops

    tracker, launcher = FakeTracker(), FakeLauncher()
    parent = tracker.start_run("tune-cbt-ne", "s", tags={"sweep": "s"})
    child = tracker.start_run("tune-cbt-ne", "s-t1", tags={"sweep": "s", "trial_id": "t1"}, parent_run_id=parent.run_id)
    err = stops.stopped_by_full_disk(tracker, launcher, "tune-cbt-ne", "s", plan=None,
                                     err=DiskFullError("no space left on device writing /w/ray/s/t1 (0 KiB free)"),
                                     resume="iaa-cli tune --resume s")
    assert isinstance(err, DiskFullError) and "\n" not in str(err)
    assert str(err).startswith("no space left on device writing /w/ray/s/t1 (0 KiB free); sweep s stopped: ")
    assert str(err).endswith("resume with: iaa-cli tune --resume s")
    assert parent.state == child.state == "KILLED" and "disk_full" in child.tags
    assert launcher.failed_trials == [{"disk_full": "no space left on device writing /w/ray/s/t1 (0 KiB free)"}]


def test_runs_the_full_disk_kept_from_being_marked_are_left_to_the_next_command(tmp_path):
    from fakes import FakeLauncher, FakeTracker
    from iaa.files import DiskFullError
    from iaa.jobs.tune import stops

    class FullStudy(FakeLauncher):
        def fail_unfinished_trials(self, plan, attrs):
            raise DiskFullError("no space left on device for the Optuna store /w/optuna.db (0 KiB free)")

    tracker = FakeTracker()
    parent = tracker.start_run("tune-cbt-ne", "s", tags={"sweep": "s"})
    err = stops.stopped_by_full_disk(tracker, FullStudy(), "tune-cbt-ne", "s", None,
                                     DiskFullError("no space left on device writing X"), "iaa-cli tune --resume s")
    assert "the next command in this work folder marks KILLED and FAIL" in str(err)
    assert parent.state == "RUNNING"       # left for the next command, which fails the study's trials with it


def test_an_enospc_that_names_no_file_tells_no_free_space_of_another_disk():
    import click
    from click.testing import CliRunner

    from iaa.cli.output import friendly

    @click.command()
    @friendly
    def command() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    result = CliRunner().invoke(command, [])
    assert_one_message(result.exit_code, result.output, "no space left on device", "named no file")
    assert " free)" not in result.output and "KiB free" not in result.output and "MiB free" not in result.output


# --- end to end: a tiny sweep whose disk fills after its first check ---------------------------


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "IAA_WORKDIR",
                                                            "IAA_DEBUG")}
    return {**env, "PYTHONPATH": str(REPO)}


def _tune_until_full(tmp_path: Path, work: Path, small: Path, *extra: str) -> tuple[int, str]:
    """Run a tiny sweep; fill ``small``'s file system once the first check is on the console."""
    from _platform import write_space
    from _tiny import TINY_SETS, make_tiny_prepared

    tiny = make_tiny_prepared(tmp_path / "tiny")
    sets = [a for s in (*TINY_SETS, "train.threads=1") for a in ("--set", s)]
    argv = [sys.executable, "-m", "iaa.cli", "tune", "--data", str(tiny), "--num-samples", "3", "--max-epochs", "8",
            "--search-space", str(write_space(tmp_path)), *sets, "--workdir", str(work), "--name", "full", *extra]
    log = tmp_path / "tune.log"
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=tmp_path, env=_env(), stdout=out, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 300
            while " check 1 " not in log.read_text():
                assert proc.poll() is None, f"ended before its first check:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "no check within 300 s"
                time.sleep(0.1)
            fill(small)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return code, log.read_text()


def _assert_no_traceback(output: str) -> None:
    """Not even a part of one: Ray's logs of a trial's error hold its frames without the word Traceback."""
    frames = [line for line in output.splitlines() if line.lstrip().startswith('File "')]
    assert not frames and "Unhandled error" not in output and "Logging error" not in output, output[-4000:]


def _running(work: Path) -> tuple[list[str], list[int]]:
    """The MLflow runs and the Optuna trials of the work folder still RUNNING, read with sqlite3."""
    runs = sqlite3.connect(work / "mlflow.db").execute("SELECT name FROM runs WHERE status = 'RUNNING'").fetchall()
    trials = sqlite3.connect(work / "optuna.db").execute("SELECT number FROM trials WHERE state = 'RUNNING'").fetchall()
    return [r for (r,) in runs], [t for (t,) in trials]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("layout", ["stores", "work folder"])
def test_a_work_folder_that_fills_mid_sweep_is_one_line_and_the_next_command_marks_the_rest(tmp_path, layout):
    """``stores``: the work folder (the MLflow and Optuna stores) fills, Ray's storage is on another
    disk, so a store write of the driver meets the full disk first; ``work folder``: everything is
    in the work folder, as by default (a trial's checkpoint meets it first, mostly)."""
    with small_fs(tmp_path / "small", size="16m") as small:
        work = small / "work"
        storage = ("--storage-path", str(tmp_path / "ray")) if layout == "stores" else ()
        code, output = _tune_until_full(tmp_path, work, small, *storage)
        assert_one_message(code, output, "no space left on device ", f" {work}/", "; sweep full stopped: ",
                           "resume with: iaa-cli tune --resume full")
        _assert_no_traceback(output)
        line = next(line for line in output.splitlines() if line.startswith("Error:"))
        if layout == "stores":
            assert re.search(f"for the (MLflow|Optuna) store {work}/(mlflow|optuna).db \\(", line), line
        assert _free_kib(line) <= 16 * 1024
        (small / "filler").unlink()                            # space is freed; the next command opens the folder
        code, shown = invoke("report", "--experiment", "tune-cbt-ne", "--out", tmp_path / "curves.png", "--workdir", work)
        assert code == 0, shown
        assert _running(work) == ([], [])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_storage_that_fills_mid_sweep_is_one_line_and_its_runs_and_trials_are_marked(tmp_path):
    """Ray's storage (the trials' checkpoints, Tune's state) fills; the stores are on another disk."""
    work = tmp_path / "work"
    with small_fs(tmp_path / "small", size="16m") as small:
        code, output = _tune_until_full(tmp_path, work, small, "--storage-path", str(small / "ray"))
    assert_one_message(code, output, f"no space left on device writing {small}/ray/full", "; sweep full stopped: ",
                       "its runs are KILLED and its unfinished Optuna trials FAIL")
    _assert_no_traceback(output)
    assert _free_kib(next(line for line in output.splitlines() if line.startswith("Error:"))) <= 16 * 1024
    assert _running(work) == ([], [])                          # marked by the sweep itself
    states = sqlite3.connect(work / "optuna.db").execute("SELECT DISTINCT state FROM trials").fetchall()
    assert ("FAIL",) in states
