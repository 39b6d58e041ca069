"""Reading an MLflow tracking store back: runs found by their tags, an experiment's runs, a
metric's history, and the links into MLflow's UI (a saved runs view of an experiment, the UI's
address). The store is opened and checked by :mod:`iaa.platform.tracking.connection`.
"""

from __future__ import annotations

import json
import os
from typing import Any, Mapping, Sequence

from iaa.jobs.ports import MetricPoint, RunRecord
from iaa.platform.tracking.connection import EXPERIMENT_KIND, PARENT_TAG, store_client


def find_runs(uri: str, experiment: str, tags: Mapping[str, str] | None = None,
              status: str | None = None) -> list[RunRecord]:
    """Runs of ``experiment`` carrying every tag of ``tags`` (and ``status``), newest first."""
    tags = tags or {}
    if any("'" in str(v) for v in tags.values()):
        return []
    client = store_client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    terms = [f"tags.`{k}` = '{v}'" for k, v in tags.items()] + ([f"attributes.status = '{status}'"] if status else [])
    runs = client.search_runs([found.experiment_id], filter_string=" and ".join(terms),
                              order_by=["attributes.start_time DESC"], max_results=5000)
    return [_record(r) for r in runs]


def find_by_tag(uri: str, key: str, values: Sequence[str]) -> str | None:
    """The newest run of any experiment whose tag ``key`` is one of ``values``."""
    client = store_client(uri)
    experiments = [e.experiment_id for e in client.search_experiments()]
    for value in values:
        if "'" in value or not experiments:
            continue
        runs = client.search_runs(experiments, filter_string=f"tags.`{key}` = '{value}'", max_results=1,
                                  order_by=["attributes.start_time DESC"])
        if runs:
            return runs[0].info.run_id
    return None


VIEW_KEY = "iaa-sweep"   # the experiment's saved runs view (``viewStateShareKey``)
# What to do in that view: it opens each sweep collapsed to one row, and only its "+" lists the trials
EXPAND_HINT = "and click + beside the sweep's run to see its trials"


def delete_run(uri: str, run_id: str) -> None:
    """Mark run ``run_id`` deleted (MLflow keeps it, and can restore it)."""
    store_client(uri).delete_run(run_id)


def show_columns(uri: str, experiment: str, columns: Sequence[str]) -> str | None:
    """Save a runs view of ``experiment`` showing ``columns`` (``metrics.valid_acc``,
    ``params.train.lr``), and mark the experiment a training-runs one; returns the view's URL in the UI
    (:func:`ui_url`, ``http://127.0.0.1:5000/#/experiments/ID/runs?...``).

    MLflow's UI opens an experiment with the columns the browser last chose; a view saved as the
    experiment tag ``mlflow.sharedViewState.KEY`` opens with its own columns from a link. The UI
    nests child runs under their parent only while the table is sorted by start time (any other
    sort lists the parent among its children), so the view keeps that order. (A shared view
    cannot open a parent: the UI drops ``runsExpanded`` from it.)
    (``mlflow.experimentKind`` is what older 3.x UIs read; 3.17's follows the link's ``workflowType``.)
    """
    def canonical(name: str) -> str:
        kind, _, key = name.partition(".")
        return f"{kind}.`{key}`"

    client = store_client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    state = {"selectedColumns": [canonical(c) for c in columns], "orderByKey": "attributes.start_time",
             "orderByAsc": False, "hideEmptyCharts": True}
    for key, value in {**EXPERIMENT_KIND, f"mlflow.sharedViewState.{VIEW_KEY}": json.dumps(state)}.items():
        client.set_experiment_tag(found.experiment_id, key, value)
    # The UI shows every experiment as GenAI or as model training after a global switch (kept per
    # browser, GenAI by default); ``workflowType`` in the link picks model training.
    return (f"{ui_url(uri)}/#/experiments/{found.experiment_id}/runs?workflowType=machine_learning"
            f"&viewStateShareKey={VIEW_KEY}")


UI_URL = "http://127.0.0.1:5000"     # where ``mlflow ui`` serves a file store by default


def ui_url(uri: str) -> str:
    """The address of the UI showing the store ``uri``: a tracking server is its own UI; a SQLite
    or file store is shown by ``mlflow ui --backend-store-uri URI`` (``MLFLOW_UI_URL`` if it runs
    elsewhere)."""
    if uri.startswith(("http://", "https://")):
        return uri.rstrip("/")
    return os.environ.get("MLFLOW_UI_URL", UI_URL).rstrip("/")


def ui_command(uri: str) -> str:
    """The command that shows the store ``uri`` in MLflow's UI (a tracking server: its address)."""
    if uri.startswith(("http://", "https://")):
        return f"open {uri.rstrip('/')}"
    return f"mlflow ui --backend-store-uri {uri}"


def _record(run: Any) -> RunRecord:
    return RunRecord(run.info.run_id, run.info.run_name or run.info.run_id, run.info.status,
                     int(run.info.start_time or 0), dict(run.data.params), dict(run.data.tags),
                     run.data.tags.get(PARENT_TAG))


def experiment_records(uri: str, experiment: str) -> list[RunRecord] | None:
    """Every run of ``experiment``, oldest first; None when the store has no such experiment."""
    client = store_client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs([found.experiment_id], order_by=["attributes.start_time ASC"], max_results=5000)
    return [_record(r) for r in runs]


def experiment_names(uri: str) -> list[str]:
    """The names of the store's experiments."""
    return sorted(e.name for e in store_client(uri).search_experiments())


def metric_history(uri: str, run_id: str, key: str) -> list[MetricPoint]:
    """Every logged value of metric ``key`` of run ``run_id``, in logging order."""
    history = store_client(uri).get_metric_history(run_id, key)
    return [MetricPoint(int(m.step), float(m.value), int(m.timestamp)) for m in history]
