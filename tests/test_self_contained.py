"""A checkpoint carries its vocabulary: ``predict`` needs nothing but the checkpoint and the questions."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.data.formats import cbt
from iaa.data.prepared.manifest import read
from iaa.jobs.modeling import checkpoint
from iaa.jobs.datasets import resolve
from iaa.jobs.train import train as train_job
from tests._tiny import TINY_SETS, make_tiny_prepared


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(prepared folder, best checkpoint of a short run, a JSON Lines file of its valid questions)."""
    root = tmp_path_factory.mktemp("self-contained")
    prepared = make_tiny_prepared(root / "data")
    cfg = resolve.job_config("cbt-ne", prepared, sets=(*TINY_SETS, "train.max_epochs=1"))
    best = Path(train_job.run(cfg, prepared, root / "run", show_progress=False).checkpoint)
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
    assert hashlib.sha256(card["json"].encode("utf-8")).hexdigest() == read(prepared).vocab_hash


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


def test_evaluate_and_explain_of_questions_take_an_old_checkpoints_vocabulary_from_its_data(trained, tmp_path) -> None:
    prepared, best, questions = trained
    state = checkpoint.load(best)
    del state["vocab"]
    old = checkpoint.save(tmp_path / "old.pt", state)
    work = ["--workdir", str(tmp_path / "w")]
    for command in (["evaluate", "--out", str(tmp_path / "p.parquet")], ["explain", "--first", "2"]):
        alone = CliRunner().invoke(cli, [*command, "--checkpoint", str(old), "--input", str(questions), *work])
        assert alone.exit_code == 1 and "carries no vocabulary" in alone.output, alone.output
        lent = CliRunner().invoke(cli, [*command, "--checkpoint", str(old), "--input", str(questions),
                                        "--data", str(prepared), *work, "--json"])
        assert lent.exit_code == 0, lent.output
        got, new = json.loads(lent.stdout.splitlines()[-1]), CliRunner().invoke(
            cli, [*command, "--checkpoint", str(best), "--input", str(questions), *work, "--json"])
        assert new.exit_code == 0, new.output
        key = "accuracy" if command[0] == "evaluate" else "examples"
        assert got[key] == json.loads(new.stdout.splitlines()[-1])[key]      # the same vocabulary, the same answers
    assert pq.read_table(tmp_path / "p.parquet").num_rows == len(questions.read_text().splitlines())


def _without_answer(questions: Path, line: int, dest: Path) -> dict:
    """A copy of ``questions`` at ``dest`` whose question on ``line`` (from 1) gives no answer; that question."""
    lines = questions.read_text(encoding="utf-8").splitlines()
    unanswered = json.loads(lines[line - 1])
    del unanswered["answer"]
    lines[line - 1] = json.dumps(unanswered)
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return unanswered


def _in_empty_folder(tmp_path: Path, monkeypatch) -> Path:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    monkeypatch.delenv("IAA_WORKDIR", raising=False)
    return empty


def test_evaluate_scores_a_questions_file_from_an_empty_folder_as_it_scores_the_split(trained, tmp_path,
                                                                                     monkeypatch) -> None:
    import pyarrow.parquet as pq

    prepared, best, questions = trained
    empty = _in_empty_folder(tmp_path, monkeypatch)
    alone = CliRunner().invoke(cli, ["evaluate", "--checkpoint", str(best), "--input", str(questions),
                                     "--out", "P.parquet", "--json"])
    assert alone.exit_code == 0, alone.output
    assert sorted(p.name for p in empty.iterdir()) == ["P.parquet"]     # nothing else written: no workdir
    split = CliRunner().invoke(cli, ["evaluate", "--checkpoint", str(best), "--data", str(prepared), "--split",
                                     "valid", "--out", str(tmp_path / "S.parquet"), "--json"])
    assert split.exit_code == 0, split.output
    mine, theirs = json.loads(alone.stdout.splitlines()[-1]), json.loads(split.stdout.splitlines()[-1])
    assert mine["examples"] == theirs["examples"] == len(questions.read_text().splitlines())
    assert mine["accuracy"] == pytest.approx(theirs["accuracy"]) and mine["input"] == str(questions)
    by_id = {r["example_id"]: r for r in pq.read_table(tmp_path / "S.parquet").to_pylist()}
    for row in pq.read_table(empty / "P.parquet").to_pylist():
        other = by_id[row["example_id"]]
        assert (row["gold"], row["pred"], row["candidate_words"]) == (other["gold"], other["pred"],
                                                                      other["candidate_words"])
        assert row["probs"] == pytest.approx(other["probs"], abs=1e-5)


def test_evaluate_names_the_line_of_a_question_without_an_answer(trained, tmp_path, monkeypatch) -> None:
    _, best, questions = trained
    bad = tmp_path / "bad.jsonl"
    _without_answer(questions, 2, bad)
    _in_empty_folder(tmp_path, monkeypatch)
    result = CliRunner().invoke(cli, ["evaluate", "--checkpoint", str(best), "--input", str(bad), "--out", "P.parquet"])
    assert result.exit_code == 1 and f"{bad}:2: no answer" in result.output
    assert not Path("P.parquet").exists()


