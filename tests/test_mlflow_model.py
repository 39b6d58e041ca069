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

from _faults import assert_says
from iaa.cli import cli
from iaa.data.formats import cbt
from iaa.jobs.ports import ModelFiles
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

    from iaa.cli.adapters import MODEL_FILE
    from iaa.jobs.evaluation.predictor import MODEL_CODE
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking import connection, store
    from tests._explain import tiny_setup

    prepared, ckpts = tiny_setup(tmp_path)
    uri = connection.open_store(Workdir(tmp_path / "work").tracking_uri())
    run = store.Run.start(uri, "train-tiny", "r", tags={"dataset": "tiny"})
    run.log_dataset(prepared)
    run.log_metrics({"valid_acc": 0.5}, step=1)
    model_uri = mlflow_model.log(uri, run.run_id, ModelFiles.of(ckpts["iaa"], prepared), MODEL_CODE, model_file=MODEL_FILE)
    run.end()
    client = MlflowClient(uri)
    logged = client.get_logged_model(model_uri.removeprefix("models:/"))
    (entry,) = client.get_run(run.run_id).inputs.dataset_inputs
    assert [m.key for m in logged.metrics] == ["valid_acc"]
    assert {(m.dataset_name, m.dataset_digest) for m in logged.metrics} == {(entry.dataset.name, entry.dataset.digest)}


def test_a_registered_version_carries_its_cards_description_and_tags(tmp_path):
    """The registry's page of a version says what it is: the job's card, as MLflow's client reads it back."""
    from mlflow import MlflowClient

    from iaa.cli.adapters import MODEL_FILE
    from iaa.jobs.evaluation.predictor import MODEL_CODE
    from iaa.jobs.ports import ModelCard
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking import connection, store
    from iaa.platform.tracking.tracker import MlflowTracker
    from tests._explain import tiny_setup

    prepared, ckpts = tiny_setup(tmp_path)
    uri = connection.open_store(Workdir(tmp_path / "work").tracking_uri())
    run = store.Run.start(uri, "train-tiny", "r", tags={"dataset": "tiny"})
    card = ModelCard("A reader of model `iaa` on tiny: valid accuracy 0.5000.",
                     {"kind": "reader", "dataset": "tiny", "valid_acc": "0.5000"})
    tracker = MlflowTracker(uri, MODEL_FILE)
    assert tracker.log_model(run, ModelFiles.of(ckpts["iaa"], prepared), "tiny-card", code=MODEL_CODE,
                             card=card) == "models:/tiny-card/1"
    run.end()
    (version,) = MlflowClient(uri).search_model_versions("name = 'tiny-card'")
    assert version.run_id == run.run_id and version.description == card.description
    assert version.tags == dict(card.tags)
    assert_says(MlflowClient(uri).get_registered_model("tiny-card").description, "registered by iaa-cli",
                "Each version's description and tags say what it is")


@pytest.mark.slow
def test_a_model_logged_again_takes_its_runs_tags_and_stays_one_model(tmp_path):
    """A resumed sweep whose new best trial moves ``best_in_sweep`` logs every trial's model again:
    the earlier best's model says ``false`` as its run does. A run that trained on since (other
    weights in its checkpoint) gets a new model: its printed URI is never the old weights'."""
    from mlflow import MlflowClient

    from iaa.cli.adapters import MODEL_FILE
    from iaa.jobs.evaluation.predictor import MODEL_CODE
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking import connection, store
    from tests._explain import tiny_setup

    prepared, ckpts = tiny_setup(tmp_path)
    uri = connection.open_store(Workdir(tmp_path / "work").tracking_uri())
    run = store.Run.start(uri, "tune-tiny", "r", tags={"sweep": "s", "best_in_sweep": "true"})
    first = mlflow_model.log(uri, run.run_id, ModelFiles.of(ckpts["iaa"], prepared), MODEL_CODE, model_file=MODEL_FILE)
    client = MlflowClient(uri)
    client.set_tag(run.run_id, "best_in_sweep", "false")
    again = mlflow_model.log(uri, run.run_id, ModelFiles.of(ckpts["iaa"], prepared), MODEL_CODE, model_file=MODEL_FILE)
    run.end()
    assert again == first
    assert client.get_logged_model(first.removeprefix("models:/")).tags["best_in_sweep"] == "false"

    # the run trained on (a resume): its checkpoint has other weights, so its model is a new one
    import shutil

    from iaa.data.prepared.shards import file_sha256

    shutil.copyfile(ckpts["iaa-fixed-query"], ckpts["iaa"])
    resumed = mlflow_model.log(uri, run.run_id, ModelFiles.of(ckpts["iaa"], prepared), MODEL_CODE, model_file=MODEL_FILE)
    assert resumed != first
    newest = client.get_logged_model(resumed.removeprefix("models:/"))
    assert newest.tags[mlflow_model.FILES_TAG] == file_sha256(ckpts["iaa"])
    assert mlflow_model.log(uri, run.run_id, ModelFiles.of(ckpts["iaa"], prepared), MODEL_CODE,
                            model_file=MODEL_FILE) == resumed                # the newest one, kept


