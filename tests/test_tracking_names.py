"""What the MLflow store shows at a glance: logged models named by sweep and trial (or ensemble
and seed) and unique in the store, seeds as a column, an ensemble's run nested under its sweep's,
a distilled student in ``distill-ENSEMBLE``, and every run's data in the Datasets column."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import pytest
from mlflow.tracking import MlflowClient

from _tiny import TINY_SETS, make_tiny_prepared
from fakes import FakeLauncher
from iaa.platform.sweeps.driver_side import DriverSide, bound
from iaa.jobs.workdir.paths import Workdir

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def checkpoint(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny trained reader (two epochs of 192 examples)."""
    from iaa.jobs.datasets import resolve
    from iaa.jobs.train import train

    cfg = resolve.job_config("cbt-ne", tiny, sets=TINY_SETS)
    return Path(train.run(cfg, tiny, tmp_path_factory.mktemp("run"), show_progress=False).checkpoint)


def _tracker(tmp_path: Path) -> Any:
    from iaa.cli.adapters import MODEL_FILE
    from iaa.platform.tracking.tracker import MlflowTracker

    return MlflowTracker(Workdir(tmp_path).tracking_uri(), MODEL_FILE)


def _datasets(uri: str, run_id: str) -> list[str]:
    return [i.dataset.name for i in MlflowClient(uri).get_run(run_id).inputs.dataset_inputs]


def test_logged_models_are_named_by_sweep_and_trial_and_unique_in_the_store(tmp_path: Path, tiny: Path,
                                                                            checkpoint: Path) -> None:
    from iaa.jobs.evaluation.predictor import MODEL_CODE
    from iaa.jobs.ports import ModelFiles

    tracker = _tracker(tmp_path)
    names = []
    # two sweeps whose third trials tried the same values (so their runs have the same name),
    # and a sweep of the first one's name again (its folder was replaced)
    for sweep in ("demo-iaa-aaa", "demo-iaa-bbb", "demo-iaa-aaa"):
        run = tracker.start_run("tune-cbt-ne", "lr=4e-3 T=2", tags={"sweep": sweep, "trial_id": "84b55c_00003"})
        tracker.log_model(run, ModelFiles.of(checkpoint, tiny), code=MODEL_CODE)
        (model,) = MlflowClient(tracker.uri).search_logged_models(
            [MlflowClient(tracker.uri).get_experiment_by_name("tune-cbt-ne").experiment_id],
            filter_string=f"source_run_id = '{run.run_id}'")
        names.append(model.name)
    assert names == ["demo-iaa-aaa-trial-0003", "demo-iaa-bbb-trial-0003", "demo-iaa-aaa-trial-0003-2"]


@dataclass
class _Trial:
    """What a Tune callback reads of a trial."""

    trial_id: str
    config: dict[str, Any]
    last_result: dict[str, Any] = field(default_factory=dict)


def test_members_are_named_by_ensemble_and_seed_with_the_seed_and_data_as_columns(tmp_path: Path, tiny: Path,
                                                                                  checkpoint: Path) -> None:
    from iaa.jobs.config.job_config import to_dict
    from iaa.jobs.datasets import resolve
    from iaa.jobs.evaluation.predictor import MODEL_CODE
    from iaa.jobs.ports import ModelFiles
    from iaa.platform.sweeps.trials.trial import MEMBER_KEY, TrialSpec
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns

    tracker = _tracker(tmp_path)
    configs = [resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, f"train.seed={s}")) for s in (7, 8)]
    spec = TrialSpec(name="ensemble-ens-1", fit=None, storage_path=str(tmp_path), workers=1, threads=1,
                     members=tuple(to_dict(c) for c in configs))
    side = DriverSide(tracker=tracker, experiment="tune-cbt-ne", parent_run_id=None, dataset="cbt-ne", spec=spec,
                      data_dir=tiny, member_names=("ens-seed-7", "ens-seed-8"), sweep="demo-iaa-aaa")
    with bound("ensemble-ens-1", side):
        runs = TrialRuns("ensemble-ens-1")
        for i in range(2):
            runs.on_trial_start(0, [], _Trial(f"abc_0000{i}", {MEMBER_KEY: i}))
    client = MlflowClient(tracker.uri)
    found = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name("tune-cbt-ne").experiment_id])}
    assert sorted(found) == ["seed-7", "seed-8"]        # short under the ensemble's run, and distinct at once
    for seed in (7, 8):
        run = found[f"seed-{seed}"]
        assert run.data.params["train.seed"] == str(seed) and run.data.tags["seed"] == str(seed)
        # filtering on the sweep's name finds them; the Tune run that trained them is a tag of its own
        assert run.data.tags["sweep"] == "demo-iaa-aaa" and run.data.tags["tune_run"] == "ensemble-ens-1"
        assert _datasets(tracker.uri, run.info.run_id) == ["cbt-ne"]
    member = tracker.attach(found["seed-7"].info.run_id)
    tracker.log_model(member, ModelFiles.of(checkpoint, tiny), code=MODEL_CODE)
    (model,) = client.search_logged_models([found["seed-7"].info.experiment_id])
    assert model.name == "ens-seed-7" and model.tags["seed"] == "7"


