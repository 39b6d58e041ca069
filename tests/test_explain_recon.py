"""explain and predict on real book text (the shared cbt-recon questions)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.jobs.datasets import prepare
from tests._explain import tiny_checkpoint
from tests._shared import require_shared

pytestmark = pytest.mark.slow


def test_explain_and_predict_on_cbt_recon(tmp_path):
    source = require_shared("cbt-recon/CBTest")
    prepared = tmp_path / "prepared"
    prepare.run("cbt-ne", source, prepared, progress=False)
    ckpt = tiny_checkpoint(prepared, tmp_path / "iaa.pt", "iaa", steps=3)
    runner = CliRunner()
    result = runner.invoke(cli, ["explain", "--checkpoint", str(ckpt), "--data", str(prepared), "--first", "2",
                                 "--out", str(tmp_path / "page.html"), "--png", str(tmp_path / "fig.png"), "--json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout.strip().splitlines()[-1])["examples"]
    assert [len(r["trace"]) for r in records] == [3, 3]
    assert all(len(r["doc_tokens"]) == len(r["trace"][0]["doc_attention"]) > 100 for r in records)

    valid = source / "data" / "cbtest_NE_valid_2000ex.txt"
    result = runner.invoke(cli, ["predict", "--checkpoint", str(ckpt), "--data", str(prepared), "--input", str(valid),
                                 "--out", str(tmp_path / "p.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    predicted = json.loads(result.stdout.strip().splitlines()[-1])
    result = runner.invoke(cli, ["evaluate", "--checkpoint", str(ckpt), "--data", str(prepared), "--split", "valid",
                                 "--out", str(tmp_path / "e.parquet"), "--json"])
    evaluated = json.loads(result.stdout.strip().splitlines()[-1])
    assert predicted["examples"] == evaluated["examples"] == 2000
    assert predicted["accuracy"] == pytest.approx(evaluated["accuracy"], abs=1 / 2000)
