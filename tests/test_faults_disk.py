"""Fault suite, a full disk: every writer that meets ENOSPC ends in one ``Error:`` line naming the
file, the free space and (where known) the space the file needs, and leaves nothing partial: no
half checkpoint or shard, no run folder lock, no empty run folder. A tracking or study store on a
full disk is one line too, and a failed run is marked FAILED where the store can still take it.

Small file systems are tmpfs mounts (this needs root); a writer that cannot be given one is fed
``OSError(ENOSPC)`` by a patched low-level write instead.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from _faults import assert_one_message, fill, invoke, make_store, question, questions, small_fs
from _tiny import make_tiny_prepared

ROOT = Path(__file__).resolve().parents[1]
TINY = ("model.embed_dim=16", "model.hidden_dim=8", "model.state_dim=12", "model.steps=1", "model.gate_dim=10",
        "train.batch_size=16", "train.max_epochs=0.1", "train.threads=1")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("disk"))


@pytest.fixture
def disk(tmp_path):
    """A 48 KiB tmpfs: room for a run folder's lock, not for a tiny reader's checkpoint (~100 KiB)."""
    with small_fs(tmp_path / "small", size="48k") as folder:
        yield folder


def _state(prepared: Path):
    from iaa.jobs.datasets import resolve
    from iaa.jobs.modeling import checkpoint
    from iaa.model.reader import build_reader

    cfg = resolve.job_config("cbt-ne", prepared, sets=list(TINY[:5]))
    return checkpoint.make_state(cfg, build_reader(cfg.model))


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def test_a_checkpoint_on_a_full_disk_is_one_error_and_leaves_the_old_file_alone(prepared, disk):
    from iaa.files import DiskFullError
    from iaa.jobs.modeling import checkpoint

    old = disk / "last.pt"
    old.write_bytes(b"the previous checkpoint")
    with pytest.raises(DiskFullError) as caught:
        checkpoint.save(old, _state(prepared))
    message = str(caught.value)
    assert message.startswith(f"no space left on device writing {old} (") and "\n" not in message, message
    assert " KiB free; last.pt needs about " in message, message
    assert _files(disk) == ["last.pt"] and old.read_bytes() == b"the previous checkpoint"


def test_a_run_that_fails_on_a_full_disk_leaves_no_lock_and_no_folder_it_made(disk):
    from iaa.files import DiskFullError
    from iaa.jobs.workdir import rundir

    with pytest.raises(DiskFullError), rundir.claim(disk / "run") as run_dir:
        (run_dir / "checkpoints" / ".staging-1-x").mkdir(parents=True)
        raise DiskFullError("no space left on device writing the checkpoint")
    assert _files(disk) == []


def test_a_failed_run_keeps_a_folder_that_holds_a_checkpoint_but_not_its_lock(disk):
    from iaa.files import DiskFullError
    from iaa.jobs.workdir import rundir

    with pytest.raises(DiskFullError), rundir.claim(disk / "run") as run_dir:
        (run_dir / "checkpoints").mkdir()
        (run_dir / "checkpoints" / "last.pt").write_bytes(b"complete")
        (run_dir / "metrics.jsonl").write_text("{}\n")
        raise DiskFullError("no space left on device writing the next checkpoint")
    assert _files(disk) == ["run", "run/checkpoints", "run/checkpoints/last.pt", "run/metrics.jsonl"]


@pytest.mark.parametrize("checked", [True, False], ids=["after-a-check", "before-any-check"])
def test_a_failed_train_on_workers_keeps_the_folder_naming_its_ray_run_once_it_made_a_check(tmp_path, checked):
    """``train --workers`` keeps its checkpoints in the Ray Train run's storage: the folder that
    names that run (and its checks) is what ``--resume`` continues from, so a failure keeps it."""
    from iaa.jobs.workdir import rundir
    from iaa.jobs.workdir.paths import RunFolder

    with pytest.raises(RuntimeError), rundir.claim(tmp_path / "run") as run_dir:
        RunFolder(run_dir).ray_run_file.write_text("run-0123abcd")
        if checked:
            RunFolder(run_dir).append_metrics({"checks": 1})
        raise RuntimeError("the Ray Train run lost its workers")
    kept = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert kept == (["run", "run/metrics.jsonl", "run/ray_run_name"] if checked else [])


def test_a_metrics_line_cut_by_a_full_disk_is_not_left_half_written(tmp_path, monkeypatch):
    from iaa.jobs.workdir.paths import RunFolder

    folder = RunFolder(tmp_path)
    folder.append_metrics({"step": 1})
    before = folder.metrics.read_bytes()
    real_write = os.write

    def half_then_full(fd, data):
        if len(data) > 8:
            real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(OSError):
        folder.append_metrics({"step": 2})
    monkeypatch.undo()
    assert folder.metrics.read_bytes() == before and [m["step"] for m in folder.read_metrics()] == [1]


def test_a_shard_on_a_full_disk_is_one_error_naming_it_and_no_partial_file(disk):
    import pyarrow as pa

    from iaa.data.prepared.shards import write_part
    from iaa.files import DiskFullError

    table = pa.table({"x": [os.urandom(1000) for _ in range(200)]})         # 200 KB that do not compress
    shard = disk / "train" / "part-0000.parquet"
    with pytest.raises(DiskFullError, match=f"writing {shard} \\(") as caught:
        write_part([table], shard)
    assert "\n" not in str(caught.value)
    assert _files(disk) == ["train"]


def test_a_shard_write_fed_enospc_is_one_error(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from iaa.data.prepared.shards import write_part
    from iaa.files import DiskFullError

    def full(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    shard = tmp_path / "train" / "part-0000.parquet"
    with pytest.raises(DiskFullError, match=f"no space left on device writing {shard} \\("):
        write_part([pa.table({"x": [1, 2]})], shard)
    assert _files(tmp_path) == ["train"]


def test_a_distillation_teacher_on_a_full_disk_is_one_error_and_no_partial_file(disk):
    import numpy as np
    import pyarrow as pa

    from iaa.files import DiskFullError
    from iaa.jobs.distill import teacher

    rows = 2000
    probs = np.random.default_rng(0).random((rows, 10), dtype=np.float32)   # 80 KB that hardly compress
    columns = {"example_id": [f"e{i}" for i in range(rows)], "candidate_words": [[f"w{j}" for j in range(10)]] * rows,
               teacher.TEACHER_COLUMN: probs.tolist()}
    table = pa.table({f.name: pa.array(columns[f.name], f.type) for f in teacher.SCHEMA}, schema=teacher.SCHEMA)
    path = disk / "teacher.parquet"
    with pytest.raises(DiskFullError, match=f"^no space left on device writing {path} \\(\\d+ KiB free\\)"):
        teacher.write(table, path, ensemble_dir=disk, members=[], split="train", limit=None, vocab_hash="")
    assert _files(disk) == []


def test_predictions_on_a_full_disk_say_how_much_they_need(prepared, tmp_path, disk):
    from _faults import make_checkpoint

    ckpt = make_checkpoint(prepared, tmp_path / "ckpt" / "best.pt")
    (disk / "pad").write_bytes(b"\0" * 40_000)
    records = [question(i, document="Anna walked to the river . " * 40) for i in range(200)]
    out = disk / "p.jsonl"
    code, output = invoke("predict", "--checkpoint", ckpt, "--data", prepared,
                          "--input", questions(tmp_path / "q.jsonl", records), "--out", out)
    assert_one_message(code, output, f"no space left on device writing {out} (", "KiB free; p.jsonl needs about")
    assert _files(disk) == ["pad"]


def test_a_full_tracking_store_is_one_error_naming_it(prepared, tmp_path):
    with small_fs(tmp_path / "small", size="2m") as folder:
        db = make_store(folder / "work")
        fill(folder / "work")
        code, output = invoke("train", "--data", prepared, "--run-dir", tmp_path / "run", "--workdir", folder / "work",
                              *[a for s in TINY for a in ("--set", s)])
    assert_one_message(code, output, f"no space left on device for the MLflow store {db}", "could not start the run")
    assert "[SQL:" not in output and not (tmp_path / "run").exists()


def test_a_failed_run_on_a_full_store_says_it_could_not_be_marked_failed(tmp_path):
    from iaa.errors import IaaError
    from iaa.platform.tracking import connection
    from iaa.platform.tracking import store as tracking

    with small_fs(tmp_path / "small", size="2m") as folder:
        make_store(folder)
        uri = connection.open_store(f"sqlite:///{folder / 'mlflow.db'}")
        with pytest.raises(IaaError) as caught, tracking.run_context(uri, "train-cbt-ne", "r2") as run:
            fill(folder)
            raise IaaError("no space left on device writing RUN/checkpoints/last.pt")
        status = sqlite3.connect(folder / "mlflow.db").execute(
            "SELECT status FROM runs WHERE run_uuid = ?", (run.run_id,)).fetchone()[0]
    message = str(caught.value)
    assert message.startswith("no space left on device writing RUN/checkpoints/last.pt; and the MLflow run "), message
    assert message.endswith("could not be marked FAILED (database or disk is full)") and status == "RUNNING", message


def _nearly_full(folder: Path, free: int = 96 * 1024) -> None:
    """Pad ``folder``'s file system until about ``free`` bytes are left."""
    import shutil

    (folder / "pad").write_bytes(b"\0" * max(0, shutil.disk_usage(folder).free - free))


