"""``predict``, ``explain`` and the served answers say how much of a question the vocabulary does not
know, and warn when the answer rests on its gaps; ``predict`` says how many questions had answers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from _faults import assert_says
from iaa.cli import cli
from iaa.data.formats import cbt
from iaa.jobs.evaluation import unknowns
from iaa.jobs.evaluation.predictor import Predictor
from iaa.data.prepared.manifest import vocab_card
from iaa.data.formats.raw_text import read_input
from iaa.jobs.modeling import checkpoint
from tests._explain import tiny_setup


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("unknowns")
    prepared, ckpts = tiny_setup(root)
    ckpt = ckpts["iaa"]
    checkpoint.save(ckpt, {**checkpoint.load(ckpt), "vocab": vocab_card(prepared)})   # as training saves it
    return root, prepared, ckpts


def _questions(root: Path, path: Path, answers: int = 3) -> Path:
    """Three questions: the first two from the valid split, the third made of words no vocabulary
    holds; only the first ``answers`` give their answer."""
    ex = cbt.read(root / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt").examples()[:2]
    records = [{"id": e.example_id, "document": " ".join(e.doc), "query": " ".join(e.query),
                "candidates": list(e.candidates), "answer": e.answer} for e in ex]
    strange = [f"qzx{i}" for i in range(12)]
    records.append({"id": "strange", "document": " ".join(strange + ["the"]), "query": "the XXXXX",
                    "candidates": strange[:3], "answer": strange[0]})
    for i, r in enumerate(records):
        if i >= answers:
            del r["answer"]
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_share_and_candidates_of_a_row():
    info = unknowns.of_row([1, 5, 1, 7], [1, 5], ["zz", "cat"])
    assert info == {"unknown_share": 0.5, "unknown_candidates": ["zz"]}
    assert "vocabulary's gaps" in unknowns.warning("q", info)
    assert unknowns.warning("q", unknowns.of_row([1, 5, 6], [5], ["cat"])) is None    # exactly a third: no warning
    assert unknowns.of_row([], [], [])["unknown_share"] == 0.0


def test_predict_rows_carry_unknown_words_and_warn(setup, tmp_path):
    root, prepared, ckpts = setup
    source = _questions(root, tmp_path / "q.jsonl")
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(cli, ["predict", "--checkpoint", str(ckpts["iaa"]), "--input", str(source),
                                   "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert all({"id", "prediction", "probs", "unknown_share", "unknown_candidates"} <= set(r) for r in rows)
    assert rows[2]["unknown_share"] > unknowns.UNKNOWN_WARN_SHARE and len(rows[2]["unknown_candidates"]) == 3
    assert "warning" in rows[2] and all("warning" not in r for r in rows[:2])
    assert rows[0]["unknown_share"] < unknowns.UNKNOWN_WARN_SHARE
    result = json.loads(res.stdout.strip().splitlines()[-1])
    assert any("strange" in w and "vocabulary's gaps" in w for w in result["warnings"])
    assert result["unknown_questions"] == 1


def test_predict_says_how_many_questions_had_answers(setup, tmp_path):
    root, prepared, ckpts = setup
    source = _questions(root, tmp_path / "q.jsonl", answers=2)
    res = CliRunner().invoke(cli, ["predict", "--checkpoint", str(ckpts["iaa"]), "--input", str(source),
                                   "--out", str(tmp_path / "o.jsonl")])
    assert res.exit_code == 0, res.output
    assert "questions_with_answers: 2" in res.output
    assert_says(res.output, "2 of 3 questions", "give an answer")
    assert "noise" in res.output                         # 2 questions: a ±30-point interval


def test_served_answers_carry_the_same_keys(setup):
    root, prepared, ckpts = setup
    predictor = Predictor.load([ckpts["iaa"]])
    questions = read_input(_questions(root, root / "served.jsonl"), predictor.vocab.placeholder)
    rows = predictor.predict(questions)
    assert rows[2]["unknown_candidates"] and "warning" in rows[2]


def test_explain_reports_unknown_words(setup, tmp_path):
    root, prepared, ckpts = setup
    source = _questions(root, tmp_path / "q.jsonl")
    res = CliRunner().invoke(cli, ["explain", "--checkpoint", str(ckpts["iaa"]), "--input", str(source),
                                   "--out", str(tmp_path / "e.html"), "--json"])
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout.strip().splitlines()[-1])
    strange = [r for r in result["examples"] if r["example_id"] == "strange"][0]
    assert strange["unknown_share"] > unknowns.UNKNOWN_WARN_SHARE and strange["unknown_candidates"]
    assert any("vocabulary's gaps" in w for w in result["warnings"])
    text = CliRunner().invoke(cli, ["explain", "--checkpoint", str(ckpts["iaa"]), "--input", str(source),
                                    "--out", str(tmp_path / "f.html")])
    assert "of the document unknown" in text.output and "vocabulary's gaps" in text.output
