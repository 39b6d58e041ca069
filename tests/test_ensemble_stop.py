"""Ctrl-C during ``iaa-cli ensemble``: its line speaks of kept members only where the ensemble
trains a sweep's members, and those that finished before the stop are reused by the rerun.
In-process on the fakes of the ports (tests/fakes.py), seconds each."""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import replace
from pathlib import Path

import pytest

from _faults import as_shown, assert_says
from fakes import FakeLauncher, FakeTracker
from _tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


def _ctrl_c(*args: object, **kwargs: object) -> None:
    """Stands for the work the user stops: a SIGINT to this process while it runs."""
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(30)
    raise AssertionError("the SIGINT did not stop the ensemble")


def test_a_stopped_ensemble_of_given_members_says_nothing_of_kept_members(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Given checkpoints train nothing: the line gives the resume command and keeps no member."""
    from iaa.jobs import interrupt
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
    from tests._explain import tiny_checkpoint

    members = tuple(tiny_checkpoint(tiny, tmp_path / f"m{seed}.pt", seed=seed) for seed in (0, 1))
    monkeypatch.setattr(ensemble, "evaluate_members", _ctrl_c)
    tracker = FakeTracker()
    with pytest.raises(interrupt.Interrupted) as stopped:
        ensemble.run(EnsembleRequest(members=members, data=tiny, workdir=tmp_path / "work", show_progress=False),
                     tracker)
    line = as_shown(stopped.value.message)
    assert_says(line, "interrupted by SIGINT", "resume with:", f"--members {members[0]}", f"--members {members[1]}")
    before_resume = line.split("resume with:")[0]        # the paths after it may hold any word
    assert "kept" not in before_resume and "member" not in before_resume, line
    assert [run.state for run in tracker.runs.values()] == ["KILLED"]


def _swept(tiny: Path, tmp_path: Path) -> tuple[FakeTracker, FakeLauncher, Path]:
    """A finished one-trial sweep named ``one`` in ``tmp_path / "work"``, on the fakes."""
    from iaa.jobs.tune import tune

    space = tmp_path / "space.yaml"
    space.write_text("model.hidden_dim: [8]\n", encoding="utf-8")
    tracker, launcher, work = FakeTracker(), FakeLauncher(), tmp_path / "work"
    tune.run(tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=1, search_space=space, sets=TINY_SETS,
                              workdir=work, name="one", show_progress=False), lambda uri: tracker, launcher)
    return tracker, launcher, work


def test_a_stopped_ensemble_of_a_sweep_says_it_kept_the_members_trained(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopped while it trains a sweep's missing members: the line says that those trained so far
    are kept and reused by the resume command."""
    from iaa.jobs import interrupt
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest

    tracker, launcher, work = _swept(tiny, tmp_path)
    monkeypatch.setattr(launcher, "train_many", _ctrl_c)
    with pytest.raises(interrupt.Interrupted) as stopped:
        ensemble.run(EnsembleRequest(sweep="one", data=tiny, top_configs=1, seeds=2, workdir=work,
                                     show_progress=False), tracker, launcher)
    assert_says(as_shown(stopped.value.message), "interrupted by SIGINT", "kept the members whose training finished",
                "reused on a rerun", "resume with:", "--sweep one")


def test_members_that_finished_before_a_stop_are_kept_and_not_trained_again(
        tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C after one of the members being trained finished: the ledger holds it, and the same
    command trains only the others."""
    from iaa.jobs import interrupt
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
    from iaa.jobs.ensemble.members import LEDGER
    from iaa.jobs.ports import MembersRequest

    tracker, launcher, work = _swept(tiny, tmp_path)
    train_many, asked = launcher.train_many, []

    def first_then_stop(request: MembersRequest) -> None:
        asked.append(request)
        train_many(replace(request, configs=request.configs[:1]))      # its run ends FINISHED
        _ctrl_c()

    req = EnsembleRequest(sweep="one", data=tiny, top_configs=1, seeds=3, workdir=work, show_progress=False)
    monkeypatch.setattr(launcher, "train_many", first_then_stop)
    with pytest.raises(interrupt.Interrupted):
        ensemble.run(req, tracker, launcher)
    [stopped] = asked
    assert len(stopped.configs) >= 2
    [ledger] = list((work / "ensembles").glob(f"*/{LEDGER}"))
    [kept] = json.loads(ledger.read_text())
    assert kept["config"]["train"]["seed"] == stopped.configs[0].train.seed and Path(kept["checkpoint"]).name

    monkeypatch.setattr(launcher, "train_many", train_many)
    launcher.requests.clear()
    done = ensemble.run(req, tracker, launcher)
    [again] = [r for r in launcher.requests if isinstance(r, MembersRequest)]
    assert [c.train.seed for c in again.configs] == [c.train.seed for c in stopped.configs[1:]]
    # the rerun continues the stopped ensemble's run: one run, FINISHED, with the members it trained under it
    [run] = [r for r in tracker.runs.values() if r.tags.get("kind") == "ensemble"]
    assert run.run_id == done.mlflow_run_id and run.state == "FINISHED" and "interrupted" not in run.tags
    assert len(tracker.children(run.run_id)) == len(stopped.configs)       # the members it trained
