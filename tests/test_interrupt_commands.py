"""``iaa-cli tune`` and ``iaa-cli train`` stopped by a signal in their own processes: they exit
within seconds, leave no MLflow run and no Optuna trial RUNNING, say one line (no Ray advice, no
traceback), and ``tune --resume NAME`` alone continues the sweep with the console of a fresh one.
A second signal ends a command at once, its runs KILLED and no process it started left."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _platform import write_space
from _tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]

REPO = Path(__file__).resolve().parents[1]
EXIT_WITHIN_S = 5.0
SETS = [arg for s in (*TINY_SETS, "train.threads=1") for arg in ("--set", s)]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "iaa.cli", *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "IAA_WORKDIR")}
    return {**env, "PYTHONPATH": str(REPO)}


def _stop_when(argv: list[str], log: Path, ready, signum: int, *, group: bool = False,
               again: bool = False, started: list[int] | None = None, gap_s: float = 0.0,
               before=None) -> tuple[int, float, str]:
    """Start ``argv``, send ``signum`` once ``ready(output)`` holds; (exit status, seconds to exit, output).

    ``group``: the command runs in a process group of its own (its id: the command's pid), and the
    signal goes to the whole group, as a terminal's Ctrl-C does; ``again``: a second one follows,
    ``gap_s`` later; ``before()`` runs just before the first."""
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=log.parent, env=_env(), stdout=out, stderr=subprocess.STDOUT, text=True,
                                start_new_session=group)
        if started is not None:
            started.append(proc.pid)
        try:
            deadline = time.monotonic() + 900
            while not ready(log.read_text()):
                assert proc.poll() is None, f"ended before the signal:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "never got ready"
                time.sleep(0.2)
            send = (lambda: os.killpg(proc.pid, signum)) if group else (lambda: proc.send_signal(signum))
            if before is not None:
                before()
            send()
            if again:
                time.sleep(gap_s)
                send()
            sent = time.monotonic()
            try:
                code = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                code = -1
            return code, time.monotonic() - sent, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _running_runs(workdir: Path) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    ids = [e.experiment_id for e in client.search_experiments()]
    runs = client.search_runs(ids, filter_string="attributes.status = 'RUNNING'") if ids else []
    return [r.info.run_name for r in runs]


def _trials(workdir: Path, study: str) -> list[tuple[str, dict]]:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    loaded = optuna.load_study(study_name=study, storage=f"sqlite:///{workdir / 'optuna.db'}")
    return [(t.state.name, t.user_attrs) for t in loaded.trials]


def _saved_a_check(workdir: Path) -> bool:
    """Whether Tune's saved experiment state (written every 2 s) holds a trial with a check: what a
    stop then records of the sweep's trials."""
    for path in workdir.rglob("experiment_state-*.json"):
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):                # being written
            continue
        if any(re.search(r'"checks": [1-9]', str(trial)) for trial in saved.get("trial_data", [])):
            return True
    return False


