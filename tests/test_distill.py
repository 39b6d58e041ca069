"""Distillation (``iaa-cli distill``): the teacher is the ensemble's own average, α = 1 is ordinary
training, the soft loss is a KL, and a bad or stale teacher is refused with a clear error."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from iaa.data.loading.loader import PreparedData, TEACHER_COLUMN, iter_batches
from iaa.jobs.modeling import checkpoint
from iaa.jobs.distill import distill, outcome, teacher
from iaa.jobs.datasets import resolve
from iaa.jobs.evaluation.ensembling import averaging as ensemble_job
from iaa.jobs.evaluation import evaluate
from iaa.jobs.train import train as train_job
from iaa.jobs.config.job_config import JobConfig
from iaa.jobs.ports import TrainRun
from iaa.jobs.training.summary import TrainResult
from iaa.jobs.modeling.objective import Objective
from iaa.jobs.distill.teacher import TeacherError
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.timeout(300)


def tiny_cfg(prepared: Path, seed: int = 0, *sets: str) -> JobConfig:
    return resolve.job_config("cbt-ne", prepared, sets=[*TINY_SETS, "train.max_epochs=1", "train.threads=1",
                                                        f"train.seed={seed}", *sets])


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny dataset, three briefly trained members and an ensemble folder over them."""
    root = tmp_path_factory.mktemp("distill")
    prepared = make_tiny_prepared(root)
    members = [Path(train_job.run(tiny_cfg(prepared, seed), prepared, root / f"member{seed}", show_progress=False)
                    .checkpoint) for seed in range(3)]
    ens = root / "ensembles" / "three"
    files = [{"valid": Path(evaluate.run(m, prepared, "valid", ens / "members" / f"{i:02d}-valid.parquet").predictions),
              "test": None} for i, m in enumerate(members)]
    result = ensemble_job.run(files, [str(m) for m in members], ens)
    (ens / "ensemble.json").write_text(json.dumps({**result.fields(), "data_dir": str(prepared)}, default=str))
    return root, prepared, members, ens


def request(setup, **kw) -> distill.DistillRequest:
    root, prepared, _, ens = setup
    return distill.DistillRequest(ens, workdir=root / "work", show_progress=False,
                                  sets=(*TINY_SETS, "train.max_epochs=1", "train.threads=1"), **kw)


def plain_train(run: TrainRun) -> TrainResult:
    """The in-process train job (the CLI passes the MLflow-tracked one)."""
    return train_job.run(run.cfg, run.prepared, run.run_dir, show_progress=False, train_rows=run.train_rows)


def test_the_weights_come_from_the_flags_else_the_config_else_the_defaults(setup, tmp_path):
    """``alpha`` and ``temperature`` given win; left out, ``--set distill.*`` (or the config
    file) sets them; neither: 0.5 and 1 (not the member's own alpha 1, which means no teacher)."""
    _, prepared, members, _ = setup
    file = tmp_path / "distill.yaml"
    file.write_text("distill:\n  temperature: 4.0\n", encoding="utf-8")

    def weights(sets=(), **kw):
        req = request(setup, **kw)
        found = distill.student_config(members[0], prepared, replace(req, sets=(*req.sets, *sets))).distill
        return found.alpha, found.temperature

    assert weights() == (0.5, 1.0)
    assert weights(sets=("distill.alpha=0.2", "distill.temperature=3")) == (0.2, 3.0)
    assert weights(sets=("distill.alpha=0.2",), alpha=0.7, temperature=2.0) == (0.7, 2.0)
    assert weights(config_file=file) == (0.5, 4.0)


def test_soft_targets_equal_the_ensembles_own_average(setup, tmp_path):
    _, prepared, members, ens = setup
    _, found = teacher.members_of(ens)
    assert [m.checkpoint for m in found] == members
    table = teacher.compute(found, prepared, "valid", None, tmp_path, teacher.score_in_process)
    ours = dict(zip(table.column("example_id").to_pylist(), table.column(TEACHER_COLUMN).to_pylist()))
    theirs = pq.read_table(ens / "predictions.parquet").to_pylist()
    assert len(ours) == len(theirs) > 0
    for row in theirs:
        np.testing.assert_allclose(ours[row["example_id"]], row["probs"], rtol=0, atol=1e-7)   # float32 storage


def test_the_teacher_is_computed_once_and_reused(setup):
    req = request(setup, train_examples=64, run_dir=setup[0] / "runs" / "once")
    result = distill.run(req, train=plain_train)
    assert result.teacher_computed
    path = Path(result.teacher)
    assert path.parent == req.workdir / "distill" / "teachers" and pq.read_table(path).num_rows == 64
    assert not (setup[1] / "teachers").exists()                 # nothing beside the prepared data
    calls = []
    again = distill.run(replace(req, run_dir=setup[0] / "runs" / "twice"), train=plain_train,
                        score=lambda *a: calls.append(a) or [])
    assert not again.teacher_computed and calls == []


