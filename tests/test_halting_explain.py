"""``iaa-cli explain`` on an ACT reader: each step's halting probability and the step where
each example stopped, as the model computes them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner

from iaa.cli import cli
from iaa.data.loading.loader import PreparedData, collate
from iaa.jobs.modeling import checkpoint
from iaa.jobs.datasets import resolve
from iaa.model.reader import build_reader
from tests._tiny import TINY_SETS, make_tiny_prepared

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def act_setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("act-explain")
    prepared = make_tiny_prepared(root)
    cfg = resolve.job_config("cbt-ne", prepared, sets=TINY_SETS)
    cfg = replace(cfg, model=replace(cfg.model, steps=5, halting="act"))
    torch.manual_seed(0)
    model = build_reader(cfg.model)
    with torch.no_grad():                       # halting that differs from example to example
        model.halting_unit.proj.weight.normal_(0.0, 100.0)
        model.halting_unit.bias.fill_(-1.0)
    vocab_hash = PreparedData.open(prepared).manifest.vocab_hash
    ckpt = checkpoint.save(root / "act.pt", checkpoint.make_state(cfg, model, vocab_hash=vocab_hash))
    return prepared, ckpt


def test_explain_shows_each_steps_halting_probability_and_the_stop(act_setup, tmp_path):
    prepared, ckpt = act_setup
    args = ["explain", "--checkpoint", str(ckpt), "--data", str(prepared), "--split", "valid", "--first", "6",
            "--out", str(tmp_path / "page.html"), "--precision", "fp32"]          # as the model below computes
    result = CliRunner().invoke(cli, [*args, "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    records = json.loads(result.stdout.strip().splitlines()[-1])["examples"]
    model, _, _ = checkpoint.load_model(ckpt)
    table = PreparedData.open(prepared).table("valid")
    stops = set()
    for row, record in enumerate(records):
        with torch.no_grad():
            halting = model(collate(table.slice(row, 1))).halting
        n = int(halting.steps[0])
        stops.add(n)
        assert record["stopped_at"] == n and record["max_steps"] == 5
        assert len(record["trace"]) == n
        for t, step in enumerate(record["trace"]):
            assert step["halt_prob"] == pytest.approx(float(halting.probs[0, t]), abs=1e-6)
            assert step["weight"] == pytest.approx(float(halting.weights[0, t]), abs=1e-6)
        assert sum(step["weight"] for step in record["trace"]) == pytest.approx(1.0, abs=1e-5)
    assert len(stops) > 1, "the test needs examples that stop at different steps"
    page = (tmp_path / "page.html").read_text(encoding="utf-8")
    assert f"halted at step {records[0]['stopped_at']}" in page and "data-halt=" in page
    text = CliRunner().invoke(cli, args, catch_exceptions=False).output
    assert f"stopped at step {records[0]['stopped_at']} of 5" in text
