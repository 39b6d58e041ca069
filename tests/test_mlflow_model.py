"""The MLflow pyfunc model: logged by ``train``, registered, loaded in a fresh process, and
answering exactly like ``iaa-cli predict``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.data import cbt
from iaa.platform import mlflow_model
from tests._tiny import TINY_SETS, make_tiny_prepared

LOAD_AND_PREDICT = """
import json, sys
import mlflow, pandas as pd
mlflow.set_tracking_uri(sys.argv[1]); mlflow.set_registry_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
df = pd.read_json(sys.argv[3], lines=True, dtype=False)
print(json.dumps(model.predict(df)))
"""


@pytest.mark.slow
def test_train_logs_a_model_that_predicts_like_the_cli(tmp_path, monkeypatch):
    prepared = make_tiny_prepared(tmp_path)
    work = tmp_path / "work"
    sets = [a for s in TINY_SETS for a in ("--set", s)] + ["--set", "train.max_epochs=1"]
    result = CliRunner().invoke(cli, ["train", "--data", str(prepared), *sets, "--workdir", str(work),
                                      "--run-dir", str(tmp_path / "run"), "--register", "tiny-reader", "--json"])
    assert result.exit_code == 0, result.output
    trained = json.loads(result.stdout.strip().splitlines()[-1])
    assert trained["model_uri"] == "models:/tiny-reader/1"

    examples = cbt.read(tmp_path / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt").examples()[:20]
    source = tmp_path / "q.jsonl"
    source.write_text("".join(json.dumps({"id": ex.example_id, "document": " ".join(ex.doc),
                                          "query": " ".join(ex.query), "candidates": list(ex.candidates),
                                          "answer": ex.answer}) + "\n" for ex in examples), encoding="utf-8")
    out = tmp_path / "p.jsonl"
    result = CliRunner().invoke(cli, ["predict", "--checkpoint", trained["checkpoint"], "--data", str(prepared),
                                      "--input", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    expected = [json.loads(line) for line in out.read_text().splitlines()]

    import mlflow

    uri = trained["tracking_uri"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # the logged model is named by its run (MLflow 3 resolves runs:/RUN/NAME by that name)
    name = mlflow_model.model_name(mlflow.MlflowClient(uri).get_run(trained["mlflow_run_id"]).info.run_name)
    for model_uri in ("models:/tiny-reader/1", f"runs:/{trained['mlflow_run_id']}/{name}"):
        proc = subprocess.run([sys.executable, "-c", LOAD_AND_PREDICT, uri, model_uri, str(source)], cwd=tmp_path,
                              capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"})
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert [g["id"] for g in got] == [e["id"] for e in expected]
        for g, e in zip(got, expected):
            assert g["prediction"] == e["prediction"] and g["correct"] == e["correct"]
            assert g["probs"] == pytest.approx(e["probs"], abs=1e-6)

    from mlflow import MlflowClient

    run = MlflowClient(uri).get_run(trained["mlflow_run_id"])
    (entry,) = run.inputs.dataset_inputs
    manifest = json.loads((prepared / "manifest.json").read_text())
    assert entry.dataset.name == manifest["dataset"] and str(prepared.resolve()) in entry.dataset.source
    assert len(entry.dataset.digest) == 16

    # an MLflow 3 logged model of the run, with a signature, an input example and index-installable pins
    (logged,) = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert logged.source_run_id == trained["mlflow_run_id"] and logged.name == mlflow_model.model_name(run.info.run_name)
    assert {m.key for m in logged.metrics} >= {"valid_acc"}          # the Models page can rank it
    assert [o.model_id for o in run.outputs.model_outputs] == [logged.model_id]
    info = mlflow.models.get_model_info(f"models:/{logged.model_id}")
    assert info.signature is not None and "candidates" in info.signature.inputs.input_names()
    assert info.saved_input_example_info is not None
    local = Path(mlflow.artifacts.download_artifacts(f"models:/{logged.model_id}", dst_path=str(tmp_path / "dl")))
    pins = (local / "requirements.txt").read_text().split()
    assert "torch" in " ".join(pins) and not [p for p in pins if "+" in p]


def test_a_logged_model_names_the_dataset_it_was_measured_on(tmp_path):
    """MLflow 3 shows a logged model's datasets from its metrics: each names the run's dataset input."""
    from mlflow import MlflowClient

    from iaa.jobs.evaluation.predictor import MODEL_CODE
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking import connection, store
    from tests._explain import tiny_setup

    prepared, ckpts = tiny_setup(tmp_path)
    uri = connection.open_store(Workdir(tmp_path / "work").tracking_uri())
    run = store.Run.start(uri, "train-tiny", "r", tags={"dataset": "tiny"})
    run.log_dataset(prepared)
    run.log_metrics({"valid_acc": 0.5}, step=1)
    model_uri = mlflow_model.log(uri, run.run_id, [ckpts["iaa"]], prepared, MODEL_CODE)
    run.end()
    client = MlflowClient(uri)
    logged = client.get_logged_model(model_uri.removeprefix("models:/"))
    (entry,) = client.get_run(run.run_id).inputs.dataset_inputs
    assert [m.key for m in logged.metrics] == ["valid_acc"]
    assert {(m.dataset_name, m.dataset_digest) for m in logged.metrics} == {(entry.dataset.name, entry.dataset.digest)}
