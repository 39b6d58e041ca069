"""A work folder is a unit: its records find their paths where the folder is now, the MLflow store
follows it, and evaluate and distill write into it, never beside a checkpoint or the data."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from _faults import assert_says, make_checkpoint, make_prepared
from iaa.errors import IaaError
from iaa.jobs.config.job_config import JobConfig
from iaa.jobs.ports import TrialRecord
from iaa.jobs.sweeps import record as sweep_file
from iaa.jobs.workdir.paths import Workdir


def listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` with its size and modification time (ns)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("unit")
    _, prepared = make_prepared(root)
    return {"root": root, "prepared": prepared, "ckpt": make_checkpoint(prepared, root / "run" / "best.pt")}


def _work(tmp_path: Path, base: dict[str, Path]) -> Path:
    """A work folder holding the prepared data and one sweep trial's checkpoint."""
    work = tmp_path / "a" / "work"
    shutil.copytree(base["prepared"], work / "data" / "cbt-ne")
    (work / "sweeps" / "s" / "checkpoints" / "t0").mkdir(parents=True)
    shutil.copyfile(base["ckpt"], work / "sweeps" / "s" / "checkpoints" / "t0" / "checkpoint.pt")
    return work


def _sweep(work: Path) -> sweep_file.SweepRecord:
    from iaa.jobs.datasets import resolve

    cfg: JobConfig = resolve.job_config("cbt-ne", work / "data" / "cbt-ne", sets=["model.embed_dim=16"])
    trial = TrialRecord("t0", cfg, best_valid_acc=0.5,
                        checkpoint=str(work / "sweeps" / "s" / "checkpoints" / "t0" / "checkpoint.pt"))
    return sweep_file.SweepRecord(name="s", dataset="cbt-ne", data_dir=str(work / "data" / "cbt-ne"),
                                  tracking_uri=f"sqlite:///{work / 'mlflow.db'}", storage=str(work / "ray" / "s"),
                                  optuna=sweep_file.Study(f"sqlite:///{work / 'optuna.db'}", "s"), trials=(trial,))


# --- records ------------------------------------------------------------------------------------


def test_sweep_json_stores_the_paths_inside_the_work_folder_relative_to_it(tmp_path, base):
    work = _work(tmp_path, base)
    sweep_file.write(sweep_file.sweep_file(work, "s"), _sweep(work))
    raw = json.loads(sweep_file.sweep_file(work, "s").read_text())
    assert raw["data_dir"] == "data/cbt-ne" and raw["storage"] == "ray/s"
    assert raw["tracking_uri"] == "sqlite:///mlflow.db" and raw["optuna"]["storage"] == "sqlite:///optuna.db"
    assert raw["trials"][0]["checkpoint"] == "sweeps/s/checkpoints/t0/checkpoint.pt"


def test_a_moved_work_folder_reads_its_sweep_from_its_new_place(tmp_path, base):
    work = _work(tmp_path, base)
    sweep_file.write(sweep_file.sweep_file(work, "s"), _sweep(work))
    moved = tmp_path / "b" / "moved"
    shutil.move(work, moved)
    sweep = sweep_file.read(sweep_file.sweep_file(moved, "s"))
    assert sweep.data_dir == str(moved / "data" / "cbt-ne") and sweep.storage == str(moved / "ray" / "s")
    assert sweep.tracking_uri == f"sqlite:///{moved / 'mlflow.db'}"
    assert sweep.optuna.storage == f"sqlite:///{moved / 'optuna.db'}"
    assert sweep.trials[0].checkpoint == str(moved / "sweeps" / "s" / "checkpoints" / "t0" / "checkpoint.pt")


def test_an_old_sweep_json_with_absolute_paths_is_found_in_the_moved_folder(tmp_path, base):
    work = _work(tmp_path, base)
    data = {k: v for k, v in _sweep(work).to_json().items() if k != "schema"}
    sweep_file.sweep_file(work, "s").write_text(json.dumps(data))       # as written before: absolute paths
    moved = tmp_path / "b" / "moved"
    shutil.move(work, moved)
    sweep = sweep_file.read(sweep_file.sweep_file(moved, "s"))
    assert sweep.data_dir == str(moved / "data" / "cbt-ne")
    assert sweep.trials[0].checkpoint == str(moved / "sweeps" / "s" / "checkpoints" / "t0" / "checkpoint.pt")
    assert sweep.storage == str(work / "ray" / "s")     # nothing there in either place: left as recorded


