"""Fault suite, inputs: strict JSON Lines for ``iaa-cli predict``.

Lines end at ``\\n`` only; ``document`` and ``query`` are strings and ``candidates`` a list of
strings; ids are unique; an answer is one of the candidates; an empty file and undecodable bytes
are errors. Each bad input is exit 1, one ``Error:`` line naming the file and line, no output
written, and every file left as it was.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

from _faults import (assert_one_message, assert_says, assert_unchanged, invoke, make_checkpoint, make_prepared,
                     question, questions, snapshot)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("inputs")
    _, prepared = make_prepared(root)
    return prepared, make_checkpoint(prepared, root / "run" / "checkpoints" / "best.pt")


def predict(model, tmp_path: Path, input_path: Path) -> tuple[int, str]:
    prepared, ckpt = model
    return invoke("predict", "--checkpoint", ckpt, "--data", prepared, "--input", input_path,
                  "--out", tmp_path / "answers.jsonl")


BAD = {
    "candidate-list-of-lists": ([question(1, candidates=[["Anna", "Ben"], "Ben"])], 1, "candidates must be a list of strings"),
    "candidate-null": ([question(1, candidates=["Anna", None])], 1, "candidates must be a list of strings"),
    "candidates-null": ([question(1, candidates=None)], 1, "candidates must be a list of strings, got null"),
    "document-list": ([question(1, document=["Anna", "walked"])], 1, "document must be a string"),
    "query-number": ([question(1, query=3)], 1, "query must be a string"),
    "id-object": ([question(1, id={"a": 1})], 1, "id must be"),
    "answer-not-a-candidate": ([question(1, answer="Clara")], 1, "is not one of the candidates"),
    "answer-list": ([question(1, answer=["Ben"])], 1, "answer must be a string"),
    "duplicate-id": ([question(1), question(2), question(1)], 3, "also the id of line 1;"),
    "id-of-a-line-without-one": ([question(1), {k: v for k, v in question(2).items() if k != "id"}, question(3, id="2")],
                                 3, "also the id of line 2 (it has no id: its line number stands for one)"),
    "missing-candidates": ([{k: v for k, v in question(1).items() if k != "candidates"}], 1,
                           "missing candidates (a question needs document, query and candidates; id and answer"),
    "candidate-empty": ([question(1), question(2, candidates=["Anna", "Ben", ""])], 2,
                        'candidates[3]: an empty candidate ("")'),
    "candidate-blank": ([question(1, candidates=["Anna", "  ", "Ben"])], 1, 'candidates[2]: an empty candidate ("  ")'),
    "candidate-empty-in-string": ([question(1, candidates="Anna||Ben")], 1,
                                  'candidates[2] of the |-separated string: an empty candidate ("")'),
    "candidate-of-two-words": ([question(1, candidates=["Anna", "the river"])], 1,       # a phrase of the document
                               'candidates[2]: "the river" is 2 words; candidates are single words'),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_record_is_one_message_naming_file_and_line(model, tmp_path, case):
    records, line, what = BAD[case]
    path = questions(tmp_path / "q.jsonl", records)
    before = snapshot(tmp_path)
    assert_one_message(*predict(model, tmp_path, path), f"{path}:{line}", what)
    assert not (tmp_path / "answers.jsonl").exists()
    assert_unchanged(before, tmp_path)


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_an_empty_input_is_an_error(model, tmp_path, text):
    path = tmp_path / "q.jsonl"
    path.write_text(text)
    before = snapshot(tmp_path)
    assert_one_message(*predict(model, tmp_path, path), path, "no question")
    assert_unchanged(before, tmp_path)


def test_undecodable_bytes_name_the_file_and_line(model, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes((json.dumps(question(1)) + "\n").encode() + b'{"id": "q2", "document": "\xff\xfe"}\n')
    before = snapshot(tmp_path)
    assert_one_message(*predict(model, tmp_path, path), f"{path}:2", "not UTF-8")
    assert_unchanged(before, tmp_path)


def test_a_byte_order_mark_starting_the_file_is_not_part_of_the_first_record(model, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(question(i)) + "\n" for i in (1, 2)).encode())
    code, out = predict(model, tmp_path, path)
    assert code == 0, out
    assert [json.loads(line)["id"] for line in (tmp_path / "answers.jsonl").read_text().splitlines()] == ["q1", "q2"]
    path.write_bytes((json.dumps(question(1)) + "\n").encode() + b"\xef\xbb\xbf" + json.dumps(question(2)).encode())
    assert_one_message(*predict(model, tmp_path, path), f"{path}:2", "not valid JSON")       # only at the start


def test_a_line_separator_inside_a_string_is_text_not_a_line_break(model, tmp_path):
    path = tmp_path / "q.jsonl"
    record = question(1, document="Anna walked to the river .\u2028Ben sat down .")
    path.write_text(json.dumps(record, ensure_ascii=False) + "\n" + json.dumps(question(2)) + "\n", encoding="utf-8")
    code, out = predict(model, tmp_path, path)
    assert code == 0, out
    rows = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["q1", "q2"]


def test_predict_out_in_a_missing_folder_tree_under_a_file_is_one_message(model, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file, not a folder")
    path = questions(tmp_path / "q.jsonl", [question(1)])
    prepared, ckpt = model
    before = snapshot(tmp_path)
    code, out = invoke("predict", "--checkpoint", ckpt, "--data", prepared, "--input", path,
                       "--out", blocker / "sub" / "answers.jsonl")
    assert_one_message(code, out, blocker / "sub" / "answers.jsonl")
    assert_unchanged(before, tmp_path)


def test_integer_ids_and_a_candidate_string_are_still_accepted(model, tmp_path):
    path = questions(tmp_path / "q.jsonl", [question(1, id=7, candidates="Anna|Ben")])
    code, out = predict(model, tmp_path, path)
    assert code == 0, out
    assert json.loads((tmp_path / "answers.jsonl").read_text())["id"] == "7"


def test_keys_a_question_does_not_have_are_named_once_not_dropped_in_silence(model, tmp_path):
    path = questions(tmp_path / "q.jsonl", [question(1, answr="Ben"), question(2, answr="Ben", note="x")])
    code, out = predict(model, tmp_path, path)
    assert code == 0, out
    [line] = [text for text in out.splitlines() if "are not read" in text]
    assert_says(line, str(path), "'answr' (line 1), 'note' (line 2)", "keys are id, document, query, candidates, answer")


# ---- make-cloze texts ---------------------------------------------------------------------------------

def _make_cloze(source: Path, out: Path) -> None:
    from _cloze_fake import make_fake

    from iaa.data.cloze.sources import SourceSpec
    from iaa.jobs.own_data import make_cloze

    make_cloze.run(make_cloze.ClozeConfig("cbt-ne", (SourceSpec(source),)), out, workers=0, tagger=make_fake,
                   progress=False)


def test_a_book_file_of_one_title_line_names_the_file(tmp_path):
    from iaa.errors import IaaError

    book = tmp_path / "book.txt"
    book.write_text("_BOOK_TITLE_ : Alone\n")
    with pytest.raises(IaaError, match=f"{book}.*no book text"):
        _make_cloze(book, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_paragraph_longer_than_the_tagger_reads_names_the_file_and_line(tmp_path):
    from iaa.errors import IaaError

    text = tmp_path / "long.txt"
    text.write_text("A short first paragraph .\n\n" + "word " * 250_000 + "\n")
    with pytest.raises(IaaError, match=f"{text}, line 3: .*1,249,999 characters"):
        _make_cloze(text, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_make_cloze_refuses_split_sizes_its_documents_cannot_fill_before_tagging_or_ray(tmp_path, monkeypatch):
    from iaa.jobs.own_data import make_cloze
    from iaa.platform import cloze_ray

    def started(*args, **kwargs):
        raise AssertionError("the tagger (or Ray) started before the split sizes were checked")

    monkeypatch.setattr(cloze_ray, "tag", started)
    monkeypatch.setattr(make_cloze, "check_pipeline", started)
    text = tmp_path / "one.txt"
    text.write_text("Anna walked to the river . Ben sat down .\n", encoding="utf-8")
    code, output = invoke("make-cloze", "--style", "cbt-ne", "--source", text, "--out", tmp_path / "out",
                          "--valid", "5", "--test", "5", "--workdir", tmp_path / "w")
    assert_one_message(code, output, "--valid 5 --test 5", "the sources without a split have 1")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_make_cloze_refuses_its_split_sizes_in_seconds_in_its_own_process_without_ray(tmp_path):
    import os
    import subprocess
    import sys
    import time

    from _processes import process_tree

    text = tmp_path / "one.txt"
    text.write_text("Anna walked to the river . Ben sat down .\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "IAA_WORKDIR")}
    argv = [sys.executable, "-m", "iaa.cli", "make-cloze", "--style", "cbt-ne", "--source", str(text),
            "--out", str(tmp_path / "out"), "--valid", "5", "--test", "5", "--workdir", str(tmp_path / "w")]
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    commands: set[str] = set()
    while proc.poll() is None and time.monotonic() - started < 60:
        for pid in process_tree(proc.pid) - {proc.pid}:
            with contextlib.suppress(OSError):
                commands.add(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"))
        time.sleep(0.05)
    out, err = proc.communicate(timeout=120)
    took = time.monotonic() - started

    assert took < 5.0, (took, err[-2000:])
    assert not [c for c in commands if "raylet" in c or "gcs_server" in c], commands
    assert "Started a local Ray" not in err
    assert_one_message(proc.returncode, out + err, "--valid 5 --test 5", "the sources without a split have 1")
