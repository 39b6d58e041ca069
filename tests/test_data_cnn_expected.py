"""prepare's `expected_test`: the prepared CNN test split held against a list of the test question
files it should hold (rc-data's official list), warning of those missing and of those not listed."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from _faults import assert_one_message, assert_says, invoke, logged
from _shared import require_shared
from iaa.data.prepared import expected_names
from iaa.data.bad_input import DataError
from iaa.jobs.datasets import prepare
from test_data_cnn import question, write_tree

BASE = {"training/a1.question": question(), "validation/b1.question": question()}


def source_with_test(root: Path, names: list[str]) -> Path:
    return write_tree(root, BASE | {f"test/{name}.question": question() for name in names})


def listing(path: Path, names: list[str]) -> Path:
    path.write_text("".join(f"{name}.question\n" for name in names))
    return path


def test_missing_and_unlisted_test_questions_are_each_warned_of(tmp_path, caplog):
    source = source_with_test(tmp_path / "cnn", ["t1", "t2", "extra"])
    expected = listing(tmp_path / "expected.txt", ["t1", "t2", "t3", "t4", "t5", "t6"])
    caplog.set_level(logging.INFO, logger="iaa")
    result = prepare.run("cnn", source, tmp_path / "out", progress=False, expected_test=expected)
    assert result.expected_test == {"listed": 6, "present": 2, "missing": 4, "unlisted": 1}
    (missing,) = logged(caplog, "WARNING", "missing (e.g.")
    assert_says(missing, "2 of the 6 questions", str(expected), "4 missing", "t3.question, t4.question, t5.question")
    assert "t6.question" not in missing                              # a few are named, not all
    (unlisted,) = logged(caplog, "WARNING", "not among those")
    assert_says(unlisted, "1 question(s)", "extra.question")


def test_a_complete_test_split_gives_no_warning_and_an_up_to_date_one_is_checked_again(tmp_path, caplog):
    source = source_with_test(tmp_path / "cnn", ["t1", "t2"])
    expected = listing(tmp_path / "expected.txt", ["t1", "t2"])
    caplog.set_level(logging.INFO, logger="iaa")
    prepare.run("cnn", source, tmp_path / "out", progress=False, expected_test=expected)
    assert not logged(caplog, "WARNING", "test:")
    assert logged(caplog, "INFO", "are all here")
    listing(expected, ["t1", "t2", "t3"])
    again = prepare.run("cnn", source, tmp_path / "out", progress=False, expected_test=expected)
    assert not again.rebuilt and again.expected_test == {"listed": 3, "present": 2, "missing": 1, "unlisted": 0}


def test_without_a_list_the_result_has_no_such_key(tmp_path):
    result = prepare.run("cnn", source_with_test(tmp_path / "cnn", ["t1"]), tmp_path / "out", progress=False)
    assert result.expected_test is None and "expected_test" not in result.fields()


@pytest.mark.parametrize("text, line, says", [
    ("a.question\nb.question c.question\n", 2, "one file name a line"),
    ("a.question\n\nb\na\n", 4, "a.question is listed twice (also on line 1)"),
    ("\n \n", None, "lists no file name"),
])
def test_a_bad_list_is_one_line_naming_it_before_any_work(tmp_path, text, line, says):
    expected = tmp_path / "expected.txt"
    expected.write_text(text)
    code, output = invoke("prepare", "--dataset", "cnn", "--source", source_with_test(tmp_path / "cnn", ["a"]),
                          "--out", tmp_path / "out", "--expected-test", expected)
    assert_one_message(code, output, str(expected) + ("" if line is None else f", line {line}"), says)
    assert not (tmp_path / "out").exists()


def test_a_list_reads_names_with_or_without_the_suffix_or_a_folder(tmp_path):
    expected = tmp_path / "expected.txt"
    expected.write_bytes(b"\xef\xbb\xbfa.question\r\nb\n  test/c.question  \n")
    assert expected_names.read_list(expected) == ["a", "b", "c"]
    assert expected_names.compare(["a", "b", "c"], ["b", "d"]) == expected_names.Completeness(3, 1, ("a", "c"), ("d",))


def test_the_list_is_for_cnn_only(tmp_path):
    expected = listing(tmp_path / "expected.txt", ["a"])
    with pytest.raises(DataError) as info:
        prepare.run("cbt-ne", tmp_path, tmp_path / "out", progress=False, expected_test=expected)
    assert_says(info.value, "`expected_test` lists CNN test question files", "cbt-ne")
    code, output = invoke("prepare", "--dataset", "demo", "--expected-test", expected)
    assert code == 2 and "--expected-test" in output and "--dataset cnn" in output


def test_the_official_list_counts_what_a_test_folder_lacks(tmp_path, caplog):
    official = expected_names.read_list(require_shared("cnn/expected_cnn_test.txt"))
    assert len(official) == 3198
    held = official[:-3] + ["not-official"]
    source = source_with_test(tmp_path / "cnn", held)
    caplog.set_level(logging.INFO, logger="iaa")
    result = prepare.run("cnn", source, tmp_path / "out", progress=False,
                         expected_test=require_shared("cnn/expected_cnn_test.txt"))
    assert result.counts["test"] == 3196
    assert result.expected_test == {"listed": 3198, "present": 3195, "missing": 3, "unlisted": 1}
    (missing,) = logged(caplog, "WARNING", "missing (e.g.")
    assert_says(missing, "3,195 of the 3,198 questions", "3 missing", *sorted(official[-3:]))
    assert logged(caplog, "WARNING", "not-official.question")