def test_a_sweeps_trials_are_numbered_in_the_order_they_started(tmp_path: Path, tiny: Path) -> None:
    from iaa.jobs.config.job_config import to_dict
    from iaa.jobs.datasets import resolve
    from iaa.platform import mlflow_model
    from iaa.platform.sweeps.trials.trial import TrialSpec
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns

    tracker = _tracker(tmp_path)
    base = resolve.job_config("cbt-ne", tiny, sets=(*TINY_SETS, "train.seed=3"))
    spec = TrialSpec(name="demo-iaa-aaa", fit=None, storage_path=str(tmp_path), workers=1, threads=1, base=to_dict(base))
    side = DriverSide(tracker=tracker, experiment="tune-cbt-ne", parent_run_id=None, dataset="cbt-ne", spec=spec,
                      data_dir=tiny)
    with bound("demo-iaa-aaa", side):
        runs = TrialRuns("demo-iaa-aaa")
        for trial_id, lr in (("4f231ee7", 1e-3), ("0b7c9a12", 2e-3)):       # a searcher's ids carry no number
            runs.on_trial_start(0, [], _Trial(trial_id, {"train.lr": lr}))
        first = _Trial("4f231ee7", {"train.lr": 1e-3})
        for step in (1, 2):           # the worker decided ``auto``: its first check's word is the run's tag
            runs.on_trial_result(0, [], first, {"valid_acc": 0.5, "step": step, "precision": "bf16"})
    client = MlflowClient(tracker.uri)
    tagged = client.get_run(side.run_ids["4f231ee7"]).data
    assert tagged.tags["precision"] == "bf16" and "precision" not in tagged.metrics and tagged.metrics["valid_acc"] == 0.5
    for trial_id, number in (("4f231ee7", "0000"), ("0b7c9a12", "0001")):
        run = client.get_run(side.run_ids[trial_id])
        assert run.data.tags["trial_number"] == number and run.data.tags["seed"] == "3"
        assert mlflow_model.logged_name(client, run) == f"demo-iaa-aaa-trial-{number}"
        assert _datasets(tracker.uri, run.info.run_id) == ["cbt-ne"]


def test_a_resumed_trial_counts_its_restores_on_from_the_ones_its_run_holds(tmp_path: Path, tiny: Path) -> None:
    """A trial restored once (a node died), then stopped and resumed: the process that resumes it
    finds its run and counts on (``restores`` 1, then 2 after a restore of its own), never back to 0."""
    from iaa.jobs.config.job_config import to_dict
    from iaa.jobs.datasets import resolve
    from iaa.platform.sweeps.trials.trial import TrialSpec
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns

    tracker = _tracker(tmp_path)
    base = resolve.job_config("cbt-ne", tiny, sets=TINY_SETS)
    spec = TrialSpec(name="s", fit=None, storage_path=str(tmp_path), workers=1, threads=1, base=to_dict(base))
    trial = _Trial("4f231ee7", {"train.lr": 1e-3})
    client = MlflowClient(tracker.uri)

    def tags(process: Callable[[TrialRuns], None]) -> dict[str, str]:
        side = DriverSide(tracker=tracker, experiment="tune-cbt-ne", parent_run_id=None, dataset="cbt-ne", spec=spec,
                          data_dir=tiny)
        with bound("s", side):
            process(TrialRuns("s"))
        return client.get_run(side.run_ids[trial.trial_id]).data.tags

    def first(runs: TrialRuns) -> None:                   # restored once, then stopped
        runs.on_trial_start(0, [], trial)
        runs.on_trial_recover(0, [], trial)
    assert tags(first)["restores"] == "1"

    def second(runs: TrialRuns) -> None:                  # resumed: it checks and finishes
        runs.on_trial_start(0, [], trial)
        runs.on_trial_result(0, [], trial, {"valid_acc": 0.5, "step": 1})
        runs.on_trial_complete(0, [], trial)
    assert tags(second)["restores"] == "1"

    def third(runs: TrialRuns) -> None:                   # restored again by its next resume
        runs.on_trial_start(0, [], trial)
        runs.on_trial_recover(0, [], trial)
        runs.on_trial_complete(0, [], trial)
    assert tags(third)["restores"] == "2"