def test_tune_stopped_by_ctrl_c_leaves_nothing_running_and_resumes_by_name(tmp_path: Path) -> None:
    tiny, space, work = make_tiny_prepared(tmp_path / "tiny"), write_space(tmp_path), tmp_path / "work"
    given = tmp_path / "try.yaml"
    given.write_text("- {model.hidden_dim: 12, model.steps: 1}\n", encoding="utf-8")
    argv = _cli("tune", "--data", str(tiny), "--num-samples", "2", "--max-epochs", "4", "--search-space", str(space),
                *SETS, "--workdir", str(work), "--name", "cut", "--try-first", str(given))
    code, took, out = _stop_when(argv, tmp_path / "tune.log",
                                 lambda text: " check 1 " in text and _saved_a_check(work), signal.SIGINT)

    assert code == 130 and took < EXIT_WITHIN_S, (code, took, out[-3000:])
    assert f"resume with: iaa-cli tune --resume cut --workdir {work}" in out
    assert len([line for line in out.splitlines() if line.startswith("interrupted by SIGINT")]) == 1
    assert "Tuner.restore" not in out and "Traceback" not in out and "Failed to fetch metrics" not in out
    assert _running_runs(work) == []
    trials = _trials(work, "cut")
    assert trials and all(state != "RUNNING" for state, _ in trials)
    assert any(state == "FAIL" and attrs.get("interrupted") == "SIGINT" for state, attrs in trials)
    from iaa.jobs.sweeps import record

    stopped = record.read(record.sweep_file(work, "cut"))         # its trials as Tune last saved them
    assert stopped.trials and any(t.checks >= 1 for t in stopped.trials) and stopped.wall_s > 0
    assert not stopped.finished and {t.status for t in stopped.trials} - {"TERMINATED"}

    resumed = subprocess.run(_cli("tune", "--resume", "cut", "--workdir", str(work)), cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    err = resumed.stderr
    assert "resuming sweep cut: " in err and "cost: " in err and " check " in err and "rank  trial" in err
    assert _running_runs(work) == []
    trials = _trials(work, "cut")
    assert all(state != "RUNNING" for state, _ in trials)
    assert record.read(record.sweep_file(work, "cut")).wall_s > stopped.wall_s     # both parts counted
    # the configuration given to try first was asked once, then continued: never asked again
    assert [a["tried_first"] for _, a in trials if "tried_first" in a and "continues_trial" not in a] == [0]


def test_train_stopped_by_sigterm_ends_its_run_killed_at_once(tmp_path: Path) -> None:
    tiny, work, run_dir = make_tiny_prepared(tmp_path / "tiny"), tmp_path / "work", tmp_path / "run"
    # no early stop: the signal must find the run still training, however long the machine takes to send it
    argv = _cli("train", "--data", str(tiny), *SETS, "--set", "train.max_epochs=200", "--set", "train.patience=100000",
                "--run-dir", str(run_dir), "--workdir", str(work))
    last = run_dir / "checkpoints" / "last.pt"
    code, took, out = _stop_when(argv, tmp_path / "train.log", lambda text: last.is_file(), signal.SIGTERM)

    assert code == 128 + signal.SIGTERM and took < EXIT_WITHIN_S, (code, took, out[-3000:])
    [line] = [line for line in out.splitlines() if "interrupted by SIGTERM" in line]
    assert line.endswith("--resume") and f"--run-dir {run_dir}" in line
    assert "Traceback" not in out
    assert _running_runs(work) == []


def test_train_on_ray_train_workers_stopped_by_ctrl_c_says_how_to_resume(tmp_path: Path) -> None:
    """Ray Train's fit takes SIGINT for itself when it runs in the main thread (it aborts the run
    and exits 1, silently); the command's own stop must still say how to resume and end its run."""
    tiny, work, run_dir = make_tiny_prepared(tmp_path / "tiny"), tmp_path / "work", tmp_path / "run"
    argv = _cli("train", "--data", str(tiny), *SETS, "--set", "train.max_epochs=200", "--set", "train.patience=100000",
                "--workers", "2", "--run-dir", str(run_dir), "--workdir", str(work))
    code, took, out = _stop_when(argv, tmp_path / "train.log", lambda text: "check 2:" in text, signal.SIGINT,
                                 group=True)

    assert code == 128 + signal.SIGINT and took < 30, (code, took, out[-3000:])
    line = _one_line(out, "SIGINT")
    assert line.endswith("--resume") and "--data-parallel-workers 2" in line and f"--run-dir {run_dir}" in line
    assert _running_runs(work) == [] and "Traceback" not in out


# The first Ctrl-C's stop ends the run KILLED; the second comes in the middle of that very write
# to the store (its SQLite lock held), as a Ctrl-C pressed twice can.
SECOND_CTRL_C_IN_A_WRITE = """
import os, signal, sys
from sqlalchemy import event
from sqlalchemy.engine import Engine
from iaa.cli import main
from iaa.jobs import interrupt

sent = []

@event.listens_for(Engine, "after_cursor_execute")
def second_ctrl_c(conn, cursor, statement, *args):
    stopped = interrupt._ACTIVE and interrupt._ACTIVE[-1].signal_name
    if stopped and not sent and statement.lstrip().upper().startswith("UPDATE RUNS"):
        sent.append(1)
        os.kill(os.getpid(), signal.SIGINT)

sys.argv[0] = "iaa-cli"
main()
"""


SECOND_SIGNAL_WITHIN_S = 10.0     # the promise is 2 s; the bound leaves room for a shared machine


def test_train_stopped_twice_exits_at_once_with_its_run_killed(tmp_path: Path) -> None:
    tiny, work, run_dir = make_tiny_prepared(tmp_path / "tiny"), tmp_path / "work", tmp_path / "run"
    argv = [sys.executable, "-c", SECOND_CTRL_C_IN_A_WRITE, "train", "--data", str(tiny), *SETS,
            "--set", "train.max_epochs=200", "--run-dir", str(run_dir), "--workdir", str(work)]
    last = run_dir / "checkpoints" / "last.pt"
    code, took, out = _stop_when(argv, tmp_path / "train.log", lambda text: last.is_file(), signal.SIGINT)

    assert code == 130 and took < SECOND_SIGNAL_WITHIN_S, (code, took, out[-3000:])
    assert len([line for line in out.splitlines() if line.startswith("interrupted by SIGINT")]) == 1
    assert "Traceback" not in out and "database is locked" not in out
    assert _running_runs(work) == []


def _group(pgid: int) -> list[str]:
    """The command lines of the live processes (zombies aside) of process group ``pgid``."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(f"{entry} {command}")
    return found


def _sweep_of_one_trial(tiny: Path, work: Path, name: str) -> None:
    """A finished sweep's record with one trial and no checkpoint: its ensemble trains the members on Ray."""
    from iaa.jobs.datasets import resolve
    from iaa.jobs.ports import TrialRecord
    from iaa.jobs.sweeps import record

    cfg = resolve.job_config("cbt-ne", tiny, sets=[*TINY_SETS, "train.threads=1", "train.max_epochs=200",
                                                   "train.patience=100000"])
    record.write(record.sweep_file(work, name), record.SweepRecord(name=name, dataset="cbt-ne", data_dir=str(tiny),
                                                                   trials=(TrialRecord("t0", cfg, best_valid_acc=0.5),)))


def test_ensemble_stopped_twice_leaves_no_process_of_its_group(tmp_path: Path) -> None:
    tiny, work = make_tiny_prepared(tmp_path / "tiny"), tmp_path / "work"
    _sweep_of_one_trial(tiny, work, "s")
    argv = _cli("ensemble", "--sweep", "s", "--seeds", "1", "--workdir", str(work))
    started: list[int] = []
    try:
        code, took, out = _stop_when(argv, tmp_path / "ensemble.log", lambda text: " check 1 " in text, signal.SIGINT,
                                     group=True, again=True, started=started)
        left = _left_in_group(started[0])
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(started[0], signal.SIGKILL)

    assert code == 130 and took < SECOND_SIGNAL_WITHIN_S, (code, took, out[-3000:])
    assert left == [], left                        # Ray's raylet, workers and agents ended with it
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-3000:]
    assert len([line for line in out.splitlines() if line.startswith("interrupted by SIGINT")]) == 1
    assert _running_runs(work) == []


