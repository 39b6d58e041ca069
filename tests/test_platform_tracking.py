"""MLflow tracking: a store several processes create at once, and every fault a run may meet."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from mlflow.tracking import MlflowClient

from iaa.jobs.workdir.paths import Workdir

pytestmark = pytest.mark.timeout(120)

_CHILD = """
import pathlib, sys, time
from iaa.platform.tracking import store as tracking
from mlflow.tracking import MlflowClient
ready = pathlib.Path(sys.argv[2])
(ready / str(time.monotonic_ns())).touch()
while len(list(ready.iterdir())) < int(sys.argv[3]):   # all children reach the store at the same moment
    time.sleep(0.001)
run = tracking.Run.start(sys.argv[1], "race", "r")   # what `iaa-cli train` does first
print(MlflowClient(sys.argv[1]).get_run(run.run_id).info.experiment_id)
"""


@pytest.mark.slow
def test_processes_creating_a_fresh_sqlite_store_at_once_all_succeed(tmp_path: Path) -> None:
    uri, ready = f"sqlite:///{tmp_path / 'mlflow.db'}", tmp_path / "ready"
    ready.mkdir()                                   # each child marks itself there once it has imported mlflow
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, uri, str(ready), "4"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(4)]
    results = [child.communicate(timeout=100) for child in children]
    for child, (_, err) in zip(children, results):
        assert child.returncode == 0, err[-2000:]
    ids = {out.strip() for out, _ in results}
    assert len(ids) == 1                            # one experiment, found by all
    assert len(MlflowClient(uri).search_runs(list(ids))) == 4
    assert MlflowClient(uri).get_experiment(ids.pop()).name == "race"


# --- faults: an unreachable server, a damaged store, a lost server, a killed process ---------------


def test_an_unreachable_server_fails_at_once_naming_it(tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.platform.tracking import connection

    with pytest.raises(IaaError, match=r"http://127\.0\.0\.1:9 is not reachable"):
        connection.open_store(Workdir(tmp_path).tracking_uri("http://127.0.0.1:9"))


@pytest.mark.parametrize("command", ["train", "tune"])
def test_the_cli_names_an_unreachable_tracking_server(tmp_path: Path, command: str) -> None:
    from click.testing import CliRunner

    from iaa.cli import cli
    from tests._tiny import make_tiny_prepared

    tiny = make_tiny_prepared(tmp_path / "tiny")
    dataset = ["--dataset", "cbt-ne"] if command == "tune" else []
    out = CliRunner().invoke(cli, [command, *dataset, "--data", str(tiny), "--workdir", str(tmp_path / "w"),
                                   "--tracking-uri", "http://127.0.0.1:9"])
    assert out.exit_code != 0 and "http://127.0.0.1:9" in out.output, out.output
    assert not (tmp_path / "w" / "ray").exists()           # failed before starting Ray or training


def test_a_damaged_sqlite_store_is_named(tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.platform.tracking import connection

    (tmp_path / "mlflow.db").write_bytes(b"this is no database" * 100)
    with pytest.raises(IaaError, match=f"{tmp_path / 'mlflow.db'} is damaged"):
        connection.open_store(Workdir(tmp_path).tracking_uri())


def _history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in MlflowClient(uri).get_metric_history(run_id, key)]


def test_metrics_refused_by_a_lost_store_are_kept_and_sent_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import mlflow

    from iaa.platform.tracking import connection
    from iaa.platform.tracking import store as tracking

    uri = connection.open_store(Workdir(tmp_path).tracking_uri())
    run = tracking.Run.start(uri, "lost", "r")
    real, down = run._client.log_batch, {"calls": 2}

    def flaky(*args, **kwargs):
        if down["calls"] > 0:
            down["calls"] -= 1
            raise mlflow.exceptions.MlflowException("connection refused")
        return real(*args, **kwargs)

    monkeypatch.setattr(run._client, "log_batch", flaky)
    monkeypatch.setattr(tracking, "RETRY_EVERY_S", 0.0)
    for step in (1, 2, 3):
        run.log_metrics({"valid_acc": step / 10}, step=step)
    run.end()
    assert _history(uri, run.run_id, "valid_acc") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    assert MlflowClient(uri).get_run(run.run_id).info.status == "FINISHED"


def test_a_store_that_never_comes_back_ends_the_run_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   capsys: pytest.CaptureFixture, console: None) -> None:
    import mlflow

    from iaa.platform.tracking import connection
    from iaa.platform.tracking import store as tracking

    uri = connection.open_store(Workdir(tmp_path).tracking_uri())
    run = tracking.Run.start(uri, "lost", "r")

    def refused(*args, **kwargs):
        raise mlflow.exceptions.MlflowException("connection refused")

    monkeypatch.setattr(run._client, "log_batch", refused)
    monkeypatch.setattr(run._client, "set_terminated", refused)
    for step in (1, 2):
        run.log_metrics({"valid_acc": 0.5, "train_loss": 1.0}, step=step)   # training goes on
    run.end()
    err = capsys.readouterr().err
    assert "4 metric values" in err and "train_loss, valid_acc at steps 1..2" in err
    assert "could not mark FINISHED" in err


_KILLED = """
import os, sys
from iaa.platform.tracking import store as tracking
run = tracking.Run.start(sys.argv[1], "killed", "r")
print(run.run_id, flush=True)
os.kill(os.getpid(), 9)
"""


def test_a_run_whose_process_was_killed_is_marked_killed_at_the_next_start(tmp_path: Path) -> None:
    from iaa.platform.tracking import connection
    from iaa.platform.tracking import store as tracking

    uri = connection.open_store(Workdir(tmp_path).tracking_uri())
    alive = tracking.Run.start(uri, "killed", "alive")          # this process: left alone
    child = subprocess.run([sys.executable, "-c", _KILLED, uri], capture_output=True, text=True, timeout=100)
    run_id = child.stdout.strip()
    assert child.returncode == -9 and MlflowClient(uri).get_run(run_id).info.status == "RUNNING"
    connection.open_store(Workdir(tmp_path).tracking_uri())
    killed = MlflowClient(uri).get_run(run_id)
    assert killed.info.status == "KILLED" and "ended without closing" in killed.data.tags["iaa.killed"]
    assert MlflowClient(uri).get_run(alive.run_id).info.status == "RUNNING"
    MlflowClient(uri).set_tag(run_id, "interrupted", "SIGINT")        # and a signal stopped it before
    tracking.Run.reopen(uri, run_id).end("FINISHED")                   # a resume finishes it
    finished = MlflowClient(uri).get_run(run_id)
    assert finished.info.status == "FINISHED" and not {"iaa.killed", "interrupted"} & set(finished.data.tags)


@pytest.mark.slow
def test_a_resumed_training_run_continues_its_mlflow_run(tmp_path: Path) -> None:
    from dataclasses import replace

    from iaa.cli.adapters import MODEL_FILE
    from iaa.jobs.datasets import resolve

    from iaa.jobs.ports import TrainRun
    from iaa.jobs.train import train
    from iaa.platform.tracking.tracker import MlflowTracker
    from tests._tiny import TINY_SETS, make_tiny_prepared

    tiny = make_tiny_prepared(tmp_path / "tiny")
    cfg = resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, "train.max_epochs=1"))
    tracker = MlflowTracker(Workdir(tmp_path).tracking_uri(), MODEL_FILE)
    first = train.run_tracked(TrainRun(cfg, tiny, tmp_path / "run", show_progress=False), tracker)
    longer = replace(cfg, train=replace(cfg.train, max_epochs=2.0))
    again = train.run_tracked(TrainRun(longer, tiny, tmp_path / "run", resume=True, show_progress=False), tracker)
    assert again.mlflow_run_id == first.mlflow_run_id
    run = MlflowClient(first.tracking_uri).get_run(first.mlflow_run_id)
    assert run.info.status == "FINISHED"
    steps = [s for s, _ in _history(first.tracking_uri, run.info.run_id, "valid_acc")]
    assert steps == sorted(steps) and len(steps) > 2               # the resumed checks follow the first ones


def test_a_deleted_run_leaves_its_experiments_lists_and_can_be_restored(tmp_path: Path) -> None:
    from iaa.platform.tracking.store import Run
    from iaa.platform.tracking.tracker import MlflowTracker

    tracker = MlflowTracker(f"sqlite:///{tmp_path / 'm.db'}")
    kept, dropped = (Run.start(tracker.uri, "train-demo", name, tags={"run_dir": "/r"}) for name in ("a", "b"))
    tracker.delete_run(dropped.run_id)
    assert [r.run_id for r in tracker.find_runs("train-demo", {"run_dir": "/r"})] == [kept.run_id]
    assert [r.run_id for r in tracker.experiment_records("train-demo")] == [kept.run_id]
    MlflowClient(tracker.uri).restore_run(dropped.run_id)
    assert len(tracker.find_runs("train-demo")) == 2


def test_experiments_open_in_the_training_runs_view(tmp_path: Path) -> None:
    from iaa.platform.tracking import connection

    uri = connection.open_store(Workdir(tmp_path).tracking_uri())
    experiment = MlflowClient(uri).get_experiment(connection.experiment_id(uri, "tune-demo"))
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def _mlflow_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """A real MLflow tracking server on a free port, once it answers /health: its URI and process
    (killed at the end, if still alive)."""
    import os
    import urllib.request

    port = _free_port()
    uri = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
                               "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              cwd=tmp_path)                      # its artifacts: tmp_path/mlartifacts
    try:
        deadline = time.time() + 180
        while True:
            try:
                urllib.request.urlopen(f"{uri}/health", timeout=2).close()
                break
            except OSError:
                assert time.time() < deadline and server.poll() is None, "the MLflow server did not start"
                time.sleep(0.5)
        yield uri, server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 9)
        server.wait()


def _train(tiny: Path, workdir: Path, uri: str, *sets: str, **popen: Any) -> subprocess.Popen:
    """``iaa-cli train --json`` of the tiny data in a process of its own, tracked at ``uri``."""
    import os

    from tests._tiny import TINY_SETS

    args = [a for s in (*TINY_SETS, *sets) for a in ("--set", s)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen([sys.executable, "-m", "iaa.cli", "train", "--data", str(tiny), *args, "--workdir",
                             str(workdir), "--tracking-uri", uri, "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_training_outlives_a_tracking_server_that_dies(tmp_path: Path) -> None:
    """A real MLflow server killed after the first check: training ends, then exits 1 naming what was lost."""
    import os

    from tests._tiny import make_tiny_prepared

    tiny = make_tiny_prepared(tmp_path / "tiny", {"train": 1200, "valid": 64, "test": 64})
    with _mlflow_server(tmp_path) as (uri, server):
        train = _train(tiny, tmp_path / "w", uri, "train.check_every=10", "train.max_epochs=3")
        client = MlflowClient(uri)
        while not any(client.get_metric_history(r.info.run_id, "valid_acc")
                      for e in client.search_experiments() for r in client.search_runs([e.experiment_id])):
            assert train.poll() is None, train.communicate()
            time.sleep(0.2)
        os.killpg(server.pid, 9)
    out, err = train.communicate(timeout=500)
    assert train.returncode == 1, err[-3000:]   # finished, but its record is not whole
    assert [p.is_file() for p in (tmp_path / "w" / "runs").glob("*/checkpoints/best.pt")] == [True]
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "not logged" in errors[0] and "valid_acc" in errors[0], err[-3000:]
    assert "were not logged to MLflow" in err and "Traceback" not in err


def test_a_server_store_keeps_mlflows_links_off_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's client writes links to a server's run and model pages to stdout; stdout is the
    command's, whose last line a script reads as JSON. Opening a store switches them off."""
    from mlflow.environment_variables import MLFLOW_PRINT_MODEL_URLS_ON_CREATION, MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT

    from iaa.errors import IaaError
    from iaa.platform.tracking import connection

    for name in ("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "MLFLOW_PRINT_MODEL_URLS_ON_CREATION"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(IaaError):
        connection.open_store("http://127.0.0.1:9")                  # set before the server is asked
    assert MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT.get() is True and MLFLOW_PRINT_MODEL_URLS_ON_CREATION.get() is False


def test_an_experiment_says_what_made_it_and_on_which_data(tmp_path: Path) -> None:
    """The experiment's description (``mlflow.note.content``, what the UI shows above its runs)
    names the dataset and the command, from the first run that creates it."""
    from iaa.platform.tracking import store

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    run = store.Run.start(uri, "tune-demo", "demo-iaa-1", tags={"dataset": "demo"})
    note = client.get_experiment(client.get_run(run.run_id).info.experiment_id).tags["mlflow.note.content"]
    assert "demo dataset" in note and "iaa-cli tune" in note and "\n" not in note
    run = store.Run.start(uri, "distill-ens-1", "student", tags={"dataset": "cbt-ne"})
    note = client.get_experiment(client.get_run(run.run_id).info.experiment_id).tags["mlflow.note.content"]
    assert "cbt-ne dataset" in note and "iaa-cli distill" in note and "ens-1" in note


def test_a_run_carries_mlflows_source_tags(tmp_path: Path) -> None:
    """The UI's source column: the command and the commit, as MLflow's own system tags."""
    import subprocess

    from mlflow.tracking import MlflowClient

    from iaa.platform.tracking.store import Run

    uri = f"sqlite:///{tmp_path / 'm.db'}"
    run = Run.start(uri, "e", "r")
    tags = MlflowClient(uri).get_run(run.run_id).data.tags
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=Path(__file__).parent).stdout.strip()
    assert tags["mlflow.source.type"] == "LOCAL" and tags["mlflow.source.name"]
    assert tags.get("mlflow.source.git.commit") == (head or None) and "git_commit" not in tags
