"""What a sweep shows in MLflow and Optuna: a runs view that nests the trials under their parent,
logged models named by their run with their accuracy, an Optuna study that names its objective
and links each trial to its Tune trial and MLflow run, and report figures with real labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from iaa.jobs.workdir.paths import Workdir

optuna = pytest.importorskip("optuna")


def _store(tmp_path: Path) -> tuple[str, str, str]:
    """A store with experiment tune-demo, a parent run and one child: (uri, experiment id, parent id)."""
    from iaa.platform.tracking import connection

    uri = connection.open_store(Workdir(tmp_path).tracking_uri())
    experiment = connection.experiment_id(uri, "tune-demo")
    parent = MlflowClient(uri).create_run(experiment, run_name="demo-iaa-1").info.run_id
    return uri, experiment, parent


def test_the_runs_view_is_a_full_url_nesting_the_trials_under_the_parent(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from iaa.platform.tracking import queries

    monkeypatch.delenv("MLFLOW_UI_URL", raising=False)
    uri, experiment, _ = _store(tmp_path)
    url = queries.show_columns(uri, "tune-demo", ["metrics.valid_acc", "params.train.lr"])
    assert url.startswith(f"http://127.0.0.1:5000/#/experiments/{experiment}/runs?")
    key = url.split("viewStateShareKey=")[1]
    state = json.loads(MlflowClient(uri).get_experiment(experiment).tags[f"mlflow.sharedViewState.{key}"])
    assert state["selectedColumns"] == ["metrics.`valid_acc`", "params.`train.lr`"]
    # MLflow's UI nests children under their parent only in start-time order
    assert state["orderByKey"] == "attributes.start_time"
    assert queries.ui_url("http://mlflow.example:8080/") == "http://mlflow.example:8080"


def test_a_logged_model_carries_the_accuracy_of_its_checkpoint(tmp_path: Path) -> None:
    from mlflow.entities import Metric

    from iaa.platform import mlflow_model

    uri, experiment, _ = _store(tmp_path)
    client = MlflowClient(uri)
    run = client.create_run(experiment, run_name="lr=4e-3 T=2 h=64").info.run_id
    client.log_batch(run, metrics=[Metric("valid_acc", v, 1000 + s, s) for s, v in ((1, 0.5), (2, 0.8), (3, 0.7))]
                     + [Metric("test_acc", 0.75, 2000, 3)])
    model = client.create_logged_model(experiment, name=mlflow_model.model_name("lr=4e-3 T=2.5 h=64"),
                                       source_run_id=run)
    assert model.name == "lr=4e-3 T=2_5 h=64"                      # MLflow refuses '.' in a model's name
    client.log_batch(run, metrics=mlflow_model.model_metrics(client, run, model.model_id))
    logged = {m.key: (m.value, m.step) for m in client.get_logged_model(model.model_id).metrics}
    assert logged == {"valid_acc": (0.8, 2), "test_acc": (0.75, 3)}   # the best check: the checkpoint kept
    assert [m.step for m in client.get_metric_history(run, "valid_acc")] == [1, 2, 3]   # no point added


def test_the_study_names_its_objective_and_links_each_trial(tmp_path: Path) -> None:
    from optuna.distributions import CategoricalDistribution

    from iaa.platform.sweeps.search.distinct_search import StudySearch
    from tests._study import bound_study

    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    search = StudySearch({"train.lr": CategoricalDistribution([0.002, 0.004])}, optuna.samplers.RandomSampler(0), "s")
    with bound_study(url, "s", run_ids={"abc_00000": "run-1"}):
        assert search.suggest("abc_00000") is not None
        search.on_trial_result("abc_00000", {"valid_acc": 0.5, "checks": 1})
    study = optuna.load_study(study_name="s", storage=url)
    assert study.metric_names == ["valid_acc"]
    (trial,) = study.trials
    from iaa.platform.cluster.owner import owner

    # the trial's one name, as its run's name begins and the console says it
    assert trial.user_attrs == {"tune_trial_id": "abc_00000", "mlflow_run_id": "run-1", "iaa.owner": owner(),
                                "trial_name": "trial-0000"}


def test_the_report_figures_use_visible_colours_and_trial_labels(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.collections import LineCollection
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import create_trial
    from optuna.visualization import matplotlib as vis

    from iaa.platform.sweeps.studies import study as study_figures

    study = optuna.create_study(direction="maximize")
    dists = {"train.lr": CategoricalDistribution([0.002, 0.004])}
    for i, (lr, value) in enumerate(((0.002, 0.4), (0.004, 0.9))):
        study.add_trial(create_trial(params={"train.lr": lr}, distributions=dists, value=value,
                                     intermediate_values={1: value}, user_attrs={"tune_trial_id": f"t{i}"}))
    ax = vis.plot_parallel_coordinate(study)
    study_figures._readable_lines(ax)
    (lines,) = [c for c in ax.collections if isinstance(c, LineCollection)]
    worst = lines.cmap(lines.norm(0.4))
    assert sum(worst[:3]) < 1.5                    # dark, not near-white as Optuna's "Blues" draws it
    widths = dict(zip(lines.get_array(), lines.get_linewidths()))
    assert widths[0.9] > widths[0.4]               # the best trial stands out ...
    low, high = ax.get_ylim()
    assert low < 0.4 and 0.9 < high                # ... and runs inside the frame, not along its edge
    ax = vis.plot_intermediate_values(study)
    study_figures._trial_labels(ax, study)
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["trial-0000 lr=2e-3", "trial-0001 lr=4e-3"]   # as the console names them


def test_the_sweeps_link_says_how_to_see_the_trials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow's UI opens a shared view with the sweep collapsed: what the tracker gives to show
    says to click + beside it, on the one line of its URL."""
    from iaa.platform.tracking.tracker import MlflowTracker

    monkeypatch.delenv("MLFLOW_UI_URL", raising=False)
    uri, experiment, _ = _store(tmp_path)
    shown = MlflowTracker(uri).show_columns("tune-demo", ["metrics.valid_acc"])
    url, hint = shown.split(" ", 1)
    assert url.startswith(f"http://127.0.0.1:5000/#/experiments/{experiment}/runs?")
    assert "click +" in hint and "\n" not in shown
