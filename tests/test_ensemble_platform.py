"""Planning the members of a sweep ensemble: K best configs x N seeds, reusing what exists.

``iaa.platform.sweeps.launch`` is replaced by a fake module, so Ray is neither imported nor started.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import pytest

from iaa.errors import IaaError
from iaa.jobs.config.job_config import JobConfig, TrainConfig, to_dict
from _faults import assert_says
from fakes import FakeTracker
from iaa.jobs.ports import WORKER_LOST, ConnectRequest, MembersRequest, TrialRecord, TrialRun
from iaa.jobs.ensemble import members as members_job
from iaa.jobs.ensemble import ensemble, sweep_training
from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
from iaa.jobs.ports import TrialTracking
from iaa.jobs.sweeps.record import SweepRecord

pytestmark = pytest.mark.timeout(60)


def trial(tmp_path: Path, tid: str, acc: float | None, lr: float, seed: int = 0, status: str = "TERMINATED",
          with_ckpt: bool = True) -> dict:
    cfg = JobConfig(train=TrainConfig(lr=lr, seed=seed, max_epochs=2))
    ckpt = tmp_path / "trials" / tid / "best.pt"
    if with_ckpt:
        ckpt.parent.mkdir(parents=True, exist_ok=True)
        ckpt.write_bytes(b"")
    data = to_dict(cfg)
    data["train"]["max_epochs"] = 2  # an int in JSON, as a float in the dataclass: must still match
    return {"trial_id": tid, "config": data, "best_valid_acc": acc, "checkpoint": str(ckpt),
            "mlflow_run_id": f"run-{tid}", "status": status}


@pytest.fixture
def sweep(tmp_path: Path) -> SweepRecord:
    trials = [
        trial(tmp_path, "t0", 0.50, lr=1e-3),
        trial(tmp_path, "t1", 0.70, lr=2e-3),
        trial(tmp_path, "t2", 0.65, lr=2e-3, seed=1),            # same config as t1 but seed 1
        trial(tmp_path, "t3", 0.60, lr=3e-3),
        trial(tmp_path, "t4", 0.90, lr=4e-3, status="ERROR"),    # failed: never chosen, never reused
        trial(tmp_path, "t5", None, lr=5e-3, with_ckpt=False),
    ]
    return SweepRecord(name="demo-iaa", dataset="demo", data_dir=str(tmp_path / "data"), tracking_uri="",
                       experiment="tune-demo", parent_run_id="parent-123",
                       trials=tuple(TrialRecord.from_json(t) for t in trials))


class FakeLauncher:
    """A Launcher whose train_many "trains" each config into an empty checkpoint file, and records its calls."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.calls = folder, []

    def train_many(self, request):
        self.calls.append(request)
        out = []
        for cfg in request.configs:
            ckpt = self.folder / "trained" / f"lr{cfg.train.lr}-seed{cfg.train.seed}.pt"
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            ckpt.write_bytes(b"")
            out.append(TrialRecord(trial_id=f"t-{cfg.train.seed}", config=cfg, checkpoint=str(ckpt),
                                   best_valid_acc=0.5, mlflow_run_id="new"))
        return out


@pytest.fixture
def launcher(tmp_path: Path) -> FakeLauncher:
    return FakeLauncher(tmp_path)


def test_best_configs_are_distinct_and_skip_failed(sweep: SweepRecord) -> None:
    configs = members_job.best_configs(sweep.name, list(sweep.trials), 2)
    assert [c.train.lr for c in configs] == [2e-3, 3e-3]   # t1 (t2 is the same config), then t3
    assert configs[0].train.seed == 0


