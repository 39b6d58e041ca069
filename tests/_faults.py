"""Shared pieces of the fault suites: a small prepared dataset, a checkpoint, a tracking store
with one run, one-message assertions, byte snapshots, and small file systems that are full or
read-only."""

from __future__ import annotations

import contextlib
import hashlib
import json
import subprocess
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import CliRunner

from _cbt_fixtures import write_source
from iaa import cli

TINY_MODEL = ("model.embed_dim=16", "model.hidden_dim=8", "model.state_dim=12", "model.gate_dim=10", "model.steps=1")


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Exit code and output (stdout, then stderr) of one command; a traceback fails the test."""
    result = CliRunner().invoke(cli.cli, [str(a) for a in args], env=env)
    assert not (result.exception and not isinstance(result.exception, SystemExit)), result.exc_info
    return result.exit_code, result.output


def assert_one_message(code: int, output: str, *parts: object) -> None:
    """Exit 1 and exactly one ``Error:`` line that holds every part."""
    assert code == 1, output
    lines = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    for part in parts:
        assert str(part) in lines[0], (part, lines[0])


def assert_says(said: BaseException | str, *parts: object) -> None:
    """An expected error (what the CLI shows as its one ``Error:`` line): one line holding every
    part; or a text (a console line, a log) that holds every part."""
    from iaa.errors import IaaError

    message = str(said)
    if isinstance(said, BaseException):
        assert isinstance(said, IaaError) and "\n" not in message, message
    for part in parts:
        assert str(part) in message, (part, message)


def logged(caplog, level: str, phrase: str) -> list[str]:
    """The messages of ``iaa``'s records at ``level`` ("INFO", "WARNING") that hold ``phrase``."""
    return [r.getMessage() for r in caplog.records
            if r.name.startswith("iaa") and r.levelname == level and phrase in r.getMessage()]


def as_shown(text: object) -> str:
    """A job's text as ``iaa-cli`` shows it: the options it names spelled as flags."""
    from iaa.cli.flags import render
    from iaa.cli.group import cli

    return render(str(text), cli)


def snapshot(*roots: Path) -> dict[str, str]:
    """sha256 of every file under ``roots`` (or of a root that is a file)."""
    out = {}
    for root in roots:
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for p in files:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def assert_unchanged(before: dict[str, str], *roots: Path) -> None:
    """Every file of ``before`` is still there, byte for byte (new files are allowed)."""
    after = snapshot(*roots)
    changed = [p for p, digest in before.items() if after.get(p) != digest]
    assert not changed, f"changed or deleted: {changed}"


def make_prepared(root: Path) -> tuple[Path, Path]:
    """(source, prepared folder): a small CBT-NE dataset made by `iaa-cli prepare`."""
    source = write_source(root / "source")
    out = root / "prepared"
    code, output = invoke("prepare", "--dataset", "cbt-ne", "--source", source, "--out", out)
    assert code == 0, output
    return source, out


def make_checkpoint(prepared: Path, path: Path, seed: int = 0) -> Path:
    """An untrained but complete checkpoint of a tiny reader for ``prepared`` (no training needed)."""
    import torch

    from iaa.jobs.modeling import checkpoint

    from iaa.jobs.datasets import resolve
    from iaa.model.reader import build_reader

    cfg = resolve.job_config("cbt-ne", prepared, sets=[*TINY_MODEL, f"train.seed={seed}"])
    torch.manual_seed(seed)
    vocab_hash = json.loads((prepared / "manifest.json").read_text())["vocab_hash"]
    return checkpoint.save(path, checkpoint.make_state(cfg, build_reader(cfg.model), vocab_hash=vocab_hash))


def make_store(workdir: Path, experiment: str = "train-cbt-ne") -> Path:
    """``WORKDIR/mlflow.db`` holding one run with a valid_acc history; returns the database file."""
    from iaa.jobs.workdir.paths import Workdir
    from iaa.platform.tracking import connection
    from iaa.platform.tracking import store as tracking

    uri = connection.open_store(Workdir(workdir).tracking_uri())
    run = tracking.Run.start(uri, experiment, "r1", tags={"model": "iaa"})
    run.log_params({"train": {"batch_size": 32}})
    for step, acc in enumerate((0.2, 0.3, 0.4), 1):
        run.log_metrics({"valid_acc": acc}, step=step)
    run.end()
    return workdir / "mlflow.db"


def questions(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def question(i: int = 1, **change: object) -> dict[str, object]:
    """One valid raw-text question whose candidates all occur in the document."""
    record: dict[str, object] = {"id": f"q{i}", "document": "Anna walked to the river . Ben sat down .",
                                 "query": "then XXXXX sat down .", "candidates": ["Anna", "Ben"], "answer": "Ben"}
    record.update(change)
    return record


@contextlib.contextmanager
def small_fs(path: Path, *, size: str = "256k", read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at ``path`` (read-only when asked); skips where mounting is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no mount command here: cannot make a small file system to fill")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(folder: Path) -> None:
    """Write into ``folder`` until its file system is full."""
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError:
            pass
