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

    from iaa.data.loading.loader import PreparedData
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


# --- records, names and the terminal ---------------------------------------------------------------

ROW = {"trial_id": "t1", "config": {}, "status": "TERMINATED", "checks": 1, "steps": 4, "best_valid_acc": 0.5}


@pytest.mark.parametrize("edit, key", [
    ({"trials": [{**ROW, "best_valid_acc": float("nan")}]}, "trials[0].best_valid_acc: expected an accuracy"),
    ({"name": "../../elsewhere"}, "name: expected a name"),
    ({"name": "s\x1b[2J"}, "name: expected a name"),
    ({"trials": "all of them"}, "trials: expected a list, got 'all of them'"),
    ({"trials": [{**ROW, "checks": "1"}]}, "trials[0].checks: expected a whole number"),
])
def test_a_damaged_sweep_record_is_one_line_naming_the_file_and_key(tmp_path, edit, key):
    record = tmp_path / "w" / "sweeps" / "s" / "sweep.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"name": "s", "trials": [ROW], **edit}), encoding="utf-8")
    code, output = invoke("report", "--sweep", "s", "--workdir", tmp_path / "w")
    assert_one_message(code, output, str(record), key)
    assert "\x1b" not in output


@pytest.mark.parametrize("edit, key", [
    ({"valid_acc": float("nan")}, "valid_acc: expected an accuracy: a finite number in [0, 1], got nan"),
    ({"name": "../x"}, "name: expected a name"),
    ({"member_sha256": ["not", "a", "mapping"]}, "member_sha256: expected a mapping"),
])
def test_a_damaged_ensemble_record_is_one_line_naming_the_file_and_key(tmp_path, edit, key):
    from iaa.errors import IaaError
    from iaa.jobs.evaluation.ensembling import ensemble_record

    folder = tmp_path / "w" / "ensembles" / "e"
    folder.mkdir(parents=True)
    (folder / "ensemble.json").write_text(json.dumps({"name": "e", "members": ["m.pt"], **edit}), encoding="utf-8")
    with pytest.raises(IaaError) as err:
        ensemble_record.read(folder)
    assert str(folder / "ensemble.json") in str(err.value) and key in str(err.value)


def test_report_of_a_sweep_name_that_leaves_the_work_folder_is_refused(tmp_path):
    outside = tmp_path / "escaped-sweep"
    outside.mkdir()
    (outside / "sweep.json").write_text(json.dumps({"name": "escaped-sweep", "trials": [],
                                                    "optuna": {"storage": "sqlite:///x.db", "study": "s"}}))
    code, output = invoke("report", "--sweep", "../../escaped-sweep", "--workdir", tmp_path / "w")
    assert_one_message(code, output, "--sweep '../../escaped-sweep' is not a valid name")
    assert sorted(p.name for p in outside.iterdir()) == ["sweep.json"]


@pytest.mark.parametrize("kind, name", [("sweep", "../x"), ("ensemble", "a/b"), ("run", ".."), ("run", "a/../../b"),
                                        ("data", "../../etc")])
def test_no_name_becomes_a_folder_outside_its_parent(tmp_path, kind, name):
    from iaa.jobs.workdir.names import BadNameError
    from iaa.jobs.workdir.paths import Workdir

    with pytest.raises(BadNameError, match="is not a valid"):
        getattr(Workdir(tmp_path), kind)(name)
    assert Workdir(tmp_path).run("cbt-ne-iaa-seed0").path == tmp_path / "runs" / "cbt-ne-iaa-seed0"


def test_text_from_files_reaches_the_terminal_with_its_control_characters_escaped():
    import click

    from iaa.cli.output import emit, friendly
    from iaa.errors import IaaError, printable

    assert printable("a\x1b[2J\x7f\x85\u2028 é 模型\tb") == "a\\x1b[2J\\x7f\\x85\\u2028 é 模型\\tb"
    assert printable("line\nnext\x1b", keep_lines=True) == "line\nnext\\x1b"

    @click.command()
    @click.option("--fail", is_flag=True)
    @friendly
    def show(fail: bool) -> None:
        if fail:
            raise IaaError("sweep.json: trial \x1b[2J\x1b[31mt1 failed:\nsecond line")
        emit({"sweep": "s\x1b]0;title\x07", "warnings": ["name \x1b[31mred"]}, as_json=False)

    from click.testing import CliRunner

    failed = CliRunner().invoke(show, ["--fail"])
    assert failed.exit_code == 1 and failed.output == "Error: sweep.json: trial \\x1b[2J\\x1b[31mt1 failed:\\nsecond line\n"
    shown = CliRunner().invoke(show, [])
    assert shown.exit_code == 0 and "\x1b" not in shown.output and "\x07" not in shown.output, shown.output
    assert "sweep: s\\x1b]0;title\\x07" in shown.output and "warning: name \\x1b[31mred" in shown.output


def test_distill_resume_refuses_a_run_of_another_teacher_naming_both(prepared, tmp_path):
    from functools import partial

    from iaa.jobs.distill import distill, identity
    from iaa.jobs.distill.outcome import DistillResult
    from iaa.jobs.training.summary import TrainResult
    from iaa.jobs.workdir import rundir

    work = tmp_path / "w"
    members = [make_checkpoint(prepared, tmp_path / f"m{seed}.pt", seed=seed) for seed in (0, 1, 2)]
    ensembles = {}
    for name, chosen in (("ens-a", members[:2]), ("ens-b", members[1:])):
        ensembles[name] = work / "ensembles" / name
        ensembles[name].mkdir(parents=True)
        (ensembles[name] / "ensemble.json").write_text(json.dumps(
            {"name": name, "members": [str(m) for m in chosen], "data_dir": str(prepared)}))
    trained = []

    def train(run):
        run_dir = run.run_dir
        trained.append(run.tags["teacher_id"])
        (run_dir / "checkpoints").mkdir(exist_ok=True)
        (run_dir / "checkpoints" / "last.pt").write_bytes(b"a checkpoint to resume from")
        return TrainResult(best_valid_acc=0.25, checkpoint=str(run_dir / "best.pt"), run_dir=str(run_dir))

    def distil(name: str, resume: bool) -> DistillResult:
        req = distill.DistillRequest(ensembles[name], workdir=work, run_dir=tmp_path / "student", train_examples=8,
                                     show_progress=False, resume=resume)
        return distill.run(req, train=train, claim=partial(rundir.claim, resume=resume))

    distil("ens-a", resume=False)
    with pytest.raises(identity.TeacherChangedError) as err:
        distil("ens-b", resume=True)
    assert len(trained) == 1
    message = str(err.value)
    assert "ensemble ens-a" in message and "ensemble ens-b" in message and str(tmp_path / "student") in message
    assert trained[0] in message                 # the teacher the run learnt from, by its digest
    distil("ens-a", resume=True)                 # its own teacher: resumed
    assert trained == [trained[0]] * 2
