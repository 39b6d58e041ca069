"""CNN reader: records from a folder and from the .tgz, an error naming the file for each bad input,
and archives that try to escape the target folder are rejected."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from _faults import assert_says
from iaa.data.formats import cnn
from iaa.data import bad_input as E
from iaa.data.bad_input import DataError

CONTEXT = "@entity3 met @entity0 in @entity7 ; later @entity0 left @entity3 behind ."


def question(*, url: str = "http://web.archive.org/x", context: str = CONTEXT,
             query: str = "@placeholder left @entity3 behind", answer: str = "@entity0",
             entities: str = "@entity0:Ann Lee\n@entity3:Bob\n@entity7:Paris") -> str:
    return f"{url}\n\n{context}\n\n{query}\n\n{answer}\n\n{entities}\n"


def write_tree(root: Path, files: dict[str, str | bytes]) -> Path:
    for name, text in files.items():
        path = root / "questions" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return root


def write_tgz(path: Path, files: dict[str, str | bytes], prefix: str = "cnn/questions/") -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text if isinstance(text, bytes) else text.encode()
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


GOOD = {
    "training/a1.question": question(),
    "training/a2.question": question(answer="@entity3", query="@entity0 left @placeholder behind"),
    "validation/b1.question": question(),
    "test/c1.question": question(answer="@entity7", query="they met in @placeholder"),
}


def test_folder_records_and_candidates_in_first_occurrence_order(tmp_path):
    splits = cnn.read(write_tree(tmp_path, GOOD))
    assert sorted(splits) == ["test", "train", "valid"]
    a1, a2 = splits["train"].examples()
    assert a1.example_id == "a1" and a2.example_id == "a2"
    assert a1.doc == tuple(CONTEXT.split())
    assert a1.query == ("@placeholder", "left", "@entity3", "behind")
    assert a1.candidates == ("@entity3", "@entity0", "@entity7")
    assert (a1.answer, a2.answer) == ("@entity0", "@entity3")
    assert splits["train"].answer.tolist() == [1, 0]
    assert splits["test"].examples()[0].answer == "@entity7"


def test_tgz_gives_the_same_records_as_the_folder(tmp_path):
    folder = cnn.read(write_tree(tmp_path / "f", GOOD))
    archive = cnn.read(write_tgz(tmp_path / "cnn.tgz", GOOD))
    assert {k: v.examples() for k, v in archive.items()} == {k: v.examples() for k, v in folder.items()}


BAD = {   # case -> (file, reason, the line its message names; None: a line of its own choosing)
    "missing_url_blank": (question(url="http://x\nstray"), E.MISSING_FIELD, None),
    "missing_answer": (question(answer=""), E.MISSING_FIELD, 7),
    "answer_line_left_out": ("http://x\n\n" + CONTEXT + "\n\n@placeholder left @entity3 behind\n\n@entity0:Ann Lee\n",
                             E.MISSING_FIELD, 7),
    "truncated_file": ("http://x\n\n" + CONTEXT + "\n", E.MISSING_FIELD, None),
    "bad_entity_line": (question(entities="@entity0 Ann"), E.MISSING_FIELD, 9),
    "no_placeholder": (question(query="Ann left @entity3 behind"), E.NO_PLACEHOLDER, 5),
    "answer_not_candidate": (question(answer="ann"), E.ANSWER_NOT_CANDIDATE, 7),
    "answer_not_in_document": (question(answer="@entity9"), E.ANSWER_NOT_IN_DOCUMENT, 7),
    "not_utf8": (question().encode().replace(b"met", b"m\xe9t"), E.NOT_UTF8, 3),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_each_error_names_the_file_and_reason(tmp_path, case):
    text, reason, line = BAD[case]
    write_tree(tmp_path, {"training/good.question": question(), "training/zbad.question": text})
    with pytest.raises(DataError) as info:
        cnn.read(tmp_path)
    assert info.value.reason == reason and (line is None or info.value.line == line), str(info.value)
    assert "questions/training/zbad.question" in str(info.value)
    skipped = cnn.read(tmp_path, on_error="skip")["train"]
    assert len(skipped) == 1 and dict(skipped.skipped) == {reason: 1}
    assert "zbad.question" in skipped.skip_messages[0]


@pytest.mark.parametrize("member, what", [
    ("../evil.question", "outside the target folder"),
    ("cnn/questions/training/../../../evil.question", "outside the target folder"),
    ("/etc/evil.question", "absolute path"),
])
def test_tgz_with_escaping_member_is_rejected(tmp_path, member, what):
    path = write_tgz(tmp_path / "cnn.tgz", {"cnn/questions/" + k: v for k, v in GOOD.items()} | {member: question()},
                     prefix="")
    with pytest.raises(DataError, match=what) as info:
        cnn.read(path)
    assert info.value.reason == E.UNSAFE_ARCHIVE and "cnn.tgz" in str(info.value)


def test_tgz_with_link_member_is_rejected(tmp_path):
    path = tmp_path / "cnn.tgz"
    with tarfile.open(path, "w:gz") as tar:
        link = tarfile.TarInfo("cnn/questions/training/link.question")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    with pytest.raises(DataError, match="is a link"):
        cnn.read(path)


def test_missing_source_says_what_to_give(tmp_path):
    with pytest.raises(DataError, match="questions"):
        cnn.find_source(tmp_path)


LAYOUT = {   # case -> (file, the line its message names, what the message says)
    "context_over_two_lines": (question(context="@entity3 met @entity0 in @entity7 ;\nlater @entity0 left @entity3 behind ."),
                               4, ["between the context and the query", "split over two lines"]),
    "cut_off_in_the_context": ("http://x\n\n@entity3 met @en", 5, ["missing the query", "file ends at line 3", "cut off"]),
    "second_answer": (question(answer="@entity0\n@entity3"), 8, ["blank line after the answer", "'@entity3'",
                                                                 "one answer"]),
    "names_without_a_blank": (question().replace("@entity0\n\n@entity0:", "@entity0\n@entity0:"), 8,
                              ["blank line after the answer", "start at line 9"]),
    "utf16": (question().encode("utf-16"), 1, ["UTF-16", "iconv -f UTF-16 -t UTF-8"]),
    "empty": ("", 1, ["missing the url", "holds no text"]),
}


@pytest.mark.parametrize("case", sorted(LAYOUT))
def test_a_layout_error_says_what_is_wrong_at_its_line(case):
    text, line, phrases = LAYOUT[case]
    with pytest.raises(DataError) as info:
        cnn.parse_question("q.question", text if isinstance(text, bytes) else text.encode())
    assert info.value.line == line, str(info.value)
    assert_says(info.value, "q.question", *phrases)


def test_read_question_checks_the_answer_as_prepare_does_and_keeps_the_entity_names():
    example, names = cnn.read_question("a.question", question().encode())
    assert example.answer == "@entity0" and names == {"@entity0": "Ann Lee", "@entity3": "Bob", "@entity7": "Paris"}
    for answer, says in (("@entity9", "does not occur in the document"), ("Ann", "is not an @entity token")):
        with pytest.raises(DataError) as info:
            cnn.read_question("a.question", question(answer=answer).encode())
        assert info.value.line == 7
        assert_says(info.value, "a.question", f"answer '{answer}'", says, "not among the candidates")
    with pytest.raises(DataError) as info:
        cnn.read_question("a.question", question(query="@placeholder met @placeholder").encode())
    assert info.value.line == 5 and info.value.reason == E.MANY_PLACEHOLDERS


def test_an_entity_named_twice_differently_is_refused_at_its_line():
    with pytest.raises(DataError) as info:
        cnn.read_question("a.question", question(entities="@entity0:Ann Lee\n@entity3:Bob\n@entity0:Bo").encode())
    assert info.value.line == 11
    assert_says(info.value, "a.question", "@entity0 is named twice", "'Ann Lee'", "'Bo'")


def test_a_folder_source_names_a_bad_file_by_the_path_given(tmp_path, monkeypatch):
    write_tree(tmp_path / "given" / "cnn", {"training/good.question": question(), "training/zbad.question": question(answer="")})
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as info:
        cnn.read(Path("given"))
    assert info.value.path == str(Path("given/cnn/questions/training/zbad.question"))
    assert (tmp_path / info.value.path).is_file()
    assert "given/cnn/questions/training/zbad.question" in cnn.read(Path("given"), on_error="skip")["train"].skip_messages[0]