def test_sweep_members_reuse_matching_trials_and_train_the_rest(sweep: SweepRecord, launcher: FakeLauncher,
                                                                 tmp_path: Path) -> None:
    fake_tune = launcher.calls
    req = EnsembleRequest(sweep="demo-iaa", top_configs=2, seeds=3, workdir=tmp_path)
    out_dir = tmp_path / "ensembles" / "demo-iaa"
    members = sweep_training.sweep_members(req, sweep, tmp_path / "data", out_dir, FakeTracker(), "demo-iaa",
                                           launcher, run_id="ensemble-run")

    assert [(m.config.train.lr, m.config.train.seed) for m in members] == [
        (2e-3, 0), (2e-3, 1), (2e-3, 2), (3e-3, 0), (3e-3, 1), (3e-3, 2)]
    assert [m.source for m in members] == ["trial t1", "trial t2", "trained", "trial t3", "trained", "trained"]
    assert members[1].mlflow_run_id == "run-t2"
    assert len(fake_tune) == 1
    call = fake_tune[0]
    assert [(c.train.lr, c.train.seed) for c in call.configs] == [(2e-3, 2), (3e-3, 1), (3e-3, 2)]
    # the members nest under the ensemble's run, tagged with the sweep's name (not the Tune run's)
    assert call.trials.tracking.parent_run_id == "ensemble-run" and call.trials.tracking.experiment == "tune-demo"
    assert call.trials.tracking.sweep == "demo-iaa"
    assert call.connection.name.startswith("ensemble-demo-iaa-")   # never the sweep's own name: its folder stays intact
    assert call.trials.downloads == out_dir / "checkpoints"   # the members it trains land in the ensemble's folder
    # each member's run is named by the ensemble and its seed, and logs the data
    assert call.trials.tracking.member_names == ("demo-iaa-config0-seed-2", "demo-iaa-config1-seed-1",
                                                 "demo-iaa-config1-seed-2")
    # the table's labels read as the members' run names do
    assert [m.label for m in members] == ["config0-seed-0", "config0-seed-1", "config0-seed-2",
                                          "config1-seed-0", "config1-seed-1", "config1-seed-2"]
    assert call.trials.tracking.data_dir == tmp_path / "data"

    # A second run finds the members it trained in trained.json and trains nothing.
    again = sweep_training.sweep_members(req, sweep, tmp_path / "data", out_dir, FakeTracker(), "demo-iaa", launcher)
    assert len(fake_tune) == 1
    assert [m.checkpoint for m in again] == [m.checkpoint for m in members]
    assert [m.source for m in again][2] == "trained earlier"
    # So does another ensemble of the same sweep under another name.
    other = sweep_training.sweep_members(req, sweep, tmp_path / "data", tmp_path / "ensembles" / "other",
                                         FakeTracker(), "other", launcher)
    assert len(fake_tune) == 1 and [m.checkpoint for m in other] == [m.checkpoint for m in members]


def test_all_seeds_reused_means_no_training(sweep: SweepRecord, tmp_path: Path) -> None:
    req = EnsembleRequest(sweep="demo-iaa", top_configs=1, seeds=2, workdir=tmp_path)
    members = sweep_training.sweep_members(req, sweep, tmp_path / "data", tmp_path / "out", FakeTracker(), "e", None)
    assert [m.source for m in members] == ["trial t1", "trial t2"]


@pytest.mark.parametrize("stop, said", [
    ({"stop_reason": "asha", "checks": 1}, "t1 stopped by ASHA after 1 check"),
    ({"stop_reason": "time-budget", "checks": 3}, "t1 cut by the sweep's time budget after 3 checks"),
], ids=["asha", "time-budget"])
def test_a_trial_stopped_short_of_its_budget_is_trained_in_full_not_reused(
        sweep: SweepRecord, launcher: FakeLauncher, tmp_path: Path, caplog: pytest.LogCaptureFixture,
        stop: dict, said: str) -> None:
    """Seed 0 of the best configuration is a trial that ASHA (or the time budget) stopped early:
    its seed is trained with the configuration's whole budget, as the other seeds were, and the
    line that says what is reused and trained names it; a rerun reuses that member, not the trial."""
    short = tuple(replace(t, **stop) if t.trial_id == "t1" else t for t in sweep.trials)
    sweep = replace(sweep, trials=short)
    req = EnsembleRequest(sweep="demo-iaa", top_configs=1, seeds=2, workdir=tmp_path)
    out_dir = tmp_path / "ensembles" / "e"
    with caplog.at_level("INFO", logger="iaa.jobs.ensemble.sweep_training"):
        members = sweep_training.sweep_members(req, sweep, tmp_path / "data", out_dir, FakeTracker(), "e", launcher)
    assert [(m.config.train.seed, m.source) for m in members] == [(0, "trained"), (1, "trial t2")]
    [call] = launcher.calls
    assert [c.train.seed for c in call.configs] == [0]
    assert_says(caplog.text, "reusing 1 checkpoint, training 1 member on Ray, 1 of them in full",
                f"config0-seed-0 ({said})")
    again = sweep_training.sweep_members(req, sweep, tmp_path / "data", out_dir, FakeTracker(), "e", launcher)
    assert len(launcher.calls) == 1 and [m.source for m in again] == ["trained earlier", "trial t2"]