def _free_kib(line: str) -> int:
    """The free space an Error line tells, in KiB (a MiB figure would be another, larger disk's)."""
    import re

    found = re.search(r"\((\d+) KiB free", line)
    assert found, line
    return int(found.group(1))


@pytest.mark.parametrize("command", ["train", "tune"])
def test_a_store_created_on_a_nearly_full_disk_is_one_error_naming_it_and_its_free_space(prepared, tmp_path, command):
    with small_fs(tmp_path / "small", size="256k") as folder:
        work = folder / "work"
        work.mkdir()
        _nearly_full(folder)
        flags = ("--run-dir", tmp_path / "run") if command == "train" else ("--num-samples", "1")
        code, output = invoke(command, "--data", prepared, *flags, "--workdir", work,
                              *[a for s in TINY for a in ("--set", s)])
        left = sorted(p.name for p in work.iterdir())
    assert_one_message(code, output, f"no space left on device for the MLflow store {work / 'mlflow.db'} (",
                       "could not be created")
    assert _free_kib(output) <= 256 and "[SQL:" not in output
    assert "mlflow.db" not in left                     # no half-built store, taken for a damaged one next time


def test_a_full_optuna_store_is_one_error_naming_it(tmp_path):
    from iaa.files import DiskFullError
    from iaa.platform.sweeps.studies.study_store import study_storage

    with small_fs(tmp_path / "small", size="64k") as folder:
        fill(folder)
        with pytest.raises(DiskFullError) as caught:
            study_storage(f"sqlite:///{folder / 'optuna.db'}")
    message = str(caught.value)
    assert message.startswith(f"no space left on device for the Optuna store {folder / 'optuna.db'} ("), message
    assert "could not be opened" in message and "\n" not in message, message


@pytest.mark.slow
def test_training_into_a_tiny_run_folder_is_one_line_and_a_failed_run(prepared, tmp_path, disk):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("IAA_DEBUG", None)
    run_dir = disk / "run"
    done = subprocess.run([sys.executable, "-m", "iaa.cli", "train", "--data", str(prepared), "--run-dir", str(run_dir),
                           "--workdir", str(tmp_path / "work"), *[a for s in TINY for a in ("--set", s)]],
                          capture_output=True, text=True, env=env, timeout=300)
    assert_one_message(done.returncode, done.stdout + done.stderr,
                       f"no space left on device writing {run_dir}/checkpoints/last.pt (", "last.pt needs about")
    assert "Traceback" not in done.stderr and _files(disk) == []
    statuses = sqlite3.connect(tmp_path / "work" / "mlflow.db").execute("SELECT status FROM runs").fetchall()
    assert statuses == [("FAILED",)]