def test_the_student_is_trained_from_one_request_that_carries_the_distill_request(setup, tmp_path):
    """The train workflow gets one ``TrainRun``: the run folder, the rows with their teacher, the
    teacher's file and tags, the ensemble's experiment, and the request's resume, register and
    progress settings (the command line binds only the store)."""
    from fakes import FakeTrainWorkflow

    train = FakeTrainWorkflow()
    req = request(setup, train_examples=32, run_dir=tmp_path / "student", register="a-student")
    result = distill.run(req, train=train)
    [run] = train.runs
    assert (Path(run.run_dir), run.resume, run.register, run.show_progress) == (tmp_path / "student", False,
                                                                               "a-student", False)
    assert run.train_rows is not None and run.train_rows.num_rows == 32 and TEACHER_COLUMN in run.train_rows.column_names
    assert Path(run.teacher).resolve() == Path(result.teacher) and run.tags["teacher"] == result.teacher
    assert run.experiment == "distill-three" and run.workers == 0 and run.cfg.distill.alpha == 0.5


def test_alpha_one_reproduces_ordinary_training(setup, tmp_path):
    _, prepared, members, ens = setup
    cfg = tiny_cfg(prepared, 5)
    plain = train_job.run(cfg, prepared, tmp_path / "plain", show_progress=False)
    path = distill.prepare_teacher(request(setup), prepared, teacher.members_of(ens)[1], teacher.score_in_process)[0]
    rows = teacher.attach(PreparedData.open(prepared).table("train"), path)
    taught = train_job.run(replace(cfg, distill=replace(cfg.distill, alpha=1.0, temperature=2.0)), prepared,
                           tmp_path / "alpha1", show_progress=False, train_rows=rows)
    soft = train_job.run(replace(cfg, distill=replace(cfg.distill, alpha=0.0)), prepared,
                         tmp_path / "alpha0", show_progress=False, train_rows=rows)
    a, b, c = (checkpoint.load(Path(r.checkpoint))["model"] for r in (plain, taught, soft))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert plain.best_valid_acc == taught.best_valid_acc
    assert not all(torch.equal(a[k], c[k]) for k in a)          # the teacher does move training when α < 1


def test_the_soft_loss_is_t_squared_kl_to_the_tempered_teacher():
    torch.manual_seed(0)
    log_p = torch.log_softmax(torch.randn(3, 4), 1)
    log_p[2, 3] = float("-inf")                                   # a candidate absent from the document
    teacher_p = torch.softmax(torch.randn(3, 4), 1)
    teacher_p[2, 3] = 0.0
    teacher_p[2] /= teacher_p[2].sum()
    cand_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
    teacher_p[1, 3] = 0.0
    teacher_p[1] /= teacher_p[1].sum()

    class B:
        answer = torch.tensor([0, 1, 2])
        teacher = teacher_p

    B.cand_mask = cand_mask
    t = 2.0
    got = Objective(alpha=0.0, temperature=t).soft_loss(log_p, B)
    expected = 0.0
    for b in range(3):
        keep = [c for c in range(4) if cand_mask[b, c] and teacher_p[b, c] > 0]
        q = torch.softmax(torch.log(teacher_p[b, keep]) / t, 0)
        p = torch.softmax(log_p[b, keep] / t, 0)
        expected += float((q * (q.log() - p.log())).sum())
    assert float(got) == pytest.approx(t * t * expected / 3, rel=1e-5)
    same = Objective(alpha=0.0).soft_loss(torch.log(teacher_p), B)
    assert float(same) == pytest.approx(0.0, abs=1e-6)


def test_alpha_below_one_without_a_teacher_is_a_clear_error(setup):
    _, prepared, _, _ = setup
    batch = next(iter_batches(PreparedData.open(prepared).table("train"), 4, seed=0, epoch=0))
    with pytest.raises(Exception, match="distill.alpha < 1 needs the teacher"):
        Objective(alpha=0.5)(torch.zeros(len(batch), batch.cand_mask.shape[1]), batch)


def test_a_folder_that_is_no_ensemble_is_refused(setup, tmp_path):
    with pytest.raises(TeacherError, match="not an ensemble folder"):
        distill.run(replace(request(setup), ensemble=tmp_path), train=plain_train)


def test_a_stale_teacher_is_refused_until_refreshed(setup, tmp_path):
    root, prepared, members, ens = setup
    copies = tmp_path / "ens"
    copies.mkdir()
    moved = []
    for i, m in enumerate(members):                                 # members of our own to change
        moved.append(tmp_path / f"m{i}.pt")
        moved[-1].write_bytes(Path(m).read_bytes())
    summary = json.loads((ens / "ensemble.json").read_text())
    (copies / "ensemble.json").write_text(json.dumps({**summary, "members": [str(m) for m in moved]}))
    req = replace(request(setup), ensemble=copies, train_examples=32, run_dir=tmp_path / "run1")
    distill.run(req, train=plain_train)
    state = checkpoint.load(moved[1])
    state["model"] = {k: v + 0.01 if v.is_floating_point() else v for k, v in state["model"].items()}
    checkpoint.save(moved[1], state)                                # member 1 retrained in place
    with pytest.raises(TeacherError, match=r"stale teacher: member .*m1\.pt changed since"):
        distill.run(replace(req, run_dir=tmp_path / "run2"), train=plain_train)
    fresh = distill.run(replace(req, run_dir=tmp_path / "run3", refresh_teacher=True), train=plain_train)
    assert fresh.teacher_computed