def _left_in_group(pgid: int, within_s: float = 1.5) -> list[str]:
    """The processes of group ``pgid`` still alive ``within_s`` seconds after its leader ended (killed
    ones are gone at once; Ray's own would linger for longer)."""
    deadline = time.monotonic() + within_s
    while _group(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return _group(pgid)


def _one_line(out: str, name: str) -> str:
    [line] = [line[line.index("interrupted by"):] for line in out.splitlines() if "interrupted by" in line]
    assert line.startswith(f"interrupted by {name}: "), line
    assert "Traceback" not in out and "Exception ignored" not in out, out[-3000:]
    return line


def _stopped_twice(argv: list[str], log: Path, ready, signum: int, before=None,
                   started: list[int] | None = None) -> tuple[int, float, str, list[str]]:
    """Two ``signum`` to the command's process group 0.3 s apart once ``ready(output)``; (exit
    status, seconds from the second to the exit, output, processes of the group left); the
    command's pid goes to ``started``."""
    started = [] if started is None else started
    try:
        code, took, out = _stop_when(argv, log, ready, signum, group=True, again=True, gap_s=0.3,
                                     started=started, before=before)
        return code, took, out, _left_in_group(started[0])
    finally:
        if started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started[0], signal.SIGKILL)


def test_tune_stopped_by_two_sigterms_while_trials_run_exits_within_seconds(tmp_path: Path) -> None:
    tiny, space, work = make_tiny_prepared(tmp_path / "tiny"), write_space(tmp_path), tmp_path / "work"
    argv = _cli("tune", "--data", str(tiny), "--num-samples", "2", "--max-epochs", "50", "--search-space", str(space),
                *SETS, "--workdir", str(work), "--name", "two")
    code, took, out, left = _stopped_twice(argv, tmp_path / "tune.log", lambda text: " check 1 " in text,
                                           signal.SIGTERM)

    assert left == [], left
    assert "Failed to connect to GCS" not in out
    if code == 1 and "interrupted by SIGTERM" not in out:
        # The group's SIGTERM ends Ray's raylet too (Ray blocks only SIGINT in its processes), and
        # Ray's core worker then ends the command at once, exit 1, at times before its stop ran:
        # as after a kill -9, the next command that opens the work folder marks what it left.
        from iaa.platform.tracking.connection import open_store

        open_store(f"sqlite:///{work / 'mlflow.db'}")
        assert _running_runs(work) == []
        assert all(state != "RUNNING" for state, _ in _trials(work, "two"))
        return
    assert code == 128 + signal.SIGTERM and took < SECOND_SIGNAL_WITHIN_S, (code, took, out[-3000:])
    assert f"resume with: iaa-cli tune --resume two --workdir {work}" in _one_line(out, "SIGTERM")


