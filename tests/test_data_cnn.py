"""CNN reader: records from a folder and from the .tgz, an error naming the file for each bad input,
and archives that try to escape the target folder are rejected."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from iaa.data import cnn
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