def test_paths_outside_the_work_folder_and_uris_stay_as_they_are(tmp_path):
    from iaa.jobs.workdir import recorded

    work = tmp_path / "work"
    work.mkdir()
    assert recorded.stored(str(tmp_path / "elsewhere" / "x.pt"), work) == str(tmp_path / "elsewhere" / "x.pt")
    assert recorded.stored("s3://bucket/ray", work) == "s3://bucket/ray"
    assert recorded.located("s3://bucket/ray", work) == "s3://bucket/ray"
    assert recorded.stored("postgresql://h/db", work) == "postgresql://h/db"
    assert recorded.located("", work) == "" and recorded.stored(None, work) is None


def _ensemble(work: Path, members: list[str], digests: dict[str, str]) -> Path:
    from iaa.jobs.evaluation.ensembling import ensemble_record

    folder = work / "ensembles" / "e"
    ensemble_record.write(folder, ensemble_record.EnsembleRecord(
        members=tuple(members), all_members=tuple(members), member_sha256=digests,
        data_dir=str(work / "data" / "cbt-ne"), ensemble_dir=str(folder)))
    return folder


def test_a_moved_ensemble_finds_its_members_under_the_new_folder_and_checks_their_digests(tmp_path, base):
    from iaa.data.prepared.shards import file_sha256
    from iaa.jobs.evaluation.predictor import ensemble_members

    work = _work(tmp_path, base)
    member = work / "sweeps" / "s" / "checkpoints" / "t0" / "checkpoint.pt"
    folder = _ensemble(work, [str(member)], {str(member): file_sha256(member)})
    raw = json.loads((folder / "ensemble.json").read_text())
    assert raw["members"] == ["sweeps/s/checkpoints/t0/checkpoint.pt"] and raw["data_dir"] == "data/cbt-ne"
    assert list(raw["member_sha256"]) == raw["members"]
    moved = tmp_path / "b" / "moved"
    shutil.move(work, moved)
    assert ensemble_members(moved / "ensembles" / "e") == [moved / "sweeps" / "s" / "checkpoints" / "t0" /
                                                            "checkpoint.pt"]
    shutil.copyfile(base["root"] / "prepared" / "manifest.json", moved / "sweeps" / "s" / "checkpoints" / "t0" /
                    "checkpoint.pt")                                    # the member changed since
    with pytest.raises(Exception, match="changed since the ensemble"):
        ensemble_members(moved / "ensembles" / "e")


def test_an_old_ensemble_json_with_absolute_members_is_read_in_the_moved_folder(tmp_path, base):
    from iaa.data.prepared.shards import file_sha256
    from iaa.jobs.evaluation.predictor import ensemble_members

    work = _work(tmp_path, base)
    member = str(work / "sweeps" / "s" / "checkpoints" / "t0" / "checkpoint.pt")
    (work / "ensembles" / "e").mkdir(parents=True)
    (work / "ensembles" / "e" / "ensemble.json").write_text(json.dumps(
        {"members": [member], "member_sha256": {member: file_sha256(Path(member))}}))
    moved = tmp_path / "b" / "moved"
    shutil.move(work, moved)
    assert ensemble_members(moved / "ensembles" / "e") == [moved / "sweeps" / "s" / "checkpoints" / "t0" /
                                                            "checkpoint.pt"]


# --- outputs in the work folder -------------------------------------------------------------------


def test_evaluate_writes_its_predictions_into_the_work_folder_not_beside_the_checkpoint(tmp_path, base):
    from iaa.jobs.evaluation import evaluate

    ckpt = tmp_path / "theirs" / "run" / "checkpoints" / "best.pt"
    ckpt.parent.mkdir(parents=True)
    shutil.copyfile(base["ckpt"], ckpt)
    before = listing(tmp_path / "theirs")
    work = tmp_path / "work"
    result = evaluate.run(ckpt, base["prepared"], "valid", workdir=work)
    out = Path(result.predictions)
    assert out.is_file() and out.name == "predictions-valid.parquet"
    assert out.parent.parent == work / "evaluations" and out.parent.name.startswith("run-best-")
    assert listing(tmp_path / "theirs") == before
    assert set(result.fields()) >= {"accuracy", "predictions", "split", "examples", "checkpoint"}