@pytest.mark.parametrize("failure, why", [
    ({"checkpoint": None, "status": "ERROR"}, "status ERROR"),
    ({"status": "ERROR", "stop_reason": WORKER_LOST}, "lost its worker with no restores left"),
], ids=["no-checkpoint", "lost-worker"])
def test_failed_member_is_reported_and_the_others_kept(sweep: SweepRecord, launcher: FakeLauncher, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch, failure: dict, why: str) -> None:
    """A member that failed is never averaged, even where its trial kept a checkpoint of an
    unfinished training (a worker lost with no restores left)."""
    real = launcher.train_many

    def half_fails(request):
        out = real(request)
        out[0] = replace(out[0], trial_id="bad", **failure)
        return out

    monkeypatch.setattr(launcher, "train_many", half_fails)
    req = EnsembleRequest(sweep="demo-iaa", top_configs=1, seeds=4, workdir=tmp_path)
    out_dir = tmp_path / "ensembles" / "e"
    with pytest.raises(IaaError) as caught:
        sweep_training.sweep_members(req, sweep, tmp_path / "data", out_dir, FakeTracker(), "e", launcher)
    assert_says(caught.value, "1 member(s) did not finish: seed 2 (trial bad", why)
    ledger = json.loads((out_dir / "trained.json").read_text())
    assert [e["config"]["train"]["seed"] for e in ledger] == [3]


def test_missing_sweep_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IaaError, match="no sweep 'nope'"):
        ensemble.read_sweep(tmp_path, "nope")