def _ray_started(root: int) -> bool:
    """Whether the command ``root`` has started Ray's processes (its GCS server)."""
    from _processes import process_tree

    for pid in process_tree(root) - {root}:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/cmdline", "rb") as f:
            if b"gcs_server" in f.read():
                return True
    return False


def test_tune_stopped_twice_while_ray_starts_exits_within_seconds(tmp_path: Path) -> None:
    tiny, space, work = make_tiny_prepared(tmp_path / "tiny"), write_space(tmp_path), tmp_path / "work"
    argv = _cli("tune", "--data", str(tiny), "--num-samples", "1", "--max-epochs", "1", "--search-space", str(space),
                *SETS, "--workdir", str(work), "--name", "early")
    started: list[int] = []
    code, took, out, left = _stopped_twice(argv, tmp_path / "tune.log", lambda text: _ray_started(started[0]),
                                           signal.SIGINT, started=started)

    assert code == 130 and took < SECOND_SIGNAL_WITHIN_S, (code, took, out[-3000:])
    assert left == [], left
    _one_line(out, "SIGINT")


LOCK_THE_STORE = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(120)
"""


def test_train_stopped_twice_while_another_process_locks_the_store(tmp_path: Path) -> None:
    tiny, work, run_dir = make_tiny_prepared(tmp_path / "tiny"), tmp_path / "work", tmp_path / "run"
    argv = _cli("train", "--data", str(tiny), *SETS, "--set", "train.max_epochs=200", "--set", "train.patience=100000",
                "--run-dir", str(run_dir), "--workdir", str(work))
    last = run_dir / "checkpoints" / "last.pt"
    locker: list[subprocess.Popen] = []

    def lock() -> None:          # another process holds the store's write lock from here on
        locker.append(subprocess.Popen([sys.executable, "-c", LOCK_THE_STORE, str(work / "mlflow.db")],
                                       stdout=subprocess.PIPE, text=True))
        assert locker[0].stdout.readline().strip() == "locked"
        time.sleep(1.0)          # the command's next write waits on the lock

    try:
        code, took, out, left = _stopped_twice(argv, tmp_path / "train.log", lambda text: last.is_file(),
                                               signal.SIGINT, before=lock)
    finally:
        for proc in locker:
            proc.kill()
            proc.wait()

    assert code == 130 and took < SECOND_SIGNAL_WITHIN_S, (code, took, out[-3000:])
    assert left == [], left
    line = _one_line(out, "SIGINT")
    assert "the next command in this work folder marks them" in line and "resume with: " in line

    from iaa.platform.tracking.connection import open_store

    open_store(f"sqlite:///{work / 'mlflow.db'}")            # the next command to open the folder
    assert _running_runs(work) == []
