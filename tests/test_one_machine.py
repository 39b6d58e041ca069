"""Commands as a user runs them, in their own processes on one machine: ``ensemble --sweep`` says
what it does in a few lines (no Ray table), and two sweeps and a service started at once all
come up (each starts its own local Ray)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from iaa.jobs.evaluation.ensembling import ensemble_record
from iaa.jobs.sweeps import record as sweep_file
from tests._platform import write_space
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SETS = [arg for s in (*TINY_SETS, "train.threads=1") for arg in ("--set", s)]
MAX_ENSEMBLE_LINES = 40


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "iaa.cli", *args]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "IAA_WORKDIR")}
    return {**env, "PYTHONPATH": str(REPO)}


def _tune(tiny: Path, space: Path, workdir: Path, name: str, samples: int = 2) -> list[str]:
    return _cli("tune", "--dataset", "cbt-ne", "--data", str(tiny), "--num-samples", str(samples),
                "--search-space", str(space), *SETS, "--workdir", str(workdir), "--name", name)


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(prepared data, search space, workdir) with the finished two-trial sweep ``two``."""
    root = tmp_path_factory.mktemp("one-machine")
    tiny, space, work = make_tiny_prepared(root / "tiny"), write_space(root), root / "work"
    proc = subprocess.run(_tune(tiny, space, work, "two"), cwd=root, env=_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return tiny, space, work


@pytest.mark.timeout(1200)
def test_ensemble_of_a_sweep_speaks_in_a_few_lines(swept: tuple[Path, Path, Path]) -> None:
    _, _, work = swept
    proc = subprocess.run(_cli("ensemble", "--sweep", "two", "--seeds", "2", "--workdir", str(work)), cwd=work.parent,
                          env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (proc.stdout + proc.stderr).splitlines()
    assert len(lines) <= MAX_ENSEMBLE_LINES, "\n".join(lines)
    text = "\n".join(lines)
    assert "Trial status" not in text and "run_trial_" not in text and "╭" not in text   # no Ray Tune table
    assert "started: member config0-seed-1" in proc.stderr                  # one line per member event
    assert "estimate from the first check" in proc.stderr                  # an ETA
    assert "training members took" in proc.stderr
    summary = ensemble_record.read(work / "ensembles" / "two")             # paths where the folder is
    assert f"iaa-cli serve --ensemble {summary.ensemble_dir}" in proc.stderr
    assert "iaa-cli evaluate --checkpoint" in proc.stderr
    assert "member_sha256" not in proc.stdout                              # key: value lines, no dict repr
    assert f"valid_acc: {summary.valid_acc}" in proc.stdout
    _members_and_models_read_at_a_glance(work, summary)


def _members_and_models_read_at_a_glance(work: Path, summary: Any) -> None:
    """The trained member's run is named by its seed under the ensemble's run, with its data; the
    ensemble's run nests under the sweep's; every logged model has its own name."""
    from mlflow.tracking import MlflowClient

    sweep = sweep_file.read(work / "sweeps" / "two" / "sweep.json")
    client = MlflowClient(sweep.tracking_uri)
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name(sweep.experiment).experiment_id])}
    member = runs["seed-1"]                                                # under the ensemble's run
    assert member.data.tags["seed"] == member.data.params["train.seed"] == "1"
    assert member.data.tags["mlflow.parentRunId"] == summary.mlflow_run_id and member.data.tags["sweep"] == "two"
    assert [i.dataset.name for i in member.inputs.dataset_inputs] == ["cbt-ne"]
    assert client.get_run(summary.mlflow_run_id).data.tags["mlflow.parentRunId"] == sweep.parent_run_id
    names = [m.name for m in client.search_logged_models([e.experiment_id for e in client.search_experiments()])]
    assert sorted(names) == sorted({"two-trial-0000", "two-trial-0001", "ensemble-two"})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ready", timeout=10) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError):
        return False


@pytest.mark.timeout(1500)
def test_two_sweeps_and_a_service_at_once_on_one_machine(swept: tuple[Path, Path, Path], tmp_path: Path) -> None:
    tiny, space, work = swept
    checkpoint = sweep_file.read(work / "sweeps" / "two" / "sweep.json").trials[0].checkpoint
    port = _free_port()
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("a", "b", "serve")}
    procs = {name: subprocess.Popen(_tune(tiny, space, tmp_path / name, name, samples=1), cwd=tmp_path, env=_env(),
                                    stdout=logs[name], stderr=subprocess.STDOUT, start_new_session=True)
             for name in ("a", "b")}
    procs["serve"] = subprocess.Popen(_cli("serve", "--checkpoint", checkpoint, "--port", str(port), "--workdir",
                                           str(tmp_path / "serve")), cwd=tmp_path, env=_env(), stdout=logs["serve"],
                                      stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 1200
        while not _ready(url):
            assert procs["serve"].poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "serve did not become ready within 1200 s"
            time.sleep(2)
        for name in ("a", "b"):
            assert procs[name].wait(timeout=max(deadline - time.monotonic(), 1)) == 0, \
                (tmp_path / f"{name}.log").read_text()[-3000:]
            assert (tmp_path / name / "sweeps" / name / "best_config.yaml").is_file()
        assert _ready(url)                         # still serving after both sweeps
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        for log in logs.values():
            log.close()
