"""The head node of the cluster a sweep runs on dies: the command says so, stops as a SIGTERM
stops it (its runs KILLED, its Optuna trials FAIL, the line that resumes it) well before Ray's
driver ends the process on its own after 60 s, and the resume line runs the sweep to its end
once a head runs again at the address (docs/platform.md, "Node failures")."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow.tracking import MlflowClient

from _faults import assert_says
from tests._platform import children, ray_command, read_sweep, write_space
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SETS = (*TINY_SETS, "train.check_every=4", "train.max_epochs=30")     # trials that outlast the head


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _head(port: int, temp: Path, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """A one-node cluster's head, in a process group of its own (its GCS, raylet and workers)."""
    with open(log, "ab") as out:
        head = subprocess.Popen([ray_command(), "start", "--head", f"--port={port}", "--num-cpus=2", "--num-gpus=0",
                                 "--include-dashboard=false", f"--temp-dir={temp}", "--block", "--disable-usage-stats"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return head
        except OSError:
            assert head.poll() is None, log.read_text()[-2000:]
            time.sleep(0.5)
    os.killpg(head.pid, signal.SIGKILL)
    raise TimeoutError(f"no head at port {port}: {log.read_text()[-2000:]}")


def _kill(head: subprocess.Popen) -> None:
    os.killpg(head.pid, signal.SIGKILL)
    head.wait()


def test_a_sweep_whose_head_node_dies_stops_marked_and_resumes(tmp_path: Path) -> None:
    tiny = make_tiny_prepared(tmp_path / "data")
    port, temp, work = _free_port(), Path(f"/tmp/iaa-head-{os.getpid()}"), tmp_path / "work"
    address = f"127.0.0.1:{port}"
    # The head and the sweep share a token of the test's own: a `ray start` with no mode set turns
    # tokens on only where ~/.ray/auth_token already exists, which a fresh machine lacks.
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    command = [sys.executable, "-m", "iaa.cli", "tune", "--dataset", "cbt-ne", "--data", str(tiny), "--num-samples",
               "2", "--search-space", str(write_space(tmp_path)), *[a for s in SETS for a in ("--set", s)],
               "--workdir", str(work), "--name", "h", "--address", address, "--storage-path", str(tmp_path / "ray")]
    head = _head(port, temp, tmp_path / "head.log", env)
    try:
        err = tmp_path / "tune.err"
        with open(err, "wb") as stderr:
            sweep = subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=stderr)
        deadline = time.monotonic() + 180
        while "check 2 " not in err.read_text(errors="replace"):
            assert sweep.poll() is None and time.monotonic() < deadline, err.read_text()[-3000:]
            time.sleep(0.25)
        _kill(head)
        killed = time.monotonic()
        code = sweep.wait(timeout=120)
        took = time.monotonic() - killed
        said = err.read_text(errors="replace")
        assert code == 128 + signal.SIGTERM, said[-3000:]
        assert took < 45, f"{took:.0f} s: Ray's own end comes at 60 s"             # the head watch's, not Ray's
        assert_says(said, "head node", "has not answered", "is lost")
        [line] = [x for x in said.splitlines() if x.startswith("interrupted by SIGTERM")]
        assert_says(line, f"resume with: iaa-cli tune --resume h --workdir {work} --address {address}")
        assert "Failed to connect to GCS" not in said and "Traceback" not in said

        record = read_sweep(work, "h")
        assert {r.info.status for r in children(record)} <= {"FINISHED", "KILLED"}
        assert MlflowClient(record["tracking_uri"]).get_run(record["parent_run_id"]).info.status == "KILLED"
        study = optuna.load_study(study_name=record["optuna"]["study"], storage=record["optuna"]["storage"])
        assert not [t for t in study.trials if t.state.name == "RUNNING"]

        head = _head(port, temp, tmp_path / "head.log", env)             # the cluster runs again
        again = line.split("resume with: iaa-cli ", 1)[1].split()
        resumed = subprocess.run([sys.executable, "-m", "iaa.cli", *again, "--json"], env=env, cwd=tmp_path,
                                 capture_output=True, text=True, timeout=240)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        record = read_sweep(work, "h")
        assert [t["status"] for t in record["trials"]] == ["TERMINATED", "TERMINATED"]
    finally:
        if head.poll() is None:
            _kill(head)
        shutil.rmtree(temp, ignore_errors=True)