LOAD_AND_REPORT = """
import json, sys
import mlflow, pandas as pd
mlflow.set_tracking_uri(sys.argv[1]); mlflow.set_registry_uri(sys.argv[1])
model = mlflow.pyfunc.load_model(sys.argv[2])
df = pd.read_json(sys.argv[3], lines=True, dtype=False)
print(json.dumps({"rows": model.predict(df), "iaa": sys.modules["iaa"].__file__}))
"""


def _questions(root: Path, out: Path, count: int = 8) -> list[dict]:
    """The first ``count`` validation questions of the tiny CBT files under ``root``, written to ``out``."""
    examples = cbt.read(root / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt").examples()[:count]
    records = [{"id": ex.example_id, "document": " ".join(ex.doc), "query": " ".join(ex.query),
                "candidates": list(ex.candidates), "answer": ex.answer} for ex in examples]
    out.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return records


def test_an_ensemble_is_logged_as_code_and_loads_without_unpickling(tmp_path, monkeypatch):
    """The model's code is a file that MLflow runs (models-from-code), not a pickle: with MLflow
    told to refuse pickles, a fresh process outside the repository loads the two members with the
    ``iaa`` of the model's ``code_paths`` and answers as the predictor does, at the ensemble's
    temperature."""
    import mlflow
    from mlflow.models import Model

    from iaa.cli.adapters import MODEL_FILE
    from iaa.jobs.evaluation.predictor import MODEL_CODE, Predictor
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking import connection, store
    from tests._explain import tiny_checkpoint

    prepared = make_tiny_prepared(tmp_path)
    members = [tiny_checkpoint(prepared, tmp_path / f"seed-{seed}.pt", seed=seed) for seed in (0, 1)]
    uri = connection.open_store(Workdir(tmp_path / "work").tracking_uri())
    run = store.Run.start(uri, "ensemble-tiny", "r")
    files = ModelFiles(tuple(members), prepared, temperature=0.25)
    assert mlflow_model.log(uri, run.run_id, files, MODEL_CODE, "tiny-ensemble",
                            model_file=MODEL_FILE) == "models:/tiny-ensemble/1"
    run.end()

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    local = Path(mlflow.artifacts.download_artifacts("models:/tiny-ensemble/1", dst_path=str(tmp_path / "dl")))
    flavor = Model.load(str(local)).flavors["python_function"]
    assert flavor["loader_module"] == "mlflow.pyfunc.loaders.code_model"
    assert Path(flavor["model_code_path"]).name == MODEL_FILE.name
    assert (local / MODEL_FILE.name).read_text() == MODEL_FILE.read_text()
    assert "python_model" not in flavor and not [p for p in local.rglob("*") if p.suffix in (".pkl", ".pickle")]
    assert sorted(k for k in flavor["artifacts"] if k.startswith("member_")) == ["member_00", "member_01"]
    fetched = mlflow_model.fetch("models:/tiny-ensemble/1", uri)          # what `iaa-cli serve --model` reads
    assert [p.name for p in fetched.checkpoints] == ["member_00.pt", "member_01.pt"] and fetched.version == "1"
    assert fetched.temperature == 0.25

    records = _questions(tmp_path, tmp_path / "q.jsonl")
    expected = Predictor.load(members, prepared, temperature=0.25).predict_records(records)
    averaged = Predictor.load(members, prepared).predict_records(records)
    assert any(abs(e["probs"][w] - a["probs"][w]) > 1e-3 for e, a in zip(expected, averaged) for w in e["probs"])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, "-c", LOAD_AND_REPORT, uri, "models:/tiny-ensemble/1", str(tmp_path / "q.jsonl")]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**env, "MLFLOW_ALLOW_PICKLE_DESERIALIZATION": "false", "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(got["iaa"]).parent.parent.name == "code"          # the model's copy of the package
    assert [g["prediction"] for g in got["rows"]] == [e["prediction"] for e in expected]
    for g, e in zip(got["rows"], expected):
        assert g["probs"] == pytest.approx(e["probs"], abs=1e-6)