def test_a_trials_checkpoint_is_evaluated_into_a_folder_named_by_its_sweep_and_trial(tmp_path):
    work = Workdir(tmp_path / "work")
    ckpt = work.root / "ray" / "demo-iaa-a067c3" / "04c5595f" / "checkpoint_000002" / "checkpoint.pt"
    assert work.evaluation(ckpt).name.startswith("demo-iaa-a067c3-04c5595f-checkpoint_000002-")
    assert work.evaluation(work.root / "runs" / "r" / "checkpoints" / "best.pt").name.startswith("r-best-")

def test_evaluate_cli_says_where_the_predictions_went_and_honours_out(tmp_path, base):
    from click.testing import CliRunner

    from iaa import cli

    work = tmp_path / "work"
    args = ["evaluate", "--checkpoint", str(base["ckpt"]), "--data", str(base["prepared"]), "--split", "valid",
            "--workdir", str(work)]
    result = CliRunner().invoke(cli.cli, args)
    assert result.exit_code == 0, result.output
    [where] = [line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("predictions: ")]
    assert Path(where).is_file() and Path(where).is_relative_to(work / "evaluations")
    named = CliRunner().invoke(cli.cli, [*args, "--out", str(tmp_path / "mine.parquet"), "--json"])
    assert named.exit_code == 0, named.output
    assert json.loads(named.stdout)["predictions"] == str(tmp_path / "mine.parquet")
    assert any("predictions:" in line and str(tmp_path / "mine.parquet") in line   # the summary, --json or not
               for line in named.stderr.splitlines())
    assert "valid accuracy:" in named.stderr and "next:" in named.stderr


def test_explain_writes_its_page_into_the_work_folder_not_beside_the_checkpoint(tmp_path, base):
    from click.testing import CliRunner

    from iaa import cli

    ckpt = tmp_path / "theirs" / "run" / "checkpoints" / "best.pt"
    ckpt.parent.mkdir(parents=True)
    shutil.copyfile(base["ckpt"], ckpt)
    before = listing(tmp_path / "theirs")
    work = tmp_path / "work"
    result = CliRunner().invoke(cli.cli, ["explain", "--checkpoint", str(ckpt), "--data", str(base["prepared"]),
                                          "--first", "1", "--workdir", str(work), "--json"])
    assert result.exit_code == 0, result.output
    page = Path(json.loads(result.stdout.strip().splitlines()[-1])["html"])
    assert page.is_file() and page.name == "explain-valid.html" and page.parent.parent == work / "evaluations"
    assert listing(tmp_path / "theirs") == before


def test_the_teacher_file_lives_in_the_work_folder_and_keeps_its_name_when_the_folder_moves(tmp_path):
    from iaa.jobs.distill import distill

    work, moved = tmp_path / "a" / "work", tmp_path / "b" / "moved"
    path = distill.teacher_path(work, work / "ensembles" / "e", 8)
    assert path.parent == work / "distill" / "teachers" and path.name.startswith("e-first8-")
    assert distill.teacher_path(moved, moved / "ensembles" / "e", 8).name == path.name
    assert distill.teacher_path(work, tmp_path / "other" / "e", 8).name != path.name


def test_a_stored_teacher_of_the_same_members_at_another_place_is_fresh(tmp_path):
    import pyarrow as pa

    from iaa.jobs.distill import teacher

    table = pa.table({"example_id": ["a"], "candidate_words": [["x", "y"]], "teacher_probs": [[0.25, 0.75]]},
                     schema=teacher.SCHEMA)
    then = [teacher.Member(tmp_path / "a" / "work" / "m.pt", "d1")]
    path = teacher.write(table, tmp_path / "t.parquet", ensemble_dir=tmp_path / "e", members=then, split="train",
                         limit=None, vocab_hash="v")
    teacher.check_fresh(path, [teacher.Member(tmp_path / "b" / "moved" / "m.pt", "d1")], "v", None)
    with pytest.raises(teacher.TeacherError, match="stale teacher"):
        teacher.check_fresh(path, [teacher.Member(tmp_path / "b" / "moved" / "m.pt", "d2")], "v", None)


# --- the MLflow store ---------------------------------------------------------------------------------


