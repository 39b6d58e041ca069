"""The line a stopped ``train``, ``ensemble`` or ``distill`` prints to continue it: run as
printed, it must make the same run, on the same cluster and stores. Each test holds every field
of the command's request either to its flag in the line or to a declared reason to leave it out,
so that a new field cannot be forgotten there."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from tests._faults import as_shown


def _lines_up(request: type, values: dict, not_resumed: set[str]) -> None:
    """Every field of ``request`` is in ``values`` (given to the line) or in ``not_resumed``."""
    fields = {f.name for f in dataclasses.fields(request)}
    assert fields - not_resumed == set(values), "a new field is either resumed here or declared not"


def _holds(line: str, flags: tuple[str, ...]) -> None:
    assert "`" not in line, line                    # every option named is a flag of the command
    for flag in flags:
        assert flag in line, (flag, line)


def test_a_stopped_train_resumes_with_every_field_that_shapes_the_run(tmp_path: Path) -> None:
    from iaa.jobs.train import train

    values = {"dataset": "demo", "data": tmp_path / "prepared", "model_kind": "as-reader", "config_file": tmp_path / "c.yaml",
              "sets": ("train.lr=0.01",), "run_dir": tmp_path / "run", "register": "reader", "workers": 2,
              "gpus_per_worker": 0.5, "tracking_uri": "http://mlflow:5000", "storage_path": "s3://bucket/ray",
              "address": "ray://head:10001", "workdir": tmp_path / "work"}
    _lines_up(train.TrainRequest, values, {"resume", "overwrite", "show_progress"})
    _holds(as_shown(train.resume_command(train.TrainRequest(**values), tmp_path / "run")), (
        "--dataset demo", "--model as-reader", "--set train.lr=0.01", "--register reader",
        "--data-parallel-workers 2", "--gpus-per-worker 0.5", "--tracking-uri http://mlflow:5000",
        "--storage-path s3://bucket/ray", "--address ray://head:10001", "--resume", f"--run-dir {tmp_path / 'run'}",
        f"--workdir {tmp_path / 'work'}", f"--config {tmp_path / 'c.yaml'}", f"--data {tmp_path / 'prepared'}"))


def test_a_stopped_ensemble_resumes_with_every_field_that_shapes_it(tmp_path: Path) -> None:
    from iaa.jobs.ensemble import ensemble
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest

    values = {"sweep": "s1", "dataset": "cbt-cn", "data": tmp_path / "prepared", "top_configs": 2, "seeds": 3,
              "select": "top-p", "p": 0.4, "name": "five", "workdir": tmp_path / "work", "storage_path": "s3://b/ray",
              "workers_per_trial": 2, "gpus_per_worker": 0.25, "register": "ens", "calibrate": False,
              "address": "ray://head:10001", "tracking_uri": "http://mlflow:5000"}
    # ``members`` goes with ``sweep`` unset (one or the other); the rest say how this command shows and ends.
    _lines_up(EnsembleRequest, values, {"members", "show_progress", "verbose", "overwrite"})
    _holds(as_shown(ensemble.resume_command(EnsembleRequest(**values))), (
        "--sweep s1", "--dataset cbt-cn", f"--data {tmp_path / 'prepared'}", "--top-configs 2", "--seeds 3",
        "--select top-p", "--p 0.4", "--name five", "--workers-per-member 2", "--gpus-per-worker 0.25",
        "--storage-path s3://b/ray", "--address ray://head:10001", "--register ens", "--no-calibrate",
        "--tracking-uri http://mlflow:5000", f"--workdir {tmp_path / 'work'}"))
    given = EnsembleRequest(members=(tmp_path / "a.pt", tmp_path / "b.pt"), workdir=tmp_path / "work")
    line = as_shown(ensemble.resume_command(given))
    assert f"--members {tmp_path / 'a.pt'} --members {tmp_path / 'b.pt'}" in line and "calibrate" not in line


def test_a_stopped_distillation_resumes_with_every_field_that_shapes_it(tmp_path: Path) -> None:
    from iaa.jobs.distill import distill

    values = {"ensemble": tmp_path / "ens", "model_kind": "as-reader", "config_file": tmp_path / "c.yaml",
              "sets": ("train.lr=0.01",), "alpha": 0.3, "temperature": 2.0, "train_examples": 800,
              "run_dir": tmp_path / "student", "workdir": tmp_path / "work", "tracking_uri": "http://mlflow:5000",
              "register": "student", "teacher_workers": 2, "address": "ray://head:10001"}
    # ``data`` has no flag (the ensemble's data); a refreshed teacher is stored and reused by the resume.
    _lines_up(distill.DistillRequest, values, {"data", "refresh_teacher", "show_progress", "resume"})
    _holds(as_shown(distill.resume_command(distill.DistillRequest(**values))), (
        f"--ensemble {tmp_path / 'ens'}", "--model as-reader", f"--config {tmp_path / 'c.yaml'}",
        "--set train.lr=0.01", "--alpha 0.3", "--temperature 2", "--train-examples 800",
        f"--run-dir {tmp_path / 'student'}", "--register student", "--teacher-workers 2",
        "--address ray://head:10001", "--tracking-uri http://mlflow:5000", f"--workdir {tmp_path / 'work'}",
        "--resume"))