def test_a_reader_answers_at_its_checkpoints_temperature_and_an_ensemble_at_its_own(tmp_path, monkeypatch):
    """A lone reader's model answers at the temperature its checkpoint holds (the inference-only
    copy keeps it); an ensemble of that reader at temperature 1 answers with the plain average."""
    import mlflow
    import pandas as pd

    from iaa.cli.adapters import MODEL_FILE
    from iaa.jobs.evaluation.predictor import MODEL_CODE, Predictor
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking import connection, store
    from tests._explain import tiny_checkpoint

    prepared = make_tiny_prepared(tmp_path)
    sharp = tiny_checkpoint(prepared, tmp_path / "sharp.pt", temperature=0.2)
    uri = connection.open_store(Workdir(tmp_path / "work").tracking_uri())
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    records = _questions(tmp_path, tmp_path / "q.jsonl", count=4)
    answers = {}
    for name, files in (("alone", ModelFiles.of(sharp, prepared)),
                        ("ensemble", ModelFiles((sharp,), prepared, temperature=1.0))):
        run = store.Run.start(uri, "tiny", name)
        model_uri = mlflow_model.log(uri, run.run_id, files, MODEL_CODE, name, model_file=MODEL_FILE)
        run.end()
        assert mlflow_model.fetch(model_uri, uri).temperature == files.temperature
        answers[name] = mlflow.pyfunc.load_model(model_uri).predict(pd.DataFrame(records))
    for temperature, name in ((0.2, "alone"), (1.0, "ensemble")):
        expected = Predictor.load([sharp], prepared, temperature=temperature).predict_records(records)
        for got, want in zip(answers[name], expected):
            assert got["probs"] == pytest.approx(want["probs"], abs=1e-6)
    assert any(abs(a["probs"][w] - e["probs"][w]) > 1e-3
               for a, e in zip(answers["alone"], answers["ensemble"]) for w in a["probs"])


def test_a_model_pickled_by_an_older_iaa_still_loads(tmp_path):
    """Models logged before models-from-code hold a pickled ``ReaderModel`` carrying the loader;
    the class stays importable, so MLflow (which still allows pickles by default) loads them."""
    import mlflow
    import pandas as pd

    from iaa.jobs.evaluation.predictor import Predictor
    from tests._explain import tiny_checkpoint

    prepared = make_tiny_prepared(tmp_path)
    member = tiny_checkpoint(prepared, tmp_path / "m.pt")
    mlflow.pyfunc.save_model(str(tmp_path / "old"), python_model=mlflow_model.ReaderModel(Predictor.load),
                             artifacts={"member_00": str(member), "data": str(prepared)},
                             pip_requirements=mlflow_model.requirements())
    assert (tmp_path / "old" / "python_model.pkl").exists()
    records = _questions(tmp_path, tmp_path / "q.jsonl", count=3)
    got = mlflow.pyfunc.load_model(str(tmp_path / "old")).predict(pd.DataFrame(records))
    expected = Predictor.load([member], prepared).predict_records(records)
    assert [g["prediction"] for g in got] == [e["prediction"] for e in expected]


def test_a_tracker_without_a_model_code_file_refuses_to_log_a_model(tmp_path):
    from iaa.errors import IaaError
    from iaa.jobs.evaluation.predictor import MODEL_CODE
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking.tracker import MlflowTracker

    tracker = MlflowTracker(Workdir(tmp_path).tracking_uri())
    run = tracker.start_run("e", "r")
    with pytest.raises(IaaError, match="without a model code file"):
        tracker.log_model(run, ModelFiles.of(tmp_path / "m.pt", tmp_path), code=MODEL_CODE)
    run.end()