def test_a_trial_has_one_name_in_its_run_its_model_and_on_the_console(tmp_path: Path, tiny: Path) -> None:
    from iaa.jobs.config.job_config import to_dict
    from iaa.jobs.datasets import resolve
    from iaa.platform import mlflow_model
    from iaa.platform.sweeps.trials.trial import TrialSpec
    from iaa.platform.sweeps.trials.trial_runs import ConsoleCallback, TrialRuns

    class Heard:
        def __init__(self) -> None:
            self.ids: list[str] = []

        def trial_started(self, trial_id: str, params: Any) -> None:
            self.ids.append(trial_id)

        def trial_ended(self, trial_id: str, reason: str, error: str | None = None) -> None:
            self.ids.append(trial_id)

    tracker, heard = _tracker(tmp_path), Heard()
    base = resolve.job_config("cbt-ne", tiny, sets=TINY_SETS)
    spec = TrialSpec(name="demo-iaa-aaa", fit=None, storage_path=str(tmp_path), workers=1, threads=1, base=to_dict(base))
    side = DriverSide(tracker=tracker, experiment="tune-cbt-ne", parent_run_id=None, dataset="cbt-ne", spec=spec,
                      data_dir=tiny, console=heard)
    side.numbers["b902c4da"] = 3                   # the searcher asked Optuna, whose trial 3 this is
    trial = _Trial("b902c4da", {"train.lr": 4e-3}, {"stop_reason": "max_epochs"})
    with bound("demo-iaa-aaa", side):
        for callback in (TrialRuns("demo-iaa-aaa"), ConsoleCallback("demo-iaa-aaa")):
            callback.on_trial_start(0, [], trial)
        ConsoleCallback("demo-iaa-aaa").on_trial_complete(0, [], trial)
    run = MlflowClient(tracker.uri).get_run(side.run_ids["b902c4da"])
    assert run.info.run_name.split()[0] == "trial-0003" and run.data.tags["trial_number"] == "0003"
    assert mlflow_model.logged_name(MlflowClient(tracker.uri), run).endswith("-trial-0003")
    assert heard.ids == ["trial-0003", "trial-0003"]


def test_a_resumed_trial_that_never_started_keeps_the_number_its_study_gave_it(tmp_path: Path, tiny: Path) -> None:
    """A stopped sweep's trial that its process asked Optuna for but never started has no run,
    and the resuming process never asked for it: its name comes from the study, not from the
    order runs open here (which gave it another trial's name)."""
    import optuna

    from iaa.jobs.config.job_config import to_dict
    from iaa.jobs.datasets import resolve
    from iaa.platform.sweeps.trials.trial import TrialSpec
    from iaa.platform.sweeps.trials.trial_runs import TrialRuns

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = optuna.create_study(study_name="demo-iaa-aaa", storage=url, direction="maximize")
    for i, trial_id in enumerate(("a0", "a1", "a2", "a3")):      # asked by the stopped process, in this order
        asked = study.ask()
        asked.set_user_attr("tune_trial_id", trial_id)
        if i < 2:
            study.tell(asked, 0.5)
    tracker = _tracker(tmp_path)
    base = resolve.job_config("cbt-ne", tiny, sets=TINY_SETS)
    spec = TrialSpec(name="demo-iaa-aaa", fit=None, storage_path=str(tmp_path), workers=1, threads=1, base=to_dict(base))
    side = DriverSide(tracker=tracker, experiment="tune-cbt-ne", parent_run_id=None, dataset="cbt-ne", spec=spec,
                      data_dir=tiny, study_storage=url, study_name="demo-iaa-aaa")
    with bound("demo-iaa-aaa", side):
        runs = TrialRuns("demo-iaa-aaa")
        for trial_id in ("a3", "a2"):                          # Tune starts the restored trials, the later first
            runs.on_trial_start(0, [], _Trial(trial_id, {"train.lr": 4e-3}))
    assert side.names == {"a3": "trial-0003", "a2": "trial-0002"}
    assert MlflowClient(tracker.uri).get_run(side.run_ids["a3"]).data.tags["trial_number"] == "0003"