def test_request_is_frozen() -> None:
    req = EnsembleRequest(members=(Path("a.pt"),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.seeds = 3  # type: ignore[misc]
    assert replace(req, seeds=3).seeds == 3


def test_members_train_on_the_requested_resources(sweep: SweepRecord, launcher: FakeLauncher, tmp_path: Path) -> None:
    req = EnsembleRequest(sweep="demo-iaa", top_configs=1, seeds=3, workdir=tmp_path,
                          workers_per_trial=2, gpus_per_worker=0.5)
    sweep_training.sweep_members(req, sweep, tmp_path / "data", tmp_path / "out", FakeTracker(), "e", launcher)
    [call] = launcher.calls
    assert call.connection.workers_per_trial == 2 and call.connection.gpus_per_worker == 0.5
    assert call.connection.num_trials == len(call.configs)


def test_members_are_placed_with_the_largest_of_their_threads(sweep: SweepRecord, launcher: FakeLauncher,
                                                             tmp_path: Path) -> None:
    sweep = replace(sweep, trials=tuple(replace(t, config=replace(t.config, train=replace(t.config.train, threads=i + 1)))
                                        for i, t in enumerate(sweep.trials)))
    req = EnsembleRequest(sweep="demo-iaa", top_configs=2, seeds=3, workdir=tmp_path)
    sweep_training.sweep_members(req, sweep, tmp_path / "data", tmp_path / "out", FakeTracker(), "e", launcher)
    [call] = launcher.calls
    assert call.connection.threads == max(c.train.threads for c in call.configs) > 0


def test_train_many_places_the_members_as_their_connection_asks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from iaa.platform.sweeps import launch

    asked: dict = {}

    def connect(request, address, storage_path):
        asked["request"] = request
        raise RuntimeError("planned")   # stop before Ray

    monkeypatch.setattr(launch, "connect", connect)
    configs = (JobConfig(train=TrainConfig(seed=0, threads=3)), JobConfig(train=TrainConfig(seed=1, threads=3)))
    trials = TrialTracking(tracker=FakeTracker(), experiment="x", parent_run_id=None, sweep="e-1", dataset="demo")
    connection = ConnectRequest(name="e-1", prepared=tmp_path, storage=str(tmp_path / "ray"), num_trials=2,
                                workers_per_trial=2, gpus_per_worker=1.0, threads=3)
    with pytest.raises(RuntimeError, match="planned"):
        launch.RayLauncher().train_many(MembersRequest(
            configs=configs, connection=connection, trials=TrialRun(fit=print, tracking=trials, downloads=tmp_path / "d")))
    assert asked["request"] is connection


def test_the_same_checkpoint_twice_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "a.pt"
    ckpt.write_bytes(b"")
    with pytest.raises(IaaError, match="listed twice"):
        EnsembleRequest(members=(ckpt, tmp_path / "." / "a.pt"), workdir=tmp_path)


def test_training_members_states_its_cost_from_the_sweeps_own_pace(sweep: SweepRecord) -> None:
    timed = replace(sweep, wall_s=600.0, max_concurrent=2,
                    trials=tuple(replace(t, steps=s) for t, s in zip(sweep.trials, (100, 300, 300, 200, 50, 50))))
    # 600 s x 2 at a time over 1,000 steps: 1.2 s a step; the longest trial made 300: 360 s a member
    assert "about 18m00s at 2 at a time" in sweep_training.members_cost(timed, 5)        # 3 waves of 6m00s
    assert "6m00s a member" in sweep_training.members_cost(timed, 1)
    assert "about 6m00s one at a time (" in sweep_training.members_cost(timed, 1)        # not "2 at a time" for one
    assert "no time" in sweep_training.members_cost(sweep, 5)                          # a record without wall time


def test_an_ensemble_of_a_sweep_tracks_in_the_store_the_sweep_recorded(sweep: SweepRecord, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from iaa.cli import cli
    from iaa.jobs.sweeps import record as sweep_file
    from iaa.jobs.workdir.paths import Workdir

    work, elsewhere = tmp_path / "work", f"sqlite:///{tmp_path / 'server' / 'mlflow.db'}"
    (tmp_path / "server").mkdir()
    sweep_file.write(sweep_file.sweep_file(work, "demo-iaa"), replace(sweep, tracking_uri=elsewhere))
    assert ensemble.sweep_store(work, "demo-iaa") == elsewhere
    assert ensemble.sweep_store(work, "absent") is None and ensemble.sweep_store(work, None) is None
    opened: list[str] = []

    def stop_here(req, tracker, launcher):
        opened.append(tracker.uri)
        raise IaaError("stopped where the store is chosen")

    monkeypatch.setattr(ensemble, "run", stop_here)
    result = CliRunner().invoke(cli, ["ensemble", "--sweep", "demo-iaa", "--workdir", str(work)])
    assert result.exit_code == 1 and opened == [elsewhere]            # not a new store in the work folder
    # the next commands name a store only where it is not the work folder's own
    assert Workdir(work).named_store(elsewhere) == elsewhere
    assert Workdir(work).named_store(f"sqlite:///{work.resolve() / 'mlflow.db'}") is None
    assert Workdir(work).named_store(None) is None


def test_ensembles_of_one_sweep_built_otherwise_get_names_of_their_own() -> None:
    assert ensemble.sweep_ensemble_name("demo-iaa-77332e", 1, "all") == "demo-iaa-77332e"
    assert ensemble.sweep_ensemble_name("demo-iaa-77332e", 2, "all") == "demo-iaa-77332e-top2"
    assert ensemble.sweep_ensemble_name("demo-iaa-77332e", 3, "greedy") == "demo-iaa-77332e-top3-greedy"
