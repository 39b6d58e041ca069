"""A copied work folder works from its new place and leaves its original as it was.

A tiny sweep, an ensemble and a training run are made in one work folder; the folder is copied, the
original made read-only, and train --resume, report, ensemble, evaluate, distill and serve run from
the copy: each succeeds, and no entry of the original changes (size and modification time).
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa import cli
from tests._platform import write_space
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.slow
SETS = [arg for s in (*TINY_SETS, "train.max_epochs=1", "train.threads=1") for arg in ("--set", s)]


def listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` (folders too) with its size and modification time (ns)."""
    return {str(p.relative_to(root)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in sorted(root.rglob("*"))}


def invoke(*args: object) -> dict:
    result = CliRunner().invoke(cli.cli, [str(a) for a in args])
    assert result.exit_code == 0, f"{args}\n{result.output[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1]) if "--json" in args else {}


@pytest.fixture
def local_ray():
    import ray

    ray.shutdown()           # a Ray an earlier in-process command of this test session left running
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", log_to_driver=False)
    yield
    ray.shutdown()


def _answer_one(answerer) -> list:
    """One request, answered in process by the model serve loaded."""
    body = json.dumps({"id": "q1", "document": "the cat sat on the mat", "query": f"the {answerer.placeholder} sat",
                       "candidates": ["cat", "mat"]}).encode()
    questions, _ = answerer.parse(body)
    [rows] = answerer.answer([questions])
    return rows


@pytest.mark.timeout(1500)
def test_a_copied_work_folder_works_and_never_writes_to_the_original(tmp_path, local_ray, monkeypatch):
    for var in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS", "IAA_WORKDIR", "MLFLOW_RUN_ID"):
        monkeypatch.delenv(var, raising=False)
    original, copy = tmp_path / "original" / "work", tmp_path / "copy" / "work"
    shutil.copytree(make_tiny_prepared(tmp_path / "tiny"), original / "data" / "cbt-ne")
    invoke("tune", "--dataset", "cbt-ne", "--num-samples", "2", "--search-space", write_space(tmp_path),
           "--name", "unit", "--workdir", original, *SETS)
    invoke("ensemble", "--sweep", "unit", "--seeds", "1", "--name", "first", "--workdir", original)
    trained = invoke("train", "--dataset", "cbt-ne", "--run-dir", original / "runs" / "x", "--workdir", original,
                     "--json", *SETS)
    shutil.copytree(original, copy, symlinks=True)
    before = listing(original)
    subprocess.run(["chmod", "-R", "a-w", str(original)], check=True)
    try:
        resumed = invoke("train", "--dataset", "cbt-ne", "--run-dir", copy / "runs" / "x", "--resume", "--workdir",
                         copy, "--json", *SETS, "--set", "train.max_epochs=2")
        invoke("report", "--sweep", "unit", "--workdir", copy)
        invoke("report", "--experiment", "tune-cbt-ne", "--out", copy / "curves.png", "--x", "steps",
               "--workdir", copy)
        second = invoke("ensemble", "--sweep", "unit", "--seeds", "1", "--name", "second", "--workdir", copy, "--json")
        member = Path(second["members"][0])
        scored = invoke("evaluate", "--checkpoint", member, "--dataset", "cbt-ne", "--split", "valid",
                        "--workdir", copy, "--json")
        student = invoke("distill", "--ensemble", copy / "ensembles" / "first", "--train-examples", "32",
                         "--workdir", copy, "--json", *SETS)
        from iaa.platform import ray_serve, serve_life

        served: list = []
        monkeypatch.setattr(serve_life, "check_port", lambda cfg: None)     # nothing listens: any port will do
        monkeypatch.setattr(ray_serve, "run_forever",
                            lambda cfg, code: served.append(_answer_one(code.load(cfg.source, cfg.threads))))
        invoke("serve", "--ensemble", copy / "ensembles" / "first", "--workdir", copy)
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(original)], check=True)
    assert listing(original) == before
    assert member.is_relative_to(copy) and Path(scored["predictions"]).is_relative_to(copy / "evaluations")
    assert Path(student["teacher"]).is_relative_to(copy / "distill" / "teachers")
    assert [m.is_relative_to(copy) for m in map(Path, student["members"])] == [True]
    [rows] = served
    assert [r["id"] for r in rows] == ["q1"] and set(rows[0]["probs"]) == {"cat", "mat"}
    assert resumed["mlflow_run_id"] == trained["mlflow_run_id"]          # the same run, in the copy's store
    with sqlite3.connect(copy / "mlflow.db") as con:
        locations = [loc for (loc,) in con.execute("SELECT artifact_uri FROM runs")]
        [(checks,)] = con.execute("SELECT count(*) FROM metrics WHERE run_uuid = ? AND key = 'valid_acc'",
                                  (trained["mlflow_run_id"],))
    assert checks > len((original / "runs" / "x" / "metrics.jsonl").read_text().splitlines())
    assert locations and all(loc.startswith((copy / "mlartifacts").as_uri()) for loc in locations)