def test_a_copied_mlflow_store_logs_its_artifacts_into_the_copy_only(tmp_path):
    from iaa.platform.tracking.tracker import MlflowTracker

    original, copy = tmp_path / "a w" / "work", tmp_path / "b" / "work"
    original.mkdir(parents=True)
    (tmp_path / "f.txt").write_text("x")
    tracker = MlflowTracker(Workdir(original).tracking_uri())
    with tracker.run("exp", "first") as run:
        run.log_artifact(tmp_path / "f.txt")
    shutil.copytree(original, copy)
    before = listing(original)
    moved = MlflowTracker(Workdir(copy).tracking_uri())
    old = moved.attach(run.run_id)
    old.log_artifact(tmp_path / "f.txt", "report")                  # an earlier run, as report does
    with moved.run("exp", "second") as new:
        new.log_artifact(tmp_path / "f.txt")
    assert not old.lost and not new.lost
    assert listing(original) == before
    assert (copy / "mlartifacts" / run.run_id / "artifacts" / "report" / "f.txt").is_file()
    assert (copy / "mlartifacts" / new.run_id / "artifacts" / "f.txt").is_file()
    with sqlite3.connect(copy / "mlflow.db") as con:
        locations = [loc for (loc,) in con.execute("SELECT artifact_uri FROM runs")]
    assert locations and all(loc.startswith((copy / "mlartifacts").as_uri()) for loc in locations)


def test_a_sweep_record_is_typed_versioned_and_keeps_keys_it_does_not_know(tmp_path, base):
    work = _work(tmp_path, base)
    path = sweep_file.sweep_file(work, "s")
    sweep_file.write(path, _sweep(work))
    raw = json.loads(path.read_text())
    assert raw["schema"] == sweep_file.SCHEMA
    raw.pop("schema")                                   # as written before records were versioned
    path.write_text(json.dumps({**raw, "added_later": {"x": 1}}))
    sweep = sweep_file.read(path)
    assert isinstance(sweep.optuna, sweep_file.Study) and sweep.optuna.study == "s"
    assert sweep.trials[0].trial_id == "t0" and sweep.unknown == {"added_later": {"x": 1}}
    assert sweep.spans is None                          # written before runs were recorded
    sweep_file.write(path, sweep.with_run(sweep.trials, 1_700_000_000.0, 12.34))
    again = json.loads(path.read_text())
    assert again["added_later"] == {"x": 1} and again["wall_s"] == 12.3 and again["schema"] == sweep_file.SCHEMA
    assert again["spans"] == [[1_700_000_000.0, 12.34]]
    resumed = sweep_file.read(path).with_run(sweep.trials, 1_700_100_000.0, 5.0)   # each run adds its span
    assert resumed.spans == ((1_700_000_000.0, 12.34), (1_700_100_000.0, 5.0)) and resumed.wall_s == 17.3
    path.write_text(json.dumps({**again, "spans": [[1_700_000_000.0]]}))
    with pytest.raises(IaaError) as bad:
        sweep_file.read(path)
    assert_says(str(bad.value), "spans", "[start, seconds] pairs")


def test_an_ensemble_record_is_typed_versioned_and_keeps_what_it_does_not_know(tmp_path):
    from iaa.jobs.evaluation.ensembling import ensemble_record

    folder = tmp_path / "w" / "ensembles" / "e"
    folder.mkdir(parents=True)
    old = {"name": "e", "members": ["m.pt"], "valid_acc": 0.5, "member_valid_acc": [0.4, 0.45],
           "boo_n": 1, "from_a_newer_version": {"k": 1}}            # written before records were versioned
    (folder / "ensemble.json").write_text(json.dumps(old), encoding="utf-8")
    record = ensemble_record.read(folder)
    assert isinstance(record, ensemble_record.EnsembleRecord)
    assert record.name == "e" and record.valid_acc == 0.5 and record.best_member_valid_acc == 0.45
    assert record.members == (str(tmp_path / "w" / "m.pt"),)         # found where the work folder is now
    assert record.rest == {"boo_n": 1, "from_a_newer_version": {"k": 1}}
    ensemble_record.write(folder, record)
    written = json.loads((folder / "ensemble.json").read_text())
    assert written["schema"] == ensemble_record.SCHEMA and written["from_a_newer_version"] == {"k": 1}
    assert ensemble_record.read(folder) == record
