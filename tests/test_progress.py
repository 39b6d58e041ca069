"""Waiting with a sign: evaluate and predict show a bar on stderr, with ``--json`` too (it changes
stdout only), and ``--quiet`` turns every bar and progress line off; a data-parallel run's rank 0
carries its bar to the worker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa.cli.group import cli
from tests._explain import tiny_checkpoint
from tests._tiny import make_tiny_prepared


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("progress")
    tiny = make_tiny_prepared(folder / "tiny")
    return tiny, tiny_checkpoint(tiny, folder / "m.pt", seed=0)


def _evaluate(tiny: Path, ckpt: Path, tmp_path: Path, *flags: str):
    runner = CliRunner()
    result = runner.invoke(cli, [*flags, "evaluate", "--checkpoint", str(ckpt), "--data", str(tiny), "--split", "valid",
                                 "--out", str(tmp_path / "p.parquet"), "--workdir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    return result


def test_evaluate_shows_its_bar_on_stderr_with_json_and_none_with_quiet(trained, tmp_path) -> None:
    tiny, ckpt = trained
    shown = _evaluate(tiny, ckpt, tmp_path)
    assert "scoring" in shown.stderr and json.loads(shown.stdout.splitlines()[-1])["examples"] > 0
    quiet = _evaluate(tiny, ckpt, tmp_path, "--quiet")
    assert "scoring" not in quiet.stderr and json.loads(quiet.stdout.splitlines()[-1])["examples"] > 0


def test_predict_counts_every_question_it_answers(trained, tmp_path) -> None:
    from iaa.jobs.inference import predict

    tiny, ckpt = trained
    questions = tmp_path / "q.jsonl"
    rows = [{"document": "the cat sat on the mat .", "query": "the XXXXX sat", "candidates": ["cat", "mat"]}] * 70
    questions.write_text("".join(json.dumps(r) + "\n" for r in rows))
    counted: list[int] = []
    result = predict.run(questions, tmp_path / "a.jsonl", checkpoint=ckpt, data_dir=tiny, progress=counted.append)
    assert sum(counted) == result.examples == 70 and len(counted) >= 2      # more than one batch


def test_a_train_run_on_workers_gives_rank_0_its_bar(monkeypatch, tmp_path) -> None:
    from iaa.jobs.ports import WorkerData
    from iaa.jobs.training import loop

    seen = {}
    monkeypatch.setattr(loop, "fit", lambda cfg, session, *, show_progress, vocab_hash: seen.update(shown=show_progress))
    monkeypatch.setattr("iaa.jobs.training.session.ClusterSession", lambda *a, **k: object())

    class Link:
        rank, world_size = 0, 1

    import pyarrow as pa

    table = pa.table({"x": [1]})
    from iaa.jobs.config.job_config import JobConfig

    cfg = JobConfig()
    loop.fit_on_worker(cfg, Link(), WorkerData(vocab_hash="", train=table, valid=table, show_progress=True), threads=1)
    assert seen == {"shown": True}
    loop.fit_on_worker(cfg, Link(), WorkerData(vocab_hash="", train=table, valid=table), threads=1)
    assert seen == {"shown": False}                       # a sweep's trial: no bar
