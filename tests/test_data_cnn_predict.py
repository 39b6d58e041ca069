"""A CNN question given as raw input (`predict`, `evaluate --input`, `explain --input`): a file
that prepare refuses is one `Error:` line naming the file and line, with nothing written; the
entity names a file or a record gives come back beside the prediction."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _faults import TINY_MODEL, assert_one_message, assert_says, invoke, questions
from iaa.data.formats.raw_text import InputError, read_input
from test_data_cnn import GOOD, question, write_tree

NAMES = {"@entity0": "Ann Lee", "@entity3": "Bob", "@entity7": "Paris"}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[str, ...]:
    """``--checkpoint CKPT --data DIR``: an untrained tiny reader for a small prepared CNN set."""
    import torch

    from iaa.jobs.datasets import resolve
    from iaa.jobs.modeling import checkpoint
    from iaa.model.reader import build_reader

    root = tmp_path_factory.mktemp("cnn")
    prepared = root / "prepared"
    code, output = invoke("prepare", "--dataset", "cnn", "--source", write_tree(root / "source", GOOD), "--out", prepared)
    assert code == 0, output
    cfg = resolve.job_config("cnn", prepared, sets=list(TINY_MODEL))
    torch.manual_seed(0)
    vocab_hash = json.loads((prepared / "manifest.json").read_text())["vocab_hash"]
    ckpt = checkpoint.save(root / "best.pt", checkpoint.make_state(cfg, build_reader(cfg.model), vocab_hash=vocab_hash))
    return ("--checkpoint", str(ckpt), "--data", str(prepared))


def bad_file(tmp_path: Path, answer: str) -> Path:
    path = tmp_path / "zz.question"
    path.write_text(question(answer=answer))
    return path


COMMANDS = {
    "predict": lambda model, path, out: ("predict", *model, "--input", path, "--out", out / "a.jsonl"),
    "evaluate": lambda model, path, out: ("evaluate", *model, "--input", path, "--out", out / "p.parquet"),
    "explain": lambda model, path, out: ("explain", *model, "--input", path, "--out", out / "x.html"),
}


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("answer, says", [("@entity9", "does not occur in the document"),
                                          ("Obama", "is not an @entity token")])
def test_an_answer_that_is_not_an_entity_of_the_document_is_one_line_and_nothing_is_written(
        model, tmp_path, command, answer, says):
    path = bad_file(tmp_path, answer)
    out = tmp_path / "out"
    out.mkdir()
    code, output = invoke("--workdir", tmp_path / "w", *COMMANDS[command](model, path, out))
    assert_one_message(code, output, f"{path}, line 7", f"answer '{answer}'", says)
    assert list(out.iterdir()) == []


def test_read_input_refuses_it_as_prepare_does(tmp_path):
    with pytest.raises(InputError) as info:
        read_input(bad_file(tmp_path, "@entity9"), "@placeholder")
    assert_says(info.value, str(tmp_path / "zz.question"), "line 7", "not among the candidates")


def answers(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_question_file_gives_the_prediction_its_name(model, tmp_path):
    path = tmp_path / "q.question"
    path.write_text(question())
    code, output = invoke("predict", *model, "--input", path, "--out", tmp_path / "a.jsonl")
    assert code == 0, output
    (row,) = answers(tmp_path / "a.jsonl")
    assert row["prediction_name"] == NAMES[row["prediction"]]
    assert list(row)[:3] == ["id", "prediction", "prediction_name"]
    assert {"probs", "correct", "absent_candidates", "unknown_share"} <= set(row)


def test_the_explain_page_and_json_give_the_entities_real_names(model, tmp_path):
    """A CNN question file names its entities: the explain page shows each candidate's name beside
    it and in its words' tooltips, and ``--json`` gives them (``entity_names``)."""
    path = tmp_path / "q.question"
    path.write_text(question())
    code, output = invoke("explain", *model, "--input", path, "--out", tmp_path / "x.html", "--json")
    assert code == 0, output
    (record,) = json.loads(output[output.index("{"):])["examples"]
    assert record["entity_names"] == {word: NAMES[word] for word in record["candidates"] if word in NAMES} != {}
    page = (tmp_path / "x.html").read_text()
    for word, name in record["entity_names"].items():
        assert f'<td>{word}<span class="name">{name}</span>' in page
        assert f'title="{name}: ' in page


def test_json_lines_records_may_carry_entity_names(model, tmp_path):
    record = {"id": "r1", "document": question().split("\n")[2], "query": "@placeholder left @entity3 behind",
              "candidates": ["@entity3", "@entity0", "@entity7"]}
    path = questions(tmp_path / "q.jsonl", [{**record, "entities": NAMES}, {**record, "id": "r2"},
                                            {**record, "id": "r3", "entities": {"@entity99": "Nobody"}}])
    code, output = invoke("predict", *model, "--input", path, "--out", tmp_path / "a.jsonl")
    assert code == 0, output
    named, plain, unnamed = answers(tmp_path / "a.jsonl")
    assert named["prediction_name"] == NAMES[named["prediction"]]
    assert "prediction_name" not in plain
    assert unnamed["prediction_name"] is None
    assert "are not read" not in output


@pytest.mark.parametrize("entities, says", [(["Ann"], "entities must be an object of names"),
                                            ({"@entity0": 3}, "entities[\"@entity0\"] must be a string")])
def test_bad_entity_names_are_one_line_naming_the_record(model, tmp_path, entities, says):
    path = questions(tmp_path / "q.jsonl", [{"document": "@entity0 met @entity1 .", "query": "@placeholder met",
                                             "candidates": ["@entity0", "@entity1"], "entities": entities}])
    code, output = invoke("predict", *model, "--input", path, "--out", tmp_path / "a.jsonl")
    assert_one_message(code, output, f"{path}:1", says)
    assert not (tmp_path / "a.jsonl").exists()
