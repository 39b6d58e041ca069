"""Fault suite, files: edited checkpoints and teachers are refused in one line naming the file,
an ensemble refuses a member that changed while it ran, and killed runs' leftovers are cleaned
up by the next run (only those of dead processes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from _faults import assert_one_message, invoke, make_checkpoint, make_prepared
from iaa.jobs.modeling import checkpoint

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return make_prepared(tmp_path_factory.mktemp("files"))[1]


@pytest.fixture
def state(prepared, tmp_path) -> dict:
    """A complete checkpoint's raw state, with the vocabulary it carries, ready to be edited."""
    path = make_checkpoint(prepared, tmp_path / "made.pt")
    raw = torch.load(path, weights_only=True)
    raw.pop("digest")
    raw["vocab"] = {"json": (prepared / "vocab.json").read_text(encoding="utf-8"), "lowercase": False}
    return raw


def evaluate(path: Path, prepared: Path, tmp_path: Path) -> tuple[int, str]:
    return invoke("evaluate", "--checkpoint", path, "--data", prepared, "--split", "valid",
                  "--out", tmp_path / "p.parquet", "--workdir", tmp_path / "w")


def test_a_checkpoint_without_its_digest_is_refused(prepared, tmp_path, state):
    path = tmp_path / "nodigest.pt"
    torch.save(state, path)
    assert_one_message(*evaluate(path, prepared, tmp_path), str(path), "has no digest")


def test_an_unknown_checkpoint_format_is_refused(prepared, tmp_path, state):
    path = checkpoint.save(tmp_path / "future.pt", {**state, "format": 999})
    assert_one_message(*evaluate(path, prepared, tmp_path), str(path), "unknown checkpoint format 999")


def test_a_swapped_vocabulary_is_refused_against_its_vocab_hash(prepared, tmp_path, state):
    words = json.loads(state["vocab"]["json"])
    words[5], words[6] = words[6], words[5]
    path = checkpoint.save(tmp_path / "swapped.pt", {**state, "vocab": {"json": json.dumps(words), "lowercase": False}})
    assert_one_message(*evaluate(path, prepared, tmp_path), str(path), "vocabulary does not match its vocab_hash")


@pytest.mark.parametrize("edit", [{"kind": "as-reader"}, {"hidden_dim": 9}, {"vocab_size": 7}])
def test_a_config_that_does_not_match_the_weights_is_one_line(prepared, tmp_path, state, edit):
    state["config"]["model"].update(edit)
    path = checkpoint.save(tmp_path / "edited.pt", state)
    assert_one_message(*evaluate(path, prepared, tmp_path), str(path), "config does not match its weights")


def test_an_old_checkpoint_without_a_digest_still_loads(prepared, tmp_path, state):
    """Format 1 (before digests and embedded vocabularies) is still read."""
    old = {k: v for k, v in state.items() if k not in ("vocab",)}
    old["format"] = 1
    path = tmp_path / "format1.pt"
    torch.save(old, path)
    code, output = evaluate(path, prepared, tmp_path)
    assert code == 0, output
    new = checkpoint.save(tmp_path / "new.pt", state)
    assert checkpoint.load(new)["format"] == checkpoint.FORMAT == 3