def test_the_sweeps_runs_view_shows_the_seed() -> None:
    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.config.search_space import parse
    from iaa.jobs.tune.parent_run import run_columns

    assert "params.train.seed" in run_columns(parse({"train.lr": [1e-3, 2e-3]}, JobConfig()))


def test_the_ensemble_of_a_sweep_nests_under_the_sweeps_run_with_its_data(tmp_path: Path, tiny: Path) -> None:
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
    from iaa.jobs.tune import tune

    space = tmp_path / "space.yaml"
    space.write_text("model.hidden_dim: [8]\n", encoding="utf-8")
    tracker, launcher, work = _tracker(tmp_path), FakeLauncher(), tmp_path / "work"
    swept = tune.run(tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=1, search_space=space, sets=TINY_SETS,
                                      workdir=work, name="one", show_progress=False), lambda uri: tracker, launcher)
    result = ensemble.run(EnsembleRequest(sweep="one", data=tiny, top_configs=1, seeds=2, workdir=work,
                                          show_progress=False), tracker, launcher)
    client = MlflowClient(tracker.uri)
    run = client.get_run(result.mlflow_run_id)
    assert run.data.tags["mlflow.parentRunId"] == swept["parent_run_id"]
    assert _datasets(tracker.uri, run.info.run_id) == ["cbt-ne"]
    assert _datasets(tracker.uri, swept["parent_run_id"]) == ["cbt-ne"]

    # The members it trained nest under the ensemble's run, not beside the trials, and carry the sweep's name.
    every = client.search_runs([run.info.experiment_id])
    children = {r.info.run_id: r for r in every if r.data.tags.get("mlflow.parentRunId") == run.info.run_id}
    trained = [r for r in every if r.data.tags.get("trial_id", "").startswith("member")]
    assert trained and {r.info.run_id for r in trained} <= set(children)
    assert {r.data.tags["sweep"] for r in trained} == {"one"}
    # The sweep's parent counts its trials and its ensembles apart; its children are exactly those.
    parent = client.get_run(swept["parent_run_id"])
    assert parent.data.tags["trials"] == "1" and parent.data.tags["ensembles"] == "1"
    under_sweep = [r for r in every if r.data.tags.get("mlflow.parentRunId") == swept["parent_run_id"]]
    assert sorted(r.data.tags.get("kind", "trial") for r in under_sweep) == ["ensemble", "trial"]
    # The run lasts as long as the job: it started before the members it trained.
    assert run.info.start_time <= min(r.info.start_time for r in trained)
    # Its page: best_valid_acc (the column a sweep is sorted by), Boo(n) once, the members in one artifact.
    assert run.data.metrics["best_valid_acc"] == pytest.approx(result.valid_acc)
    assert not any(k.startswith("member.") for k in run.data.tags)
    assert not [k for k in run.data.metrics if k.startswith("boo_") and k not in ("boo_n", "boo_n_valid", "boo_n_test")]
    rows = json.loads(Path(client.download_artifacts(run.info.run_id, "members.json", str(tmp_path))).read_text())
    assert len({r["seed"] for r in rows}) == 2
    assert {r["run_id"] for r in rows} >= {r.info.run_id for r in trained}
    assert [r["selected"] for r in rows] == [True, True]


