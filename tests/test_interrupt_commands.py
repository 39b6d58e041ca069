"""``iaa-cli tune`` and ``iaa-cli train`` stopped by a signal in their own processes: they exit
within seconds, leave no MLflow run and no Optuna trial RUNNING, say one line (no Ray advice, no
traceback), and ``tune --resume NAME`` alone continues the sweep with the console of a fresh one."""

from __future__ import annotations

import os
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


def _stop_when(argv: list[str], log: Path, ready, signum: int) -> tuple[int, float, str]:
    """Start ``argv``, send ``signum`` once ``ready(output)`` holds; (exit status, seconds to exit, output)."""
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=log.parent, env=_env(), stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 900
            while not ready(log.read_text()):
                assert proc.poll() is None, f"ended before the signal:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "never got ready"
                time.sleep(0.2)
            proc.send_signal(signum)
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


def test_tune_stopped_by_ctrl_c_leaves_nothing_running_and_resumes_by_name(tmp_path: Path) -> None:
    tiny, space, work = make_tiny_prepared(tmp_path / "tiny"), write_space(tmp_path), tmp_path / "work"
    argv = _cli("tune", "--data", str(tiny), "--num-samples", "2", "--max-epochs", "4", "--search-space", str(space),
                *SETS, "--workdir", str(work), "--name", "cut")
    code, took, out = _stop_when(argv, tmp_path / "tune.log", lambda text: " check 1 " in text, signal.SIGINT)

    assert code == 130 and took < EXIT_WITHIN_S, (code, took, out[-3000:])
    assert f"resume with: iaa-cli tune --resume cut --workdir {work}" in out
    assert len([line for line in out.splitlines() if line.startswith("interrupted by SIGINT")]) == 1
    assert "Tuner.restore" not in out and "Traceback" not in out and "Failed to fetch metrics" not in out
    assert _running_runs(work) == []
    trials = _trials(work, "cut")
    assert trials and all(state != "RUNNING" for state, _ in trials)
    assert any(state == "FAIL" and attrs.get("interrupted") == "SIGINT" for state, attrs in trials)

    resumed = subprocess.run(_cli("tune", "--resume", "cut", "--workdir", str(work)), cwd=tmp_path, env=_env(),
                             capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    err = resumed.stderr
    assert "resuming sweep cut: " in err and "cost: " in err and " check " in err and "rank  trial" in err
    assert _running_runs(work) == []
    assert all(state != "RUNNING" for state, _ in _trials(work, "cut"))


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