def test_a_teacher_edited_into_valid_distributions_is_refused_by_its_content_digest(prepared, tmp_path):
    """Uniform distributions over the same candidates pass every per-row check; the digest does not."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iaa.data.loader import PreparedData
    from iaa.jobs.distill import teacher

    rows = PreparedData.open(prepared).rows("train", 0, 8)
    words = rows.column("candidate_words").to_pylist()
    table = pa.table({"example_id": rows.column("example_id"), "candidate_words": words,
                      "teacher_probs": [[1.0 if i == 0 else 0.0 for i in range(len(w))] for w in words]},
                     schema=teacher.SCHEMA)
    path = teacher.write(table, tmp_path / "t.parquet", ensemble_dir=tmp_path, members=[], split="train",
                         limit=8, vocab_hash="")
    assert teacher.attach(rows, path).num_rows == 8                     # as written: accepted
    meta = pq.read_schema(path).metadata
    uniform = table.set_column(2, "teacher_probs", pa.array([[1 / len(w)] * len(w) for w in words],
                                                            pa.list_(pa.float32())))
    pq.write_table(uniform.replace_schema_metadata(meta), path)
    with pytest.raises(teacher.TeacherError, match="do not match the digest") as err:
        teacher.attach(rows, path)
    assert str(path) in str(err.value)


@pytest.mark.parametrize("when", ["evaluating", "logging"])
def test_an_ensemble_refuses_a_member_that_changed_before_the_end(prepared, tmp_path, monkeypatch, when):
    """A member retrained while the others are evaluated (or while the model is logged) is refused by
    name; what ensemble.json records is the digest of the file as first read."""
    import hashlib

    from iaa.jobs.evaluation import evaluate
    from iaa.platform import mlflow_model

    members = [make_checkpoint(prepared, tmp_path / f"m{seed}.pt", seed=seed) for seed in (0, 1)]
    first = hashlib.sha256(members[0].read_bytes()).hexdigest()
    retrained = make_checkpoint(prepared, tmp_path / "retrained.pt", seed=7).read_bytes()

    def retrain() -> None:
        members[0].write_bytes(retrained)

    real_evaluate, real_log = evaluate.run, mlflow_model.try_log

    def evaluating(checkpoint_path, *args, **kwargs):
        if when == "evaluating" and str(checkpoint_path) == str(members[1].resolve()):
            retrain()                          # member 0 is evaluated already
        return real_evaluate(checkpoint_path, *args, **kwargs)

    def logging(*args, **kwargs):
        retrain()
        return real_log(*args, **kwargs)

    monkeypatch.setattr(evaluate, "run", evaluating)
    if when == "logging":
        monkeypatch.setattr(mlflow_model, "try_log", logging)
    code, output = invoke("ensemble", "--members", *members, "--data", prepared, "--workdir", tmp_path / "w",
                          "--name", "changing")
    assert_one_message(code, output, str(members[0].resolve()), "changed while ensemble 'changing' was built",
                       first[:12])
    summary = tmp_path / "w" / "ensembles" / "changing" / "ensemble.json"
    if when == "evaluating":
        assert not summary.exists()
    else:
        assert json.loads(summary.read_text())["member_sha256"][str(members[0].resolve())] == first


@pytest.fixture
def pids():
    """(a dead PID, a live PID of another process)."""
    import subprocess
    import sys

    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield finished.pid, live.pid
    finally:
        live.kill()
        live.wait()


def _leftover(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "part-0.parquet").write_bytes(b"x" * 1000)
    return folder


def test_prepare_removes_building_folders_of_killed_runs_only(prepared, tmp_path, pids):
    from _cbt_fixtures import write_source

    dead, live = pids
    out = tmp_path / "cbt-ne"
    killed = _leftover(tmp_path / f".cbt-ne.building-{dead}")
    running = _leftover(tmp_path / f".cbt-ne.building-{live}")
    other = _leftover(tmp_path / f".other.building-{dead}")
    code, output = invoke("prepare", "--dataset", "cbt-ne", "--source", write_source(tmp_path / "src"), "--out", out)
    assert code == 0, output
    assert not killed.exists() and running.exists() and other.exists()


def test_a_checkpoint_write_removes_staging_folders_of_killed_runs_only(prepared, tmp_path, pids):
    from iaa.jobs.training.session import LocalSession

    dead, live = pids
    session = LocalSession(prepared, tmp_path / "run", batch_size=8, seed=0)
    killed = _leftover(session.ckpt_dir / f".staging-{dead}-abc123")
    running = _leftover(session.ckpt_dir / f".staging-{live}-def456")
    with session.checkpoint_folder() as folder:
        assert folder.name.startswith(f".staging-{__import__('os').getpid()}-")
    assert not killed.exists() and running.exists() and not folder.exists()


def last_json(output: str) -> dict:
    return json.loads([line for line in output.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_distill_resumes_with_resume_as_its_message_says(prepared, tmp_path):
    from _faults import TINY_MODEL

    work = tmp_path / "work"
    sets = [x for s in (*TINY_MODEL, "train.max_epochs=1", "train.threads=1") for x in ("--set", s)]

    def run(*args: object) -> tuple[int, str]:
        return invoke(*args, "--workdir", work, *sets)

    members = []
    for seed in (0, 1):
        code, output = run("train", "--data", prepared, "--set", f"train.seed={seed}", "--json")
        assert code == 0, output
        members.append(last_json(output)["checkpoint"])
    code, output = invoke("ensemble", "--members", *members, "--data", prepared, "--workdir", work,
                          "--name", "two", "--json")
    assert code == 0, output
    ensemble = last_json(output)["ensemble_dir"]
    code, output = run("distill", "--ensemble", ensemble, "--run-dir", tmp_path / "student", "--json")
    assert code == 0, output
    first = last_json(output)
    code, output = run("distill", "--ensemble", ensemble, "--run-dir", tmp_path / "student")
    assert_one_message(code, output, "add --resume to continue it")
    code, output = run("distill", "--ensemble", ensemble, "--run-dir", tmp_path / "student", "--resume", "--json")
    assert code == 0, output
    again = last_json(output)
    assert again["mlflow_run_id"] == first["mlflow_run_id"] and not again["teacher_computed"]
