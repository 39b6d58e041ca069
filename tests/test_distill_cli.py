"""End to end: an ensemble of two tiny members distilled through the CLI; the student is a
reader like any other for ``evaluate``, ``predict``, ``ensemble``, ``explain`` and MLflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.data.formats import cbt
from tests._tiny import TINY_SETS, make_tiny_prepared
from tests.test_mlflow_model import LOAD_AND_PREDICT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TINY = [*TINY_SETS, "train.threads=1", "train.max_epochs=1"]


def last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


def invoke(*args: str) -> dict:
    res = CliRunner().invoke(cli, [*args, "--json"])
    assert res.exit_code == 0, res.output
    return last_json(res.stdout)


def test_distill_makes_a_student_every_command_accepts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "IAA_WORKDIR", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    work = tmp_path / "work"
    prepared = make_tiny_prepared(tmp_path / "tiny")
    sets = lambda extra: [a for s in [*TINY, *extra] for a in ("--set", s)]  # noqa: E731
    members = [invoke("train", "--data", str(prepared), "--workdir", str(work), *sets([f"train.seed={seed}"]))["checkpoint"]
               for seed in (0, 1)]
    ens = invoke("ensemble", "--members", *members, "--data", str(prepared), "--workdir", str(work), "--name", "two")

    # a half-size student, with the teacher scored as two Ray tasks
    student = invoke("distill", "--ensemble", ens["ensemble_dir"], "--workdir", str(work), "--alpha", "0.5",
                     "--temperature", "2", "--workers", "2", *sets(["model.hidden_dim=4", "model.state_dim=6"]))
    assert student["teacher_computed"] and Path(student["teacher"]).parent == work / "distill" / "teachers"
    assert student["members"] == members and Path(student["checkpoint"]).is_file()

    from mlflow.tracking import MlflowClient

    run = MlflowClient(student["tracking_uri"]).get_run(student["mlflow_run_id"])
    assert run.data.params["distill.alpha"] == "0.5" and run.data.params["model.hidden_dim"] == "4"
    assert run.data.tags["teacher"] == student["teacher"]
    assert run.data.metrics["teacher_valid_acc"] == pytest.approx(student["teacher_valid_acc"])
    contexts = {i.tags[0].value: i.dataset.name for i in run.inputs.dataset_inputs}
    assert contexts["teacher"] == Path(student["teacher"]).stem and "train" in contexts

    scored = invoke("evaluate", "--checkpoint", student["checkpoint"], "--data", str(prepared), "--split", "valid",
                    "--workdir", str(work))
    assert scored["accuracy"] == pytest.approx(student["best_valid_acc"])
    both = invoke("ensemble", "--members", student["checkpoint"], members[0], "--data", str(prepared),
                  "--workdir", str(work), "--name", "with-student")
    assert both["members"] == [student["checkpoint"], members[0]]

    examples = cbt.read(tmp_path / "tiny" / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt").examples()[:8]
    source = tmp_path / "q.jsonl"
    source.write_text("".join(json.dumps({"id": ex.example_id, "document": " ".join(ex.doc), "query": " ".join(ex.query),
                                          "candidates": list(ex.candidates), "answer": ex.answer}) + "\n"
                              for ex in examples), encoding="utf-8")
    out = tmp_path / "p.jsonl"
    res = CliRunner().invoke(cli, ["predict", "--checkpoint", student["checkpoint"], "--data", str(prepared),
                                   "--input", str(source), "--out", str(out)])
    assert res.exit_code == 0, res.output
    expected = [json.loads(line) for line in out.read_text().splitlines()]
    proc = subprocess.run([sys.executable, "-c", LOAD_AND_PREDICT, student["tracking_uri"], student["model_uri"],
                           str(source)], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [g["prediction"] for g in got] == [e["prediction"] for e in expected]

    # the same teacher again: reused, not recomputed; then a retrained member is refused
    again = invoke("distill", "--ensemble", ens["ensemble_dir"], "--workdir", str(work), *sets(["train.seed=3"]))
    assert not again["teacher_computed"] and again["teacher"] == student["teacher"]
    res = CliRunner().invoke(cli, ["train", "--data", str(prepared), "--workdir", str(work), "--overwrite",
                                   "--run-dir", str(Path(members[1]).parent.parent), *sets(["train.seed=9"])])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(cli, ["distill", "--ensemble", ens["ensemble_dir"], "--workdir", str(work),
                                   *sets(["train.seed=4"])])
    # the ensemble itself is stale now (a member's sha256 differs from ensemble.json): refused before any work
    assert res.exit_code == 1 and "sha256 differs" in res.output and "iaa-cli ensemble" in res.output