@pytest.mark.parametrize("args", [[], ["--split", "valid"], ["--data", "PREPARED", "--split", "valid"]])
def test_evaluate_takes_exactly_one_source_of_examples(trained, tmp_path, args) -> None:
    prepared, best, questions = trained
    args = [str(prepared) if a == "PREPARED" else a for a in args]
    inputs = [] if args == [] else ["--input", str(questions)]
    result = CliRunner().invoke(cli, ["evaluate", "--checkpoint", str(best), *inputs, *args,
                                      "--out", str(tmp_path / "P.parquet")])
    assert result.exit_code == 2 and "--input" in result.output
    assert not (tmp_path / "P.parquet").exists()


def test_explain_draws_a_questions_file_from_an_empty_folder(trained, tmp_path, monkeypatch) -> None:
    prepared, best, questions = trained
    mixed = tmp_path / "mixed.jsonl"
    unanswered = _without_answer(questions, 1, mixed)
    second = json.loads(questions.read_text(encoding="utf-8").splitlines()[1])["id"]
    empty = _in_empty_folder(tmp_path, monkeypatch)
    result = CliRunner().invoke(cli, ["explain", "--checkpoint", str(best), "--input", str(mixed), "--first", "1",
                                      "--example-id", second, "--out", "E.html", "--json"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in empty.iterdir()) == ["E.html"]
    second_record, first_record = json.loads(result.stdout.splitlines()[-1])["examples"]   # ids first, then --first
    assert second_record["example_id"] == second and first_record["example_id"] == unanswered["id"]
    assert first_record["gold"] is None                         # the question gave no answer
    split = CliRunner().invoke(cli, ["explain", "--checkpoint", str(best), "--data", str(prepared),
                                     "--example-id", second, "--out", str(tmp_path / "S.html"), "--json"])
    assert split.exit_code == 0, split.output
    (from_split,) = json.loads(split.stdout.splitlines()[-1])["examples"]
    assert second_record["gold"] == from_split["gold"] and second_record["candidates"] == from_split["candidates"]
    assert second_record["probs"] == pytest.approx(from_split["probs"], abs=1e-5)
    text = CliRunner().invoke(cli, ["explain", "--checkpoint", str(best), "--input", str(mixed), "--first", "1",
                                    "--out", "T.html"])
    assert text.exit_code == 0 and "no answer given" in text.output


def test_predict_and_evaluate_answer_at_the_precision_asked_and_report_it(trained, tmp_path, monkeypatch) -> None:
    """``--precision`` (default auto, from the machine's probe) is what the reader multiplies in
    (its inference table is built in that dtype), and the JSON says which."""
    import torch

    from iaa.jobs.modeling import precision_policy as precision
    from iaa.jobs.evaluation.predictor import Predictor
    from iaa.data.formats.raw_text import read_input

    prepared, best, questions = trained
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        predictor = Predictor.load([best], precision=name)
        predictor.predict(read_input(questions, predictor.vocab.placeholder))
        assert predictor.models[0].kernels.table._table[1].dtype == dtype
    monkeypatch.setattr(precision, "probed_rates", lambda: {"fp32": 100.0, "bf16": 400.0})
    for command in (["predict", "--checkpoint", str(best), "--input", str(questions), "--out", str(tmp_path / "a.jsonl")],
                    ["evaluate", "--checkpoint", str(best), "--input", str(questions), "--out", str(tmp_path / "a.parquet")]):
        for flags, used in (([], "bf16"), (["--precision", "fp32"], "fp32")):
            result = CliRunner().invoke(cli, [*command, *flags, "--json"])
            assert result.exit_code == 0, result.output
            assert json.loads(result.stdout.strip().splitlines()[-1])["precision"] == used


def test_two_question_files_of_one_name_keep_their_own_predictions(trained, tmp_path) -> None:
    """``a/valid.jsonl`` and ``b/valid.jsonl``, evaluated into the work folder: neither writes over the other."""
    _, best, questions = trained
    files = []
    for folder, lines in (("a", 3), ("b", 5)):
        path = tmp_path / folder / "valid.jsonl"
        path.parent.mkdir()
        path.write_text("\n".join(questions.read_text().splitlines()[:lines]) + "\n", encoding="utf-8")
        done = CliRunner().invoke(cli, ["evaluate", "--checkpoint", str(best), "--input", str(path), "--workdir",
                                        str(tmp_path / "work"), "--json"])
        assert done.exit_code == 0, done.output
        files.append(Path(json.loads(done.stdout.splitlines()[-1])["predictions"]))
    import pyarrow.parquet as pq

    assert files[0] != files[1] and files[0].name.startswith("predictions-valid-")
    assert [pq.read_table(f).num_rows for f in files] == [3, 5]
