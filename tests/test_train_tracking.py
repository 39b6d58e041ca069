"""A resumed training run finds the tracked run it began through its folder's ``tracking.json``:
from any working folder, after the folder moved, and in a copied work folder's own store; a copy
of a run folder that shares its store with the original starts a tracked run of its own, so the
original's run never gets the copy's checks. In process on the fake tracker (tests/fakes.py)."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import shutil
from pathlib import Path

import pytest

from _faults import assert_says
from fakes import FakeTracker
from _tiny import TINY_SETS, make_tiny_prepared
from iaa.errors import IaaError
from iaa.jobs.datasets import resolve
from iaa.jobs.ports import TrainRun
from iaa.jobs.train import train
from iaa.jobs.workdir.paths import RunFolder

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _train(tiny: Path, run_dir: Path, tracker: FakeTracker, *, epochs: float = 1.0, resume: bool = False):
    cfg = resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, f"train.max_epochs={epochs:g}"))
    return train.run_tracked(TrainRun(cfg, tiny, run_dir, resume=resume, show_progress=False), tracker)


def _checks(tracker: FakeTracker, run_id: str) -> list[int]:
    return [point.step for point in tracker.runs[run_id].metrics["valid_acc"]]


def test_a_run_resumed_from_another_working_folder_continues_its_tracked_run(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tracker = FakeTracker()
    (tmp_path / "there").mkdir()
    monkeypatch.chdir(tmp_path)
    first = _train(tiny, Path("work/runs/x"), tracker)                 # a relative folder
    before = _checks(tracker, first.mlflow_run_id)
    monkeypatch.chdir(tmp_path / "there")
    again = _train(tiny, tmp_path / "work" / "runs" / "x", tracker, epochs=2, resume=True)
    assert again.mlflow_run_id == first.mlflow_run_id and list(tracker.runs) == [first.mlflow_run_id]
    checks = _checks(tracker, first.mlflow_run_id)
    assert checks[:len(before)] == before and len(checks) > len(before) and checks == sorted(set(checks))
    assert tracker.runs[first.mlflow_run_id].tags["run_dir"] == str((tmp_path / "work" / "runs" / "x").resolve())


def test_a_moved_run_folder_continues_its_tracked_run_and_says_where_it_is_now(tiny: Path, tmp_path: Path) -> None:
    tracker = FakeTracker()
    first = _train(tiny, tmp_path / "old" / "run", tracker)
    (tmp_path / "old").rename(tmp_path / "new")
    again = _train(tiny, tmp_path / "new" / "run", tracker, epochs=2, resume=True)
    assert again.mlflow_run_id == first.mlflow_run_id and len(tracker.runs) == 1
    here = str((tmp_path / "new" / "run").resolve())
    assert tracker.runs[first.mlflow_run_id].tags["run_dir"] == here
    assert RunFolder(tmp_path / "new" / "run").tracking().folder == here


def test_a_copied_run_folder_sharing_the_store_starts_its_own_run_and_leaves_the_original_alone(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tracker = FakeTracker()
    first = _train(tiny, tmp_path / "run", tracker)
    before = _checks(tracker, first.mlflow_run_id)
    shutil.copytree(tmp_path / "run", tmp_path / "copy")
    with caplog.at_level(logging.WARNING, logger="iaa"):
        again = _train(tiny, tmp_path / "copy", tracker, epochs=2, resume=True)
    assert again.mlflow_run_id != first.mlflow_run_id
    assert _checks(tracker, first.mlflow_run_id) == before                  # the original's run is as it was
    assert RunFolder(tmp_path / "copy").tracking().run_id == again.mlflow_run_id
    assert RunFolder(tmp_path / "run").tracking().run_id == first.mlflow_run_id
    [line] = [r.getMessage() for r in caplog.records if "copy of" in r.getMessage()]
    assert_says(line, tmp_path / "run", first.mlflow_run_id, "a tracked run of its own")
    copied = tracker.runs[again.mlflow_run_id]
    assert copied.tags["copy_of_run"] == first.mlflow_run_id
    assert copied.tags["copy_of"] == str((tmp_path / "run").resolve())
    checks = _checks(tracker, again.mlflow_run_id)                          # its curve is whole
    assert checks[:len(before)] == before and len(checks) > len(before) and checks == sorted(set(checks))
    assert "time" not in copied.metrics
    original = _train(tiny, tmp_path / "run", tracker, epochs=2, resume=True)
    assert original.mlflow_run_id == first.mlflow_run_id                    # the original still continues its own


def test_a_copied_work_folder_continues_the_run_in_its_own_copy_of_the_store(tiny: Path, tmp_path: Path) -> None:
    tracker = FakeTracker()
    first = _train(tiny, tmp_path / "work" / "runs" / "x", tracker)
    before = _checks(tracker, first.mlflow_run_id)
    shutil.copytree(tmp_path / "work", tmp_path / "copy")
    theirs = copy.deepcopy(tracker)
    theirs.uri = "memory:copy"          # the copy's own store: a copy of the original's, at another place
    again = _train(tiny, tmp_path / "copy" / "runs" / "x", theirs, epochs=2, resume=True)
    assert again.mlflow_run_id == first.mlflow_run_id and list(theirs.runs) == [first.mlflow_run_id]
    assert len(_checks(theirs, first.mlflow_run_id)) > len(before)
    assert _checks(tracker, first.mlflow_run_id) == before
    assert RunFolder(tmp_path / "copy" / "runs" / "x").tracking().uri == "memory:copy"


def test_a_resume_that_extends_the_budget_says_so_in_tags_beside_the_first_params(tiny: Path, tmp_path: Path) -> None:
    tracker = FakeTracker()
    first = _train(tiny, tmp_path / "run", tracker)
    _train(tiny, tmp_path / "run", tracker, epochs=2, resume=True)
    run = tracker.runs[first.mlflow_run_id]
    assert run.params["train.max_epochs"] == "1.0" and not run.lost       # MLflow keeps a param's first value
    assert run.tags["resumed.train.max_epochs"] == "2.0"
    assert not [k for k in run.tags if k.startswith("resumed.") and k != "resumed.train.max_epochs"]
    _train(tiny, tmp_path / "run", tracker, epochs=2, resume=True)         # the same budget again: as it was
    assert run.tags["resumed.train.max_epochs"] == "2.0"


def _stopped_attempt(tracker: FakeTracker, run_dir: Path, *, checks: int = 0) -> str:
    """A run of ``run_dir`` that a signal stopped after ``checks`` checks."""
    run = tracker.start_run("train-cbt-ne", run_dir.name, tags={"run_dir": str(run_dir.resolve())})
    for step in range(checks):
        run.log_metrics({"valid_acc": 0.5}, step=step)
    run.set_tags({"interrupted": "SIGINT"})
    run.end("KILLED")
    return run.run_id


def test_a_run_started_again_replaces_the_run_of_its_attempt_stopped_before_a_check(
        tiny: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tracker = FakeTracker()
    elsewhere = _stopped_attempt(tracker, tmp_path / "other")
    stopped = _stopped_attempt(tracker, tmp_path / "run")
    with caplog.at_level(logging.INFO, logger="iaa"):
        again = _train(tiny, tmp_path / "run", tracker)
    assert list(tracker.deleted) == [stopped]
    assert sorted(tracker.runs) == sorted([elsewhere, again.mlflow_run_id])
    [line] = [r.getMessage() for r in caplog.records if stopped in r.getMessage()]
    assert_says(line, tmp_path / "run", "before its first check", "restored")


def test_a_run_started_again_keeps_a_stopped_attempt_that_made_checks(tiny: Path, tmp_path: Path) -> None:
    tracker = FakeTracker()
    stopped = _stopped_attempt(tracker, tmp_path / "run", checks=1)
    again = _train(tiny, tmp_path / "run", tracker)
    assert not tracker.deleted and sorted(tracker.runs) == sorted([stopped, again.mlflow_run_id])


def test_a_store_that_does_not_hold_the_run_is_refused_before_it_trains(tiny: Path, tmp_path: Path) -> None:
    first = _train(tiny, tmp_path / "run", FakeTracker())
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()
    other = FakeTracker()
    other.uri = "memory:other"
    with pytest.raises(IaaError) as refused:
        _train(tiny, tmp_path / "run", other, epochs=2, resume=True)
    assert_says(refused.value, first.mlflow_run_id, "is not in memory:other", "`workdir`", "tracking.json")
    assert not other.runs and (tmp_path / "run" / "metrics.jsonl").read_text() == metrics
    RunFolder(tmp_path / "run").tracking_file.unlink()           # what the error offers: a new tracked run there
    again = _train(tiny, tmp_path / "run", other, epochs=2, resume=True)
    assert list(other.runs) == [again.mlflow_run_id]


def test_a_damaged_tracking_file_is_one_error_naming_it(tiny: Path, tmp_path: Path) -> None:
    tracker = FakeTracker()
    _train(tiny, tmp_path / "run", tracker)
    record = RunFolder(tmp_path / "run").tracking_file
    record.write_text('{"run_id": "run-1",\n "tracking_uri": ', encoding="utf-8")
    with pytest.raises(IaaError) as bad:
        _train(tiny, tmp_path / "run", tracker, epochs=2, resume=True)
    assert_says(bad.value, record, "line 2", "remove it")
    record.write_text(json.dumps({"run_id": "run-1"}), encoding="utf-8")
    with pytest.raises(IaaError) as short:
        _train(tiny, tmp_path / "run", tracker, epochs=2, resume=True)
    assert_says(short.value, record, "tracking_uri")
    assert len(tracker.runs) == 1


def test_the_tracking_record_round_trips(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path / "run")
    folder.path.mkdir()
    assert folder.tracking() is None
    written = folder.track("sqlite:///x.db", "abc")
    assert folder.tracking() == written and dataclasses.astuple(written) == (
        "sqlite:///x.db", "abc", str(folder.path.resolve()))