def _damage(path: Path, change) -> None:
    table = pq.read_table(path)
    meta = table.schema.metadata
    rows = table.to_pylist()
    change(rows)
    pq.write_table(pa.Table.from_pylist(rows, schema=teacher.SCHEMA).replace_schema_metadata(meta), path)


@pytest.mark.parametrize("change, message", [
    (lambda rows: rows.pop(3), "no teacher distribution for training example"),
    (lambda rows: rows[2].update(teacher_probs=[0.5] * len(rows[2]["teacher_probs"])), "not a distribution"),
    (lambda rows: rows[1].update(candidate_words=list(reversed(rows[1]["candidate_words"]))), "candidates differ"),
])
def test_a_damaged_teacher_is_refused_naming_the_file_and_example(setup, tmp_path, change, message):
    _, prepared, _, ens = setup
    path = distill.prepare_teacher(request(setup, train_examples=16), prepared, teacher.members_of(ens)[1],
                                   teacher.score_in_process)[0]
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(path.read_bytes())
    _damage(bad, change)
    with pytest.raises(TeacherError, match=message) as err:
        teacher.attach(PreparedData.open(prepared).rows("train", 0, 16), bad)
    assert str(bad) in str(err.value)


def test_a_teacher_file_that_is_not_parquet_is_refused(setup):
    req = request(setup, train_examples=8, run_dir=setup[0] / "runs" / "garbage")
    path = distill.teacher_path(req.workdir, req.ensemble, 8)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"not parquet at all")
    try:
        with pytest.raises(TeacherError, match="not a readable Parquet file"):
            distill.run(req, train=plain_train)
    finally:
        path.unlink()


def test_a_run_folder_that_holds_a_run_is_refused_before_the_teacher_is_scored(setup, tmp_path):
    from iaa.jobs.workdir.rundir import RunDirError

    run_dir = tmp_path / "student"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"a run's checkpoint")

    def scored(*args, **kwargs):
        raise AssertionError("the teacher was scored before the run folder was checked")

    req = replace(request(setup), run_dir=run_dir, refresh_teacher=True)
    with pytest.raises(RunDirError, match="already holds a run"):
        distill.run(req, train=plain_train, score=scored)


def test_the_students_run_records_the_comparison_with_its_teacher(setup, tmp_path):
    """The tracked student's run holds the ensemble's and its best member's valid accuracies and the
    points of the gain the student kept, as metrics beside its own and in its description, as the
    result gives them; a store that fails leaves a warning, and the student stands."""
    from fakes import FakeTracker
    from tests._faults import assert_says

    _, _, _, ens = setup
    summary = json.loads((ens / "ensemble.json").read_text())
    best = max(summary["member_valid_acc"])
    gained = tmp_path / "gained"                             # an ensemble 5 points above its best member
    gained.mkdir()
    (gained / "ensemble.json").write_text(json.dumps({**summary, "valid_acc": best + 0.05}))
    tracker = FakeTracker()
    train = train_job.tracked_in(tracker)
    req = replace(request(setup, train_examples=32, run_dir=tmp_path / "student"), ensemble=gained)
    result = distill.run(req, train=train, tracker=tracker)

    run = tracker.runs[result.mlflow_run_id]
    assert run.last("teacher_valid_acc") == pytest.approx(best + 0.05) and result.teacher_valid_acc == best + 0.05
    assert run.last("best_member_valid_acc") == pytest.approx(best) == result.best_member_valid_acc
    assert run.last("gain_points") == result.gain_points == 5.0
    assert run.last("gain_kept_points") == result.gain_kept_points is not None
    assert run.last("final_best_valid_acc") == pytest.approx(result.best_valid_acc)      # the student's, beside them
    assert {p.step for key in outcome.COMPARED for p in run.metrics[key]} == {result.steps}
    note = run.tags["mlflow.note.content"]
    assert_says(note, "Best valid_acc", f"teacher_valid_acc {best + 0.05:.4f}", f"best_member_valid_acc {best:.4f}",
                "an ensemble of 3 members", f"gain_kept_points {result.gain_kept_points:g} of gain_points 5")

    tracker.down = True
    kept = distill.record(tracker, result)
    [warning] = kept.warnings[len(result.warnings):]
    assert_says(warning, result.mlflow_run_id, "did not keep the comparison with the teacher", "the fake store is down")
    assert kept.checkpoint == result.checkpoint
