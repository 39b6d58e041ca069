"""The embedded MLflow store: several processes may create it at once."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.timeout(120)

_CHILD = """
import sys, time
from iaa.platform import tracking
start = float(sys.argv[2])
while time.time() < start:          # all children reach the store at the same moment
    time.sleep(0.001)
run = tracking.Run.start(sys.argv[1], "race", "r")   # what `iaa-cli train` does first
print(run.client.get_run(run.run_id).info.experiment_id)
"""


@pytest.mark.slow
def test_processes_creating_a_fresh_sqlite_store_at_once_all_succeed(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    start = time.time() + 8.0                       # after every child has imported mlflow
    children = [subprocess.Popen([sys.executable, "-c", _CHILD, uri, str(start)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(4)]
    results = [child.communicate(timeout=100) for child in children]
    for child, (_, err) in zip(children, results):
        assert child.returncode == 0, err[-2000:]
    ids = {out.strip() for out, _ in results}
    assert len(ids) == 1                            # one experiment, found by all
    assert len(MlflowClient(uri).search_runs(list(ids))) == 4
    assert MlflowClient(uri).get_experiment(ids.pop()).name == "race"
