"""Fault suite, a sweep's record on resume: a damaged ``sweep.json`` is refused in one line naming
the file and the key before anything starts; a finished sweep resumes at once with nothing to run
and its folder untouched; and the Optuna trials a killed process left RUNNING end FAIL when the
next command tidies the MLflow runs it left, while a live process's trials are kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _faults import assert_one_message, invoke, make_prepared, snapshot

pytestmark = pytest.mark.timeout(180)
REPO = Path(__file__).resolve().parents[1]
ROW = {"trial_id": "t1", "config": {}, "status": "TERMINATED", "checks": 2, "steps": 8, "best_valid_acc": 0.5}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("records"))[1]


def _make_study(workdir: Path, name: str) -> None:
    import optuna

    optuna.create_study(study_name=name, storage=f"sqlite:///{workdir / 'optuna.db'}", direction="maximize")


def _sweep(workdir: Path, prepared: Path, **edit: object) -> Path:
    """A resumable record of sweep ``s`` with two finished trials (``edit`` changes its keys; a
    value of None removes the key), its study in ``WORKDIR/optuna.db``."""
    record = {"name": "s", "dataset": "cbt-ne", "data_dir": str(prepared), "tracking_uri": "sqlite:///mlflow.db",
              "experiment": "tune-cbt-ne", "parent_run_id": "p" * 32, "storage": "ray/s",
              "search_space": {"params": {"model.steps": {"choices": [1, 2]}}, "fixed": {}},
              "num_samples": 2, "asha": {"grace_period": 1, "reduction_factor": 2},
              "workers_per_trial": 1, "max_concurrent": 1, "optuna": {"storage": "sqlite:///optuna.db", "study": "s"},
              "trials": [ROW, {**ROW, "trial_id": "t2", "best_valid_acc": 0.25}]}
    for key, value in edit.items():
        record.pop(key) if value is None else record.__setitem__(key, value)
    path = workdir / "sweeps" / "s" / "sweep.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record), encoding="utf-8")
    _make_study(workdir, "s")
    return path


def _ray_started() -> bool:
    ray = sys.modules.get("ray")
    return ray is not None and ray.is_initialized()


@pytest.mark.parametrize("edit, key", [
    ({"asha": {"grace_period": 1, "reduction_factor": float("nan")}}, "asha.reduction_factor: expected a finite number"),
    ({"search_space": None}, "search_space: missing"),
    ({"optuna": {"storage": "sqlite:///optuna.db", "study": "gone"}}, "optuna.study: no study 'gone'"),
])
@pytest.mark.parametrize("with_data", [False, True], ids=["name-alone", "with-data"])
def test_a_damaged_sweep_record_is_refused_on_resume_before_anything_starts(prepared, tmp_path, edit, key, with_data):
    work = tmp_path / "w"
    record = _sweep(work, prepared, **edit)
    before = snapshot(work)
    code, output = invoke("tune", "--resume", "s", *(("--data", prepared) if with_data else ()), "--workdir", work)
    assert_one_message(code, output, str(record), key)
    assert snapshot(work) == before, "the work folder changed"
    assert not (work / "ray").exists() and not _ray_started()


def test_a_finished_sweep_resumes_with_nothing_left_to_run_and_its_folder_as_it_was(prepared, tmp_path):
    work = tmp_path / "w"
    record = _sweep(work, prepared)
    (record.parent / "best_config.yaml").write_text("model:\n  steps: 1\n", encoding="utf-8")
    before = snapshot(record.parent)
    code, output = invoke("tune", "--resume", "s", "--workdir", work, "--json")
    assert code == 0, output
    assert "nothing left to run" in output and "2 of 2 trials" in output
    assert f"iaa-cli tune --dataset cbt-ne --warm-start s --workdir {work.absolute()}" in output   # how to search on
    result = json.loads([line for line in output.splitlines() if line.startswith("{")][-1])
    assert result["sweep"] == "s" and result["best_trial"] == "t1" and result["best_valid_acc"] == 0.5
    assert result["trials"] == 2 and result["nothing_left"] is True
    assert snapshot(record.parent) == before, "the sweep's folder changed"
    assert not (work / "ray").exists() and not _ray_started()


_KILLED = """
import os, sys
import optuna
from iaa.platform.cluster.owner import owner
from iaa.platform.tracking import store as tracking

uri, study_url = sys.argv[1], sys.argv[2]
parent = tracking.Run.start(uri, "tune-cbt-ne", "s", tags={"sweep": "s"})
parent.log_params({"tune.study": "s", "tune.study_storage": study_url})
child = tracking.Run.start(uri, "tune-cbt-ne", "s-t2", tags={"sweep": "s", "trial_id": "t2"},
                           parent_run_id=parent.run_id)
study = optuna.load_study(study_name="s", storage=study_url)
study.ask().set_user_attr("iaa.owner", owner())           # asked by this process
study.ask().set_user_attr("tune_trial_id", "t2")           # asked before trials carried an owner
study.ask()                                                # asked, then no write could tag it (a full disk)
print(parent.run_id, child.run_id, flush=True)
os.kill(os.getpid(), 9)
"""


def test_the_next_command_fails_the_optuna_trials_a_killed_sweep_left_and_keeps_a_live_ones(tmp_path):
    import optuna
    from mlflow.tracking import MlflowClient

    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.cluster.owner import owner
    from iaa.platform.tracking import connection

    work = tmp_path / "w"
    work.mkdir()
    uri = connection.open_store(Workdir(work).tracking_uri())
    study_url = f"sqlite:///{work / 'optuna.db'}"
    _make_study(work, "s")
    live = optuna.load_study(study_name="s", storage=study_url).ask()
    live.set_user_attr("iaa.owner", owner())                 # a sweep of this process, running now
    child = subprocess.run([sys.executable, "-c", _KILLED, uri, study_url], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.returncode == -9, child.stderr[-2000:]
    run_ids = child.stdout.split()

    connection.open_store(Workdir(work).tracking_uri())     # what train, ensemble, ... do first

    assert {MlflowClient(uri).get_run(r).info.status for r in run_ids} == {"KILLED"}
    trials = {t.number: t for t in optuna.load_study(study_name="s", storage=study_url).trials}
    assert trials[live.number].state.name == "RUNNING"
    dead = [t for n, t in trials.items() if n != live.number]
    assert len(dead) == 3 and all(t.state.name == "FAIL" and t.user_attrs.get("killed") for t in dead)


def test_each_trial_a_sweep_asks_carries_the_process_that_runs_it():
    import optuna

    from iaa.platform.cluster.owner import owner
    from iaa.platform.sweeps.search.distinct_search import StudySearch

    search = StudySearch({"x": optuna.distributions.CategoricalDistribution([1, 2])}, optuna.samplers.RandomSampler())
    search.suggest("t1")
    assert search.study.trials[0].user_attrs["iaa.owner"] == owner()


def test_the_records_keys_are_checked_and_documented_as_its_fields() -> None:
    """A key of ``SweepRecord`` has a kind its check reads it by (``HEADER``) and a place in the
    module's list of the keys that are a contract, so that a new field cannot be left out of
    either."""
    import dataclasses
    import re

    from iaa.jobs.sweeps import record

    keys = {f.name for f in dataclasses.fields(record.SweepRecord)} - {"unknown"} | {"schema"}
    assert set(record.HEADER) == keys
    listed = record.__doc__.split("::", 1)[1].split("``schema``", 1)[0]
    assert set(re.findall(r'"(\w+)"', listed)) == keys
