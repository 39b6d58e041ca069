"""Where a CNN source's questions are: the folder and archive layouts read alike, and every file
that is not read (macOS metadata, a sub-folder, a misnamed file, Daily Mail's questions) is
counted in a note that prepare says, or refused where reading on would be wrong."""

from __future__ import annotations

import logging

import pytest

from _faults import assert_says, invoke, logged
from iaa.data.formats import cnn
from iaa.data.bad_input import DataError
from iaa.jobs.datasets import prepare
from test_data_cnn import GOOD, question, write_tgz, write_tree

APPLEDOUBLE = b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        \x00\x02\x00\x00"


def records(splits):
    return {split: chunk.examples() for split, chunk in splits.items()}


@pytest.mark.parametrize("prefix", ["cnn/questions/", "cnn/", "", "rc-data/cnn/questions/"])
def test_an_archive_reads_the_split_folders_wherever_they_sit(tmp_path, prefix):
    expected = records(cnn.read(write_tree(tmp_path / "folder", GOOD)))
    layout = cnn.survey(write_tgz(tmp_path / "cnn.tgz", GOOD, prefix=prefix))
    assert layout.splits == ("train", "valid", "test") and layout.notes == ()
    assert records(cnn.read(tmp_path / "cnn.tgz")) == expected


def test_a_folder_that_holds_the_split_folders_itself_reads_as_its_archive(tmp_path):
    write_tree(tmp_path / "src", GOOD)
    flat = tmp_path / "src" / "questions"
    assert records(cnn.read(flat)) == records(cnn.read(write_tgz(tmp_path / "flat.tgz", GOOD, prefix="cnn/")))


def test_files_that_are_not_read_are_counted_in_notes_naming_some(tmp_path):
    root = write_tree(tmp_path / "cnn", GOOD | {
        "training/._a1.question": APPLEDOUBLE,
        "training/part2/n1.question": question(), "training/part2/n2.question": question(),
        "Training/t1.question": question(),
        "training/x1.QUESTION": question(), "training/x2.question.txt": question(),
        "training/README": "notes",
    })
    layout = cnn.survey(root)
    notes = dict(zip(("appledouble", "misplaced", "misnamed", "other"), layout.notes))
    assert len(layout.notes) == 4, layout.notes
    assert_says(notes["appledouble"], "1 macOS metadata file(s)", "questions/training/._a1.question", "not read")
    assert_says(notes["misplaced"], "3 .question file(s) outside the split folders", "questions/training/part2/",
                "questions/Training/")
    assert_says(notes["misnamed"], "2 file(s) named like question files", "x1.QUESTION", "x2.question.txt")
    assert_says(notes["other"], "1 other file(s)", "questions/training/README")
    assert [ex.example_id for ex in cnn.read(root)["train"].examples()] == ["a1", "a2"]


def test_prepare_says_each_note_in_a_warning(tmp_path, caplog):
    root = write_tree(tmp_path / "cnn", GOOD | {"training/._a1.question": APPLEDOUBLE,
                                                "training/part2/n1.question": question()})
    caplog.set_level(logging.INFO, logger="iaa")
    result = prepare.run("cnn", root, tmp_path / "out", progress=False)
    assert result.counts == {"train": 2, "valid": 1, "test": 1}
    assert logged(caplog, "WARNING", "1 macOS metadata file(s)")
    assert logged(caplog, "WARNING", "1 .question file(s) outside the split folders")


def test_macos_metadata_members_of_an_archive_are_skipped_and_counted(tmp_path):
    path = write_tgz(tmp_path / "cnn.tgz", GOOD | {"training/._a1.question": APPLEDOUBLE})
    layout = cnn.survey(path)
    (note,) = layout.notes
    assert_says(note, "1 macOS metadata file(s)", "cnn.tgz:cnn/questions/training/._a1.question", "COPYFILE_DISABLE=1")
    assert len(cnn.read(path)["train"]) == 2


def test_daily_mail_questions_beside_cnn_ones_are_refused(tmp_path):
    path = write_tgz(tmp_path / "cnn.tgz", {"cnn/questions/" + k: v for k, v in GOOD.items()}
                     | {"dailymail/questions/training/d1.question": question()}, prefix="")
    with pytest.raises(DataError) as info:
        cnn.survey(path)
    assert_says(info.value, "cnn.tgz", "Daily Mail questions (dailymail/questions/ (1))", "cnn/questions/ (4)",
                "another corpus")


def test_daily_mail_questions_alone_are_said_to_become_dataset_cnn(tmp_path):
    layout = cnn.survey(write_tgz(tmp_path / "dm.tgz", GOOD, prefix="dailymail/questions/"))
    assert_says(" ".join(layout.notes), "Daily Mail's questions", "prepared as dataset cnn")


@pytest.mark.parametrize("files, says", [
    ({"Training/a1.question": question(), "validation/b1.question": question()},
     ["no .question file in training/", "1 in validation/", "outside the split folders", "questions/Training/"]),
    ({"training/part2/a1.question": question(), "test/c1.question": question()},
     ["no .question file in training/", "1 in test/", "questions/training/part2/"]),
])
def test_a_folder_without_training_questions_names_itself_and_what_it_holds(tmp_path, files, says):
    root = write_tree(tmp_path / "cnn", files)
    with pytest.raises(DataError) as info:
        cnn.survey(root)
    assert_says(info.value, str(root / "questions"), "no training question", *says)


def test_an_archive_without_training_questions_says_what_it_holds(tmp_path):
    path = write_tgz(tmp_path / "cnn.tgz", {"Training/a1.question": question(), "test/c1.question": question()})
    code, output = invoke("prepare", "--dataset", "cnn", "--source", path, "--out", tmp_path / "out")
    assert code == 1 and not (tmp_path / "out").exists()
    (line,) = [text for text in output.splitlines() if text.startswith("Error:")]
    assert_says(line, str(path), "no .question member in a training/ folder", "1 in test/",
                "cnn.tgz:cnn/questions/Training/")


def test_an_archive_name_in_capitals_is_read_and_another_file_is_named(tmp_path):
    upper = write_tgz(tmp_path / "CNN.TGZ", GOOD)
    assert cnn.survey(upper).splits == ("train", "valid", "test")
    other = tmp_path / "cnn.zip"
    other.write_bytes(b"PK")
    with pytest.raises(DataError) as info:
        cnn.find_source(other)
    assert_says(info.value, "cnn.zip", "not one of the archives read", ".tgz")
