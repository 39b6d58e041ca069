"""A checkpoint carries its vocabulary: ``predict`` needs nothing but the checkpoint and the questions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.data import cbt
from iaa.data.manifest import read
from iaa.jobs import checkpoint, resolve
from iaa.jobs import train as train_job
from tests._tiny import TINY_SETS, make_tiny_prepared


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(prepared folder, best checkpoint of a short run, a JSON Lines file of its valid questions)."""
    root = tmp_path_factory.mktemp("self-contained")
    prepared = make_tiny_prepared(root / "data")
    cfg = resolve.job_config("cbt-ne", prepared, sets=(*TINY_SETS, "train.max_epochs=1"))
    best = Path(train_job.run(cfg, prepared, root / "run", show_progress=False)["checkpoint"])
    examples = cbt.read(root / "data" / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt").examples()
    questions = root / "questions.jsonl"
    questions.write_text("".join(json.dumps({"id": ex.example_id, "document": " ".join(ex.doc),
                                             "query": " ".join(ex.query), "candidates": list(ex.candidates),
                                             "answer": ex.answer}) + "\n" for ex in examples), encoding="utf-8")
    return prepared, best, questions


def _predict(args: list[str]) -> list[dict]:
    result = CliRunner().invoke(cli, ["predict", *args, "--json"])
    assert result.exit_code == 0, result.output
    out = Path(args[args.index("--out") + 1])
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def test_a_checkpoint_carries_the_vocabulary_it_was_trained_on(trained) -> None:
    prepared, best, _ = trained
    card = checkpoint.load(best)["vocab"]
    assert hashlib.sha256(card["json"].encode("utf-8")).hexdigest() == read(prepared)["vocab_hash"]


def test_predict_works_from_an_empty_folder_with_only_the_checkpoint(trained, tmp_path, monkeypatch) -> None:
    prepared, best, questions = trained
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    monkeypatch.delenv("IAA_WORKDIR", raising=False)
    alone = _predict(["--checkpoint", str(best), "--input", str(questions), "--out", "A.jsonl"])
    with_data = _predict(["--checkpoint", str(best), "--data", str(prepared), "--input", str(questions),
                          "--out", str(tmp_path / "B.jsonl")])
    assert len(alone) == len(questions.read_text().splitlines()) > 0
    assert alone == with_data
    assert sorted(p.name for p in empty.iterdir()) == ["A.jsonl"]     # nothing else written: no workdir


def test_an_old_checkpoint_without_a_vocabulary_needs_its_data(trained, tmp_path) -> None:
    prepared, best, questions = trained
    state = checkpoint.load(best)
    del state["vocab"]
    old = checkpoint.save(tmp_path / "old.pt", state)
    result = CliRunner().invoke(cli, ["predict", "--checkpoint", str(old), "--input", str(questions),
                                      "--out", str(tmp_path / "A.jsonl"), "--workdir", str(tmp_path / "w")])
    assert result.exit_code == 1 and "carries no vocabulary" in result.output and "--data" in result.output
    rows = _predict(["--checkpoint", str(old), "--data", str(prepared), "--input", str(questions),
                     "--out", str(tmp_path / "B.jsonl")])
    assert len(rows) == len(questions.read_text().splitlines())
