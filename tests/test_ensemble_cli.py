"""End to end: train two seeds on tiny demo data, ensemble them through the CLI, read it all back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.jobs.evaluation import calibration
from iaa.platform import mlflow_model
from tests._faults import assert_says
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TINY = [*TINY_SETS, "train.threads=1"]


def last_json(output: str) -> dict:
    return json.loads(output.strip().splitlines()[-1])


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "IAA_WORKDIR", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "work"


def test_ensemble_of_two_seeds_via_cli(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    workdir = env
    prepared = make_tiny_prepared(workdir.parent / "tiny")   # the demo grammar at a few hundred examples
    checkpoints = []
    for seed in (0, 1):
        sets = [a for s in TINY + [f"train.seed={seed}"] for a in ("--set", s)]
        res = runner.invoke(cli, ["train", "--data", str(prepared), "--workdir", str(workdir), *sets, "--json"])
        assert res.exit_code == 0, res.output
        checkpoints.append(last_json(res.stdout)["checkpoint"])
    assert checkpoints[0] != checkpoints[1]

    res = runner.invoke(cli, ["ensemble", "--members", checkpoints[0], "--members", checkpoints[1],
                              "--data", str(prepared), "--workdir", str(workdir), "--name", "two-seeds", "--json"])
    assert res.exit_code == 0, res.output
    out = last_json(res.stdout)
    assert out["members"] == checkpoints and out["all_members"] == checkpoints
    assert "ensemble (all, 2 of 2)" in res.stderr                     # the table goes to stderr

    rows = pq.read_table(out["predictions"]).to_pylist()
    assert {r["split"] for r in rows} == {"valid", "test"}
    for split in ("valid", "test"):
        mine = [r for r in rows if r["split"] == split]
        assert len({r["example_id"] for r in mine}) == len(mine) > 0
        for r in mine:
            assert len(r["member_probs"]) == 2 and all(len(p) == len(r["candidate_words"]) for p in r["member_probs"])
            mean = np.array(r["member_probs"], dtype=np.float64).mean(axis=0)
            assert np.array_equal(np.array(r["probs"]), mean) and r["pred"] == int(np.argmax(mean))
        assert out[f"{split}_acc"] == pytest.approx(np.mean([r["pred"] == r["gold"] for r in mine]), abs=1e-12)
        # each member's accuracy, from its own predictions file, matches the report
        for i in range(2):
            own = pq.read_table(Path(out["ensemble_dir"]) / "members" / f"{i:02d}-{split}.parquet").to_pylist()
            acc = np.mean([o["pred"] == o["gold"] for o in own])
            assert out[f"member_{split}_acc"][i] == pytest.approx(acc, abs=1e-12)
        assert out[f"mean_member_{split}_acc"] == pytest.approx(np.mean(out[f"member_{split}_acc"]))
    assert (Path(out["ensemble_dir"]) / "results.txt").is_file()

    # the temperature fitted on valid: what the predictions file, predict and the logged model answer with
    temperature = out["temperature"]
    valid = [r for r in rows if r["split"] == "valid"]
    mean, gold = [np.array(r["probs"]) for r in valid], [r["gold"] for r in valid]
    assert temperature == pytest.approx(calibration.fit_temperature(calibration.padded(mean), np.array(gold)))
    for r in rows:
        assert r["calibrated_probs"] == pytest.approx(calibration.scaled(np.array([r["probs"]]), temperature)[0].tolist())
    if temperature != 1.0:
        assert_says(res.stderr, "temperature:", "fitted on valid", "calibration error")
    answers = workdir.parent / "answers.jsonl"
    res = runner.invoke(cli, ["predict", "--ensemble", out["ensemble_dir"], "--input",
                              str(workdir.parent / "tiny" / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt"),
                              "--out", str(answers), "--workdir", str(workdir)])
    assert res.exit_code == 0, res.output
    by_id = {r["example_id"]: dict(zip(r["candidate_words"], r["calibrated_probs"])) for r in valid}
    answered = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines()]
    assert len(answered) == len(valid)
    for row in answered:
        assert row["probs"] == pytest.approx(by_id[row["id"]], abs=1e-5)

    from mlflow.tracking import MlflowClient

    run = MlflowClient(out["tracking_uri"]).get_run(out["mlflow_run_id"])
    assert run.data.metrics["valid_acc"] == pytest.approx(out["valid_acc"])
    client = MlflowClient(out["tracking_uri"])
    rows = json.loads(Path(client.download_artifacts(run.info.run_id, "members.json", str(env))).read_text())
    assert Path(rows[1]["checkpoint"]) == Path(checkpoints[1]).resolve()
    assert rows[0]["run_id"]   # found through the training run's checkpoint tag
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", out["tracking_uri"])
    (logged,) = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert logged.source_run_id == run.info.run_id and logged.tags["iaa.members"] == "2"
    assert out["model_uri"] == f"models:/{logged.model_id}"
    assert mlflow_model.fetch(out["model_uri"], out["tracking_uri"]).temperature == pytest.approx(temperature)
    assert run.data.metrics["temperature"] == pytest.approx(temperature)

    res = runner.invoke(cli, ["ensemble", *checkpoints, "--data", str(prepared), "--workdir", str(workdir),
                              "--name", "as-averaged", "--no-calibrate", "--json"])
    assert res.exit_code == 0, res.output
    plain = last_json(res.stdout)
    assert plain["temperature"] == 1.0 and not any(k.startswith("calibrated_") for k in plain["calibration"])
    monkeypatch.chdir(workdir.parent)                 # a work folder typed relative: its paths said absolute
    again = runner.invoke(cli, ["ensemble", "--members", checkpoints[0], "--members", checkpoints[1], "--data",
                                str(prepared), "--workdir", workdir.name, "--name", "typed-relative", "--json"])
    assert again.exit_code == 0, again.output
    for key in ("predictions", "table_path", "ensemble_dir"):
        found = Path(last_json(again.stdout)[key])
        assert found.is_absolute() and found.exists(), key
