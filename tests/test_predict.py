"""``iaa-cli predict``: raw text in, the evaluate job's probabilities out; clear errors per line."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.data.formats import cbt
from tests._explain import tiny_checkpoint, tiny_setup
from tests._faults import assert_one_message, assert_says, small_fs


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("predict")
    prepared, ckpts = tiny_setup(root)
    return root, prepared, ckpts


def _valid_file(root: Path) -> Path:
    return root / "CBTest" / "data" / "cbtest_NE_valid_2000ex.txt"


def _invoke(args: list[str]):
    return CliRunner().invoke(cli, args)


def _predict(ckpt_args: list[str], prepared: Path, source: Path, out: Path) -> list[dict]:
    result = _invoke(["predict", *ckpt_args, "--data", str(prepared), "--input", str(source), "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _jsonl(root: Path, records: list[dict], name: str = "in.jsonl") -> Path:
    path = root / name
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _evaluated(setup, tmp_path) -> dict[str, dict[str, float]]:
    root, prepared, ckpts = setup
    out = tmp_path / "eval.parquet"
    result = _invoke(["evaluate", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--split", "valid",
                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = pq.read_table(out).to_pylist()
    return {r["example_id"]: dict(zip(r["candidate_words"], r["calibrated_probs"])) for r in rows}


def test_raw_text_and_cbt_file_match_evaluate(setup, tmp_path):
    root, prepared, ckpts = setup
    expected = _evaluated(setup, tmp_path)
    examples = cbt.read(_valid_file(root)).examples()
    source = _jsonl(tmp_path, [{"id": ex.example_id, "document": " ".join(ex.doc), "query": " ".join(ex.query),
                                "candidates": list(ex.candidates), "answer": ex.answer} for ex in examples])
    for given in (source, _valid_file(root)):
        rows = _predict(["--checkpoint", str(ckpts["iaa"])], prepared, given, tmp_path / "out.jsonl")
        assert len(rows) == len(examples) == len(expected)
        for row, ex in zip(rows, examples):
            assert row["id"] == ex.example_id
            assert row["probs"] == pytest.approx(expected[ex.example_id], abs=1e-5)
            assert row["prediction"] == max(row["probs"], key=row["probs"].get)
            assert row["correct"] == (row["prediction"] == ex.answer)


def test_a_cbt_file_cut_inside_its_last_question_says_so(setup, tmp_path):
    """As ``prepare`` does: the cut-off question is named in a warning (in --json too), the others
    are answered; a file of nothing but a cut-off question is one error."""
    root, prepared, ckpts = setup
    lines = _valid_file(root).read_text(encoding="utf-8").splitlines(keepends=True)
    cut = tmp_path / "cut.txt"
    cut.write_text("".join(lines[:30]), encoding="utf-8")                 # question 1, then 8 lines of question 2
    result = _invoke(["predict", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--input", str(cut),
                      "--out", str(tmp_path / "out.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown["examples"] == 1
    [said] = [w for w in shown["warnings"] if "cut off" in w]
    assert_says(said, f"{cut}, line 23", "the last example is cut off", "not used")
    assert "cut off" in result.stderr
    only = tmp_path / "only.txt"
    only.write_text("".join(lines[:20]), encoding="utf-8")
    refused = _invoke(["predict", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--input", str(only),
                       "--out", str(tmp_path / "none.jsonl")])
    assert refused.exit_code == 1 and not (tmp_path / "none.jsonl").exists()
    assert_says(refused.output.strip().splitlines()[-1], "no complete question", str(only), "cut off")


def test_ensemble_averages_its_members(setup, tmp_path):
    root, prepared, ckpts = setup
    other = tiny_checkpoint(prepared, tmp_path / "seed1.pt", "iaa", steps=3, seed=1)
    ens = tmp_path / "ens"
    ens.mkdir()
    (ens / "ensemble.json").write_text(json.dumps({"members": [str(ckpts["iaa"]), str(other)]}), encoding="utf-8")
    source = _valid_file(root)
    both = _predict(["--ensemble", str(ens)], prepared, source, tmp_path / "e.jsonl")
    one = _predict(["--checkpoint", str(ckpts["iaa"])], prepared, source, tmp_path / "a.jsonl")
    two = _predict(["--checkpoint", str(other)], prepared, source, tmp_path / "b.jsonl")
    for e, a, b in zip(both, one, two):
        assert e["probs"] == pytest.approx({c: (a["probs"][c] + b["probs"][c]) / 2 for c in a["probs"]}, abs=1e-6)


def test_an_ensemble_answers_at_the_temperature_its_record_holds(setup, tmp_path):
    from iaa.jobs.evaluation import calibration
    from iaa.jobs.inference import serve
    from iaa.jobs.ports import ModelSource

    root, prepared, ckpts = setup
    other = tiny_checkpoint(prepared, tmp_path / "seed1.pt", "iaa", steps=3, seed=1)
    source = _valid_file(root)
    found = {}
    for temperature in (1.0, 0.5):
        ens = tmp_path / f"ens-{temperature}"
        ens.mkdir()
        (ens / "ensemble.json").write_text(json.dumps({"members": [str(ckpts["iaa"]), str(other)],
                                                       "temperature": temperature}), encoding="utf-8")
        found[temperature] = _predict(["--ensemble", str(ens)], prepared, source, tmp_path / f"{temperature}.jsonl")
        replica = serve.Answerer.load(ModelSource("ensemble", str(ens), str(prepared)))       # what serve loads
        assert replica.predictor.temperature == temperature
    for plain, sharp in zip(found[1.0], found[0.5]):
        words = list(plain["probs"])
        expected = calibration.scaled(np.array([[plain["probs"][w] for w in words]]), 0.5)[0]
        assert [sharp["probs"][w] for w in words] == pytest.approx(expected.tolist(), abs=1e-6)
        assert sharp["prediction"] == plain["prediction"]
    assert any(max(s["probs"].values()) > max(p["probs"].values()) + 1e-3 for s, p in zip(found[0.5], found[1.0]))

    (tmp_path / "ens-0.5" / "ensemble.json").write_text(json.dumps({"members": [str(other)], "temperature": -1}),
                                                        encoding="utf-8")
    result = _invoke(["predict", "--ensemble", str(tmp_path / "ens-0.5"), "--data", str(prepared), "--input",
                      str(source), "--out", str(tmp_path / "bad.jsonl")])
    assert result.exit_code != 0
    assert_says(result.output, "ensemble.json", "temperature", "above 0")


def test_a_reader_alone_answers_at_the_temperature_its_checkpoint_holds(setup, tmp_path):
    """predict, evaluate, explain and what serve loads scale a lone reader's distributions by its
    checkpoint's temperature, keeping every answer; an ensemble of it averages the plain ones."""
    from iaa.jobs.evaluation import calibration
    from iaa.jobs.evaluation.explaining import explain
    from iaa.jobs.inference import serve
    from iaa.jobs.ports import ModelSource

    root, prepared, _ = setup
    plain = tiny_checkpoint(prepared, tmp_path / "plain.pt")
    sharp = tiny_checkpoint(prepared, tmp_path / "sharp.pt", temperature=0.2)       # the same weights
    source = _valid_file(root)
    found = {p.stem: _predict(["--checkpoint", str(p)], prepared, source, tmp_path / f"{p.stem}.jsonl")
             for p in (plain, sharp)}
    said = _invoke(["predict", "--checkpoint", str(sharp), "--data", str(prepared), "--input", str(source), "--out", "-",
                    "--json"])
    assert said.exit_code == 0 and json.loads(said.stderr.strip().splitlines()[-1])["temperature"] == 0.2
    words = [list(r["probs"]) for r in found["plain"]]
    flat = calibration.padded([[r["probs"][w] for w in ws] for r, ws in zip(found["plain"], words)])
    scaled = calibration.padded([[r["probs"][w] for w in ws] for r, ws in zip(found["sharp"], words)])
    assert np.allclose(scaled, calibration.scaled(flat, 0.2), atol=1e-6) and not np.allclose(scaled, flat, atol=1e-3)
    assert [r["prediction"] for r in found["sharp"]] == [r["prediction"] for r in found["plain"]]

    out = tmp_path / "eval.parquet"
    result = _invoke(["evaluate", "--checkpoint", str(sharp), "--data", str(prepared), "--split", "valid",
                      "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    evaluated = json.loads(result.stdout.strip().splitlines()[-1])
    assert evaluated["temperature"] == 0.2
    by_id = {r["example_id"]: r for r in pq.read_table(out).to_pylist()}
    for row, answered in zip(found["sharp"], found["plain"]):
        written = by_id[row["id"]]
        assert written["calibrated_probs"] == pytest.approx([row["probs"][w] for w in written["candidate_words"]],
                                                            abs=1e-5)
        assert written["probs"] == pytest.approx([answered["probs"][w] for w in written["candidate_words"]], abs=1e-5)
    page = explain.run(sharp, prepared, "valid", first=2, out=tmp_path / "x.html")
    assert (page.temperature, page.precision) == (0.2, evaluated["precision"])      # computed as evaluate does
    shown = page.examples
    for record in shown:
        assert record.probs == pytest.approx(by_id[record.example_id]["calibrated_probs"], abs=1e-5)
    assert serve.Answerer.load(ModelSource("checkpoint", str(sharp), str(prepared))).predictor.temperature == 0.2

    ens = tmp_path / "ens"
    ens.mkdir()
    (ens / "ensemble.json").write_text(json.dumps({"members": [str(sharp)], "temperature": 1.0}), encoding="utf-8")
    alone = _predict(["--ensemble", str(ens)], prepared, source, tmp_path / "ens.jsonl")
    assert [r["probs"] for r in alone] == [pytest.approx(r["probs"], abs=1e-6) for r in found["plain"]]


def test_unseen_candidates_stay_apart_and_absent_ones_get_zero(setup, tmp_path):
    _, prepared, ckpts = setup
    record = {"id": "x", "document": "zork went home . blip ran to the park . zork ran", "query": "XXXXX went home",
              "candidates": ["zork", "blip", "qqq"]}
    source = _jsonl(tmp_path, [record])
    result = _invoke(["predict", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--input", str(source),
                      "--out", str(tmp_path / "o.jsonl"), "--json"])
    assert result.exit_code == 0, result.output
    assert "qqq do not occur in the document" in result.stderr
    row = json.loads((tmp_path / "o.jsonl").read_text())
    assert row["probs"]["qqq"] == 0.0 and row["absent_candidates"] == ["qqq"]
    assert row["probs"]["zork"] > 0 and row["probs"]["blip"] > 0
    assert row["probs"]["zork"] != pytest.approx(row["probs"]["blip"], abs=1e-7)
    assert sum(row["probs"].values()) == pytest.approx(1.0, abs=1e-5)
    assert "correct" not in row


@pytest.mark.parametrize("bad,message", [
    ({"id": "b", "document": "a b c", "query": "no gap here", "candidates": ["a"]}, "in.jsonl:2: the query has no XXXXX"),
    ({"id": "b", "document": "a b c", "query": "XXXXX b", "candidates": []}, "in.jsonl:2: the candidate list is empty"),
    ({"id": "b", "document": "a b c", "query": "XXXXX b", "candidates": ["z"]}, "in.jsonl:2: no candidate occurs"),
    ({"id": "b", "document": "a b c", "query": "XXXXX b"}, "in.jsonl:2: missing candidates"),
    ("{not json", "in.jsonl:2: not valid JSON"),
    ('{"id": "b', "in.jsonl:2: not valid JSON (Unterminated string starting at column 8)"),
])
def test_bad_input_names_the_line(setup, tmp_path, bad, message):
    _, prepared, ckpts = setup
    good = {"id": "a", "document": "a b c", "query": "XXXXX b", "candidates": ["a", "c"]}
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(good) + "\n" + (bad if isinstance(bad, str) else json.dumps(bad)) + "\n", encoding="utf-8")
    result = _invoke(["predict", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--input", str(path),
                      "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code != 0
    assert message in result.output
    assert not (tmp_path / "o.jsonl").exists()


def test_a_cnn_question_for_a_cbt_model_names_its_query_line(setup, tmp_path):
    _, prepared, ckpts = setup
    question = tmp_path / "q1.question"
    question.write_text("http://x\n\n@entity1 met @entity2 .\n\n@placeholder met @entity2\n\n@entity1\n\n"
                        "@entity1:Ann\n@entity2:Bob\n", encoding="utf-8")
    result = _invoke(["predict", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--input", str(question),
                      "--out", str(tmp_path / "o.jsonl")])
    assert result.exit_code != 0 and "q1.question:5: the query has no XXXXX placeholder" in result.output


@pytest.mark.parametrize("name, said", [
    ("/dev/null", "its name must end with .jsonl"),                        # no JSON Lines name
    ("a-file/answers.jsonl", "cannot write it (Not a directory)"),          # a parent that is a file
    ("read-only/new/answers.jsonl", "cannot write it (Read-only file system)"),
])
def test_an_output_it_refuses_is_refused_before_any_work(setup, tmp_path, monkeypatch, name, said):
    """One line and exit 1 before the reader is loaded: nothing answered, nothing on stdout, no
    folder made."""
    from iaa.jobs.inference import predict

    root, prepared, ckpts = setup
    (tmp_path / "a-file").write_text("a file, not a folder", encoding="utf-8")

    def load(*args, **kwargs):
        raise AssertionError("the reader was loaded before `--out` was checked")

    monkeypatch.setattr(predict.Predictor, "load", load)
    out = tmp_path / name if not name.startswith("/") else Path(name)
    with contextlib.ExitStack() as stack:
        if name.startswith("read-only"):
            stack.enter_context(small_fs(tmp_path / "read-only", read_only=True))
        result = _invoke(["predict", "--checkpoint", str(ckpts["iaa"]), "--data", str(prepared), "--input",
                          str(_valid_file(root)), "--out", str(out)])
        assert not (tmp_path / "read-only" / "new").exists()
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    assert_one_message(result.exit_code, result.output, out, said)
    assert result.stdout == ""
