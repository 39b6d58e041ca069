"""A sweep and a data-parallel run on a local Ray (2 CPUs), read back through MLflow and the files."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from mlflow.tracking import MlflowClient

from iaa.cli import cli
from iaa.jobs.config.job_config import config_label
from iaa.jobs.modeling import checkpoint
from iaa.jobs.evaluation import calibration, evaluate
from iaa.jobs.config.job_config import JobConfig, from_dict, load, read_handoff
from iaa.jobs.workdir.paths import Workdir
from tests._platform import children, read_sweep, run_sweep, start_local_ray, write_space
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for the module (the platform reuses a Ray already started in the process)."""
    import ray

    start_local_ray(num_cpus=2)
    yield
    ray.shutdown()


def test_two_trial_sweep_tracks_a_parent_and_two_children(tiny: Path, tmp_path: Path, local_ray: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_sweep(dataset="cbt-ne", data=tiny, num_samples=2, search_space=write_space(tmp_path),
                       sets=TINY_SETS, workdir=tmp_path, name="two", show_progress=False,
                       grace_period=2)            # every trial makes at least two checks
    assert {"sweep", "tracking_uri", "experiment", "best_config", "best_valid_acc"} <= set(result.fields())
    sweep = read_sweep(tmp_path, "two")
    assert sweep["parent_run_id"] and sweep["data_dir"] == str(tiny.resolve())
    assert sweep["sampler"] == "tpe"                                     # the default, recorded
    trials = sweep["trials"]
    assert len(trials) == 2 and {t["status"] for t in trials} == {"TERMINATED"}
    assert all(0 < t["seconds"] < 600 for t in trials)                   # each trial's time, from Tune
    for trial in trials:
        model, cfg, state = checkpoint.load_model(Path(trial["checkpoint"]))
        assert cfg == from_dict(trial["config"])
        assert state["progress"]["best_valid_acc"] == pytest.approx(trial["best_valid_acc"])
        assert cfg.model.hidden_dim in (8, 12) and cfg.model.steps in (1, 2) and cfg.model.embed_dim == 16
    assert result.best_valid_acc == max(t["best_valid_acc"] for t in trials)
    best_run = max(trials, key=lambda t: t["best_valid_acc"])["mlflow_run_id"]

    # best_config.yaml is a job config that `iaa-cli train --config` takes as it is: the best
    # trial's, with the training length in place of the trial's budget (here both are --set's 2)
    best = load(JobConfig(), result.best_config)
    trained = from_dict(max(trials, key=lambda t: t["best_valid_acc"])["config"])
    assert trained.train.precision in ("fp32", "bf16") and best.train.precision == "auto"   # decided where it trains
    assert best == replace(trained, train=replace(trained.train, precision="auto"))
    assert read_handoff(Path(result["best_config"]))["data"] == str(tiny.resolve())

    client = MlflowClient(result["tracking_uri"])
    parent = client.get_run(sweep["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.metrics["best_valid_acc"] == result["best_valid_acc"]
    assert parent.data.params["tune.sampler"] == "tpe"
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"best_config.yaml", "sweep.json"}
    kids = children(sweep)
    assert len(kids) == 2
    by_trial = {t["trial_id"]: t for t in trials}
    for run in kids:
        tags, params = run.data.tags, run.data.params
        trial = by_trial[tags["trial_id"]]
        assert run.info.status == "FINISHED" and run.info.run_id == trial["mlflow_run_id"]
        assert tags["dataset"] == "cbt-ne" and tags["mlflow.source.git.commit"] and tags["checkpoint"] == trial["checkpoint"]
        assert int(params["model.hidden_dim"]) == trial["config"]["model"]["hidden_dim"]
        assert float(params["train.lr"]) == trial["config"]["train"]["lr"]
        acc = client.get_metric_history(run.info.run_id, "valid_acc")
        loss = client.get_metric_history(run.info.run_id, "train_loss")
        assert len(acc) == trial["checks"] == len(loss) >= 2
        memory = client.get_metric_history(run.info.run_id, "resident_mb")
        assert len(memory) == len(acc) and all(50 < m.value < 64_000 for m in memory)   # MB of the trial's process
        temperature = client.get_metric_history(run.info.run_id, "temperature")
        assert len(temperature) == len(acc) and all(0.1 <= t.value <= 10 for t in temperature)
        assert [m.step for m in acc] == sorted({m.step for m in acc}) and acc[0].step > 0

    # the parent holds the search space and the best config, not a preset's value of a searched key
    best_trial = max(trials, key=lambda t: t["best_valid_acc"])
    assert parent.data.params["search.model.steps"] == "{1, 2}" and "model.steps" not in parent.data.params
    assert int(parent.data.params["best.model.steps"]) == best_trial["config"]["model"]["steps"]
    assert parent.data.tags["best_mlflow_run_id"] == best_trial["mlflow_run_id"]
    # the best trial by its one name, as the console says it, and by Tune's id; its accuracy's n and baseline
    assert parent.data.params["best.trial_id"] == parent.data.tags["best_trial_id"] == result["best_trial_label"]
    assert parent.data.params["best.ray_trial_id"] == parent.data.tags["best_ray_trial_id"] == result["best_trial"]
    assert parent.data.params["best_valid_acc_n"] == str(result["best_valid_acc_n"])
    assert parent.data.metrics["baseline_valid_acc"] == pytest.approx(result["baseline_valid_acc"])
    # the note links the best trial's run relative to the page, so it holds on any host and port
    link = f"](#/experiments/{parent.info.experiment_id}/runs/{best_trial['mlflow_run_id']})"
    assert link in parent.data.tags["mlflow.note.content"]
    assert client.get_run(best_trial["mlflow_run_id"]).data.tags["best_in_sweep"] == "true"
    # child runs are named by the trial's one name, then the values that tell them apart
    assert {r.info.run_name for r in kids} == {f"trial-{r.data.tags['trial_number']} {config_label(t['params'])}"
                                               for r in kids for t in trials if t["mlflow_run_id"] == r.info.run_id}
    assert sorted(r.data.tags["trial_number"] for r in kids) == ["0000", "0001"]
    assert all(r.data.tags["stop_reason"] for r in kids)
    # the Optuna study outlives the process: every trial, with each check as an intermediate value
    import optuna

    study = optuna.load_study(study_name="two", storage=sweep["optuna"]["storage"])
    assert sorted(len(t.intermediate_values) for t in study.trials) == sorted(t["checks"] for t in trials)
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}

    # every trained reader is an MLflow 3 logged model of its trial's run
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", result["tracking_uri"])
    logged = mlflow.search_logged_models(experiment_ids=[parent.info.experiment_id], output_format="list")
    assert sorted(m.source_run_id for m in logged) == sorted(t["mlflow_run_id"] for t in trials)
    assert result["model_uri"] == f"models:/{next(m.model_id for m in logged if m.source_run_id == best_run)}"


def test_train_with_two_workers_gives_a_checkpoint_that_evaluates(tiny: Path, tmp_path: Path, local_ray: None) -> None:
    sets = [arg for s in TINY_SETS for arg in ("--set", s)]
    out = CliRunner().invoke(cli, ["train", "--data", str(tiny), *sets, "--workers", "2", "--workdir", str(tmp_path),
                                   "--run-dir", str(tmp_path / "run"), "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["workers"] == 2 and result["threads"] == 1
    best = Path(result["checkpoint"])
    assert best == tmp_path / "run" / "checkpoints" / "best.pt" and best.is_file()

    scored = evaluate.run(best, tiny, "valid", tmp_path / "pred.parquet")
    assert scored.examples == 64
    # Validation was all-reduced over disjoint shares of the split: the reported best accuracy is
    # the accuracy of the best checkpoint on the whole split (up to float ties in the argmax).
    assert abs(scored.accuracy - result["best_valid_acc"]) <= 1 / 64 + 1e-9
    # So was the temperature's fit: the checkpoint holds the one of the whole split.
    rows = pq.read_table(tmp_path / "pred.parquet").to_pylist()
    whole = calibration.fit_temperature(calibration.padded([r["probs"] for r in rows]), np.array([r["gold"] for r in rows]))
    assert scored.temperature == pytest.approx(whole, rel=1e-3) and scored.temperature != 1.0

    checks = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [c["checks"] for c in checks] == list(range(1, len(checks) + 1)) and len(checks) >= 2
    client = MlflowClient(result["tracking_uri"])
    run = client.get_run(result["mlflow_run_id"])
    assert run.data.params["model.embed_dim"] == "16" and run.data.tags["workers"] == "2"
    assert len(client.get_metric_history(run.info.run_id, "valid_acc")) == len(checks)


def test_train_many_trains_each_config_in_input_order(tiny: Path, tmp_path: Path, local_ray: None) -> None:
    from dataclasses import replace

    from iaa.jobs.datasets import resolve
    from iaa.jobs.ports import ConnectRequest, MembersRequest, TrialRun, TrialTracking
    from iaa.platform.sweeps import launch
    from iaa.platform.tracking import store as tracking
    from iaa.platform.tracking.tracker import MlflowTracker

    base = resolve.job_config("cbt-ne", tiny, sets=TINY_SETS)
    from iaa.jobs.training.loop import fit_on_worker

    configs = tuple(replace(base, train=replace(base.train, seed=seed)) for seed in (3, 1))
    uri = Workdir(tmp_path).tracking_uri()
    parent = tracking.Run.start(uri, "ensemble-test", "parent")
    trials = TrialTracking(tracker=MlflowTracker(uri), experiment="ensemble-test", parent_run_id=parent.run_id,
                           sweep="many", dataset="cbt-ne")
    connection = ConnectRequest(name="many", prepared=tiny, storage=Workdir(tmp_path).storage(),
                                num_trials=len(configs), show_progress=False)
    results = launch.RayLauncher().train_many(MembersRequest(
        configs=configs, connection=connection,
        trials=TrialRun(fit=fit_on_worker, tracking=trials, downloads=tmp_path / "many")))
    assert [r.config for r in results] == list(configs)
    client = MlflowClient(uri)
    for cfg, result in zip(configs, results):
        _, loaded, state = checkpoint.load_model(Path(result.checkpoint))
        assert loaded == cfg and state["progress"]["best_valid_acc"] == pytest.approx(result.best_valid_acc)
        run = client.get_run(result.mlflow_run_id)
        assert run.data.tags["mlflow.parentRunId"] == parent.run_id
        assert run.data.params["train.seed"] == str(cfg.train.seed) and run.info.status == "FINISHED"


def test_two_sweeps_with_default_names_on_one_storage_path_both_survive(tiny: Path, tmp_path: Path,
                                                                       local_ray: None) -> None:
    from iaa.errors import IaaError

    shared = tmp_path / "shared"
    request = dict(dataset="cbt-ne", data=tiny, num_samples=1, search_space=write_space(tmp_path),
                   sets=TINY_SETS, workdir=tmp_path / "work", storage_path=str(shared), show_progress=False)
    first = run_sweep(**request)
    first_trials = read_sweep(tmp_path / "work", first["sweep"])["trials"]
    second = run_sweep(**request)
    assert first["sweep"] != second["sweep"] and first["sweep"].startswith("cbt-ne-iaa-")
    for result in (first, second):
        sweep = read_sweep(tmp_path / "work", result["sweep"])
        assert (shared / result["sweep"]).is_dir() and Path(result["best_config"]).is_file()
        assert all(Path(t["checkpoint"]).is_file() for t in sweep["trials"])
    assert read_sweep(tmp_path / "work", first["sweep"])["trials"] == first_trials

    with pytest.raises(IaaError, match="already exists"):       # a name in use is refused, not reused
        run_sweep(**request, name=first["sweep"])
    assert read_sweep(tmp_path / "work", first["sweep"])["trials"] == first_trials
    assert all(Path(t["checkpoint"]).is_file() for t in first_trials)


def test_a_sweep_ends_at_its_time_budget_with_nothing_left_running(tiny: Path, tmp_path: Path,
                                                                   local_ray: None) -> None:
    """Tune stops every trial where it stands once the trials have run for the budget, and tells
    neither the searcher nor the callbacks: the sweep still ends each stopped trial's run and
    Optuna trial, ranks what ran, and a resume has nothing left to run."""
    import optuna

    from iaa.jobs.ports import TIME_BUDGET

    request = dict(dataset="cbt-ne", data=tiny, num_samples=100, search_space=write_space(tmp_path),
                   sets=(*TINY_SETS, "train.max_epochs=4"), workdir=tmp_path, name="timed", show_progress=False,
                   time_budget_s=15.0)
    threads = set(threading.enumerate())
    result = run_sweep(**request)
    left = [t for t in set(threading.enumerate()) - threads if type(t).__module__.startswith("tensorboardX")]
    assert not left, "a stopped trial's TensorBoard writer outlives the sweep"
    sweep = read_sweep(tmp_path, "timed")
    trials = sweep["trials"]
    cut = [t for t in trials if t["stop_reason"] == TIME_BUDGET]
    assert sweep["time_budget_s"] == 15.0 and cut and len(trials) < 100
    assert len({t["trial_id"] for t in trials}) == len(trials), "each trial once, a trial that never ran too"
    assert all(t["status"] == "TERMINATED" for t in trials)
    assert result["cut_trials"] == [t["name"] or t["trial_id"] for t in cut]
    assert result["best_valid_acc"] == max(t["best_valid_acc"] for t in trials if t["best_valid_acc"] is not None)

    client = MlflowClient(result["tracking_uri"])
    parent = client.get_run(sweep["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.metrics["trials_cut"] == len(cut)
    assert parent.data.tags["time_budget_s"] == "15"
    runs = {r.data.tags["trial_id"]: r for r in children(sweep)}
    assert {r.info.status for r in runs.values()} == {"FINISHED"}
    assert all(runs[t["trial_id"]].data.tags["stop_reason"] == TIME_BUDGET for t in cut if t["trial_id"] in runs)

    study = optuna.load_study(study_name="timed", storage=sweep["optuna"]["storage"])
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED", "FAIL"}
    stopped = [t for t in study.trials if t.user_attrs.get("stopped_by") == TIME_BUDGET]
    assert len(stopped) == len(cut)
    assert all(t.state.name == "PRUNED" or not t.intermediate_values for t in stopped)

    again = run_sweep(**{**request, "resume": True})
    assert again["nothing_left"] and read_sweep(tmp_path, "timed")["trials"] == trials
    assert again["model_uri"] == result["model_uri"] is not None                # the best trial's, looked up


def test_a_warm_started_sweep_begins_with_the_earlier_trials_and_proposes_none_again(tiny: Path, tmp_path: Path,
                                                                                      local_ray: None) -> None:
    """The second sweep's study holds the first sweep's trials before its own, which try the
    configurations the first did not and take the numbers after them, as do their runs. The first
    sweep's first trial runs the configuration it was given to try first; the second, given it
    too, knows its score from the carried trial and does not run it again."""
    import optuna

    request = dict(dataset="cbt-ne", data=tiny, num_samples=2, search_space=write_space(tmp_path), sets=TINY_SETS,
                   workdir=tmp_path, show_progress=False)
    given = tmp_path / "try.yaml"
    given.write_text("- {model.hidden_dim: 12, model.steps: 1}\n", encoding="utf-8")
    run_sweep(**request, name="first", try_first=given)
    result = run_sweep(**request, name="second", warm_start="first", try_first=given)

    first, second = read_sweep(tmp_path, "first"), read_sweep(tmp_path, "second")
    [tried] = [t for t in optuna.load_study(study_name="first", storage=first["optuna"]["storage"]).trials
               if "tried_first" in t.user_attrs]
    assert tried.number == 0 and tried.params == {"model.hidden_dim": 12, "model.steps": 1}
    [run] = [r for r in children(first) if r.data.tags["trial_number"] == "0000"]
    assert run.data.params["model.hidden_dim"] == "12" and run.data.params["model.steps"] == "1"
    assert run.data.tags["stop_reason"] != "asha"                       # set aside from ASHA: it ran to its end
    assert second["warm_start"]["sweep"] == "first" and second["warm_start"]["trials"] == 2
    assert result["carried_trials"] == 2 and result["warm_start"] == "first"
    study = optuna.load_study(study_name="second", storage=second["optuna"]["storage"])
    carried, own = study.trials[:2], study.trials[2:]
    assert [t.user_attrs["carried_from"] for t in carried] == ["first", "first"]
    assert [t.params for t in carried] == [t.params for t in optuna.load_study(
        study_name="first", storage=first["optuna"]["storage"]).trials]
    assert len(own) == 2 and not any("carried_from" in t.user_attrs or "tried_first" in t.user_attrs for t in own)
    assert result.tried_first == 1 and result.best_tried_first is None     # the best is no given one
    tried = [t.params for t in carried]
    assert all(t.params not in tried for t in own) and own[0].params != own[1].params   # the 4 of the space, once
    assert {t.state.name for t in study.trials} <= {"COMPLETE", "PRUNED"}

    parent = MlflowClient(result["tracking_uri"]).get_run(second["parent_run_id"])
    assert parent.data.tags["warm_start"] == "first" and parent.data.metrics["trials_carried"] == 2
    assert sorted(r.data.tags["trial_number"] for r in children(second)) == ["0002", "0003"]
    assert {r.info.status for r in children(second)} == {"FINISHED"}