def test_an_ensemble_that_cannot_reach_its_cluster_opens_no_run(tmp_path: Path, tiny: Path) -> None:
    """An unreachable cluster, or storage its nodes cannot share, fails before the ensemble's run
    opens: nothing is left FAILED under the sweep."""
    from fakes import FakeTracker
    from iaa.errors import IaaError
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest
    from iaa.jobs.tune import tune

    class Unreachable(FakeLauncher):
        def connect(self, request):
            raise IaaError("the cluster has 3 nodes (3 hosts): --storage-path is required")

    space = tmp_path / "space.yaml"
    space.write_text("model.hidden_dim: [8]\n", encoding="utf-8")
    tracker, work = FakeTracker(), tmp_path / "work"
    tune.run(tune.TuneRequest(dataset="cbt-ne", data=tiny, num_samples=1, search_space=space, sets=TINY_SETS,
                              workdir=work, name="one", show_progress=False), lambda uri: tracker, FakeLauncher())
    before = set(tracker.runs)
    with pytest.raises(IaaError, match="--storage-path is required"):
        ensemble.run(EnsembleRequest(sweep="one", data=tiny, top_configs=1, seeds=2, workdir=work,
                                     show_progress=False), tracker, Unreachable())
    assert set(tracker.runs) == before


def test_a_distilled_student_is_tracked_in_its_ensembles_experiment(tmp_path: Path, tiny: Path,
                                                                     checkpoint: Path) -> None:
    from iaa.jobs.distill import distill
    from iaa.jobs.train import train as train_job

    tracker, work = _tracker(tmp_path), tmp_path / "work"
    ens = ensemble_of(checkpoint, tiny, work, tracker)
    train = train_job.tracked_in(tracker)
    result = distill.run(distill.DistillRequest(Path(ens.ensemble_dir), workdir=work, sets=TINY_SETS,
                                                show_progress=False), train=train)
    run = MlflowClient(tracker.uri).get_run(result.mlflow_run_id)
    assert MlflowClient(tracker.uri).get_experiment(run.info.experiment_id).name == "distill-pair"
    assert "cbt-ne" in _datasets(tracker.uri, run.info.run_id)


def ensemble_of(checkpoint: Path, prepared: Path, work: Path, tracker: Any) -> Any:
    """An ensemble named ``pair`` of one checkpoint and a copy of it."""
    import shutil

    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest

    copy = work / "copy" / "best.pt"
    copy.parent.mkdir(parents=True)
    shutil.copy2(checkpoint, copy)
    return ensemble.run(EnsembleRequest(members=(checkpoint, copy), data=prepared, name="pair", workdir=work,
                                        show_progress=False), tracker)


def test_train_many_gives_the_members_runs_their_names_and_data(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from fakes import FakeTracker
    from iaa.jobs.config.job_config import JobConfig, TrainConfig
    from iaa.jobs.ports import ConnectRequest, MembersRequest, TrialRun, TrialTracking
    from iaa.platform.sweeps import launch

    asked: dict = {}

    def runs(**kwargs: Any) -> None:
        asked.update(kwargs)
        raise RuntimeError("planned")   # stop before Ray

    monkeypatch.setattr(launch, "connect", lambda *a: SimpleNamespace(plan=SimpleNamespace(max_concurrent=1)))
    monkeypatch.setattr(launch, "trial_spec", lambda *a, **k: None)
    monkeypatch.setattr(launch.driver_side, "DriverSide", runs)
    configs = (JobConfig(train=TrainConfig(seed=7)), JobConfig(train=TrainConfig(seed=8)))
    trials = TrialTracking(tracker=FakeTracker(), experiment="x", parent_run_id=None, sweep="demo", dataset="demo",
                           member_names=("e-seed-7", "e-seed-8"))
    connection = ConnectRequest(name="e-1", prepared=tmp_path / "data", storage=str(tmp_path / "ray"), num_trials=2)
    with pytest.raises(RuntimeError, match="planned"):
        launch.RayLauncher().train_many(MembersRequest(
            configs=configs, connection=connection, trials=TrialRun(fit=print, tracking=trials, downloads=tmp_path / "d")))
    assert asked["member_names"] == ("e-seed-7", "e-seed-8") and asked["data_dir"] == tmp_path / "data"
    assert asked["sweep"] == "demo"          # the runs are tagged with the sweep's name, not the Tune run's
