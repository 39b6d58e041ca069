"""CBT reader: exact records on the real official samples, and a clear error for each kind of bad input."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from _cbt_fixtures import CANDS, doc_tokens, example, sentences
from _shared import require_shared
from iaa.data import cbt
from iaa.data import errors as E
from iaa.data.errors import DataError

SAMPLES = "cbt/official-samples/data"


def naive_parse(path: Path) -> list[tuple]:
    """Reference parser: plain Python over lines. Complete examples only."""
    blocks = path.read_text(encoding="utf-8").split("\n\n")
    out = []
    for block in blocks:
        lines = block.strip("\n").split("\n")
        if len(lines) != 21:
            continue
        doc = tuple(w for line in lines[:20] for w in line.split(" ", 1)[1].split())
        query, answer, _, cands = lines[20].split(" ", 1)[1].split("\t")
        out.append((doc, tuple(query.split()), tuple(cands.split("|")), answer))
    return out


@pytest.mark.parametrize("name", ["cbtest_NE_train.txt", "cbtest_NE_valid_2000ex.txt",
                                  "cbtest_CN_train.txt", "cbtest_CN_valid_2000ex.txt"])
def test_official_samples_match_reference_and_report_cut_off_example(name):
    path = require_shared(f"{SAMPLES}/{name}")
    chunk = cbt.read(path)
    got = [(ex.doc, ex.query, ex.candidates, ex.answer) for ex in chunk.examples()]
    assert got == naive_parse(path)
    assert len(got) == 2
    assert [ex.example_id for ex in chunk.examples()] == [f"{name[:-4]}:1", f"{name[:-4]}:23"]
    assert len(chunk.truncated) == 1 and "line 45" in chunk.truncated[0] and "cut off inside line 6" in chunk.truncated[0]
    assert not chunk.skipped


def test_official_ne_valid_first_example_exact():
    ex = cbt.read(require_shared(f"{SAMPLES}/cbtest_NE_valid_2000ex.txt")).examples()[0]
    assert ex.doc[:8] == ("At", "first", "she", "would", "n't", "go", "without", "a")
    assert ex.doc[-8:] == ("Suddenly", "Polly", "gave", "a", "little", "scream", "of", "fright", ".")[1:]
    assert ex.query == ("Johnny", "XXXXX", "looked", "up", "to", "see", "a", "dog", "almost", "upon", "her", ".")
    assert ex.candidates == ("Chuck", "Johnny", "Marshhawk", "Meadows", "Polly", "Rabbit", "Skunk", "days",
                             "first", "morning")
    assert ex.answer == "Chuck"
    assert "1" not in ex.doc[:1] and "20" not in ex.doc  # line numbers are not tokens


def test_doc_cand_marks_candidate_positions_from_words(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text(example())
    chunk = cbt.read(path)
    doc = doc_tokens()
    expected = [CANDS.index(w) if w in CANDS else -1 for w in doc]
    assert chunk.doc_cand.tolist() == expected
    assert chunk.answer.tolist() == [0]


def write(tmp_path: Path, text: str | bytes, name: str = "cbtest_NE_train.txt") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def broken_cases() -> dict[str, tuple[str | bytes, str, int]]:
    """name -> (file content with one good example first, expected reason, expected file line)."""
    good = example()
    lines = example().split("\n")
    missing_line = "\n".join(lines[:6] + lines[7:])          # sentence 7 dropped
    return {
        "missing_line": (good + missing_line, E.MISSING_LINE, 22 + 7),
        "short_example": (good + "\n".join(lines[:12]) + "\n\n", E.MISSING_LINE, 22 + 13),
        "missing_field": (good + example(line21="21 then XXXXX sat down .\tAnna"), E.MISSING_FIELD, 22 + 21),
        "empty_answer": (good + example(answer=""), E.MISSING_FIELD, 22 + 21),
        "answer_not_candidate": (good + example(answer="Zoe"), E.ANSWER_NOT_CANDIDATE, 22 + 21),
        "answer_not_in_document": (good + example(answer="Kim", cands=CANDS[:9] + ("Kim",)),
                                   E.ANSWER_NOT_IN_DOCUMENT, 22 + 21),
        "no_placeholder": (good + example(query="then Anna sat down ."), E.NO_PLACEHOLDER, 22 + 21),
        "not_utf8": (good.encode() + example().replace("river number 4", "river \udcff 4").encode("utf-8", "surrogateescape"),
                     E.NOT_UTF8, 22 + 5),
    }


@pytest.mark.parametrize("case", sorted(broken_cases()))
def test_each_error_names_file_line_and_reason(tmp_path, case):
    text, reason, line = broken_cases()[case]
    path = write(tmp_path, text)
    with pytest.raises(DataError) as info:
        cbt.read(path)
    err = info.value
    assert (err.reason, err.line) == (reason, line)
    assert str(path) in str(err) and f"line {line}" in str(err)


@pytest.mark.parametrize("case", sorted(broken_cases()))
def test_skip_drops_and_counts_bad_examples(tmp_path, case):
    text, reason, _ = broken_cases()[case]
    path = write(tmp_path, (text if isinstance(text, bytes) else text.encode()) + example().encode())
    chunk = cbt.read(path, on_error="skip")
    assert len(chunk) == 2
    assert dict(chunk.skipped) == {reason: 1}
    assert len(chunk.skip_messages) == 1 and str(path) in chunk.skip_messages[0]
    assert all(ex.doc == doc_tokens() for ex in chunk.examples())


def test_cut_off_last_example_is_reported_not_an_error(tmp_path):
    cut = "\n".join(example().split("\n")[:20])  # stops inside the example, no final newline
    cut_in_line21 = example()[:-30]               # stops inside line 21
    for text in (example() + cut, example() + cut_in_line21):
        chunk = cbt.read(write(tmp_path, text))
        assert len(chunk) == 1 and len(chunk.truncated) == 1 and "line 23" in chunk.truncated[0]


def test_gzip_and_chunked_reading_give_the_same_records_and_lines(tmp_path):
    text = "".join(example(answer=c) for c in CANDS) * 3 + example(answer="Zoe")
    plain = write(tmp_path, text)
    gz = tmp_path / "cbtest_NE_train.txt.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    whole = cbt.read(plain, on_error="skip")
    chunks = [cbt.parse_chunk(raw, on_error="skip") for raw in cbt.iter_chunks(gz, chunk_bytes=2000)]
    assert len(chunks) > 5
    assert [ex for c in chunks for ex in c.examples()] == whole.examples()
    assert [m for c in chunks for m in c.skip_messages] == [m.replace(str(plain), str(gz)) for m in whole.skip_messages]
    assert "line 681" in whole.skip_messages[0]  # the 31st example's line 21


def test_find_files_by_official_names(tmp_path):
    data = tmp_path / "CBTest" / "data"
    data.mkdir(parents=True)
    for name in ("cbtest_CN_train.txt", "cbtest_CN_valid_2000ex.txt", "cbtest_CN_test_2500ex.txt.gz"):
        (data / name).write_text("")
    found = cbt.find_files(tmp_path / "CBTest", "cn")
    assert found == cbt.find_files(data, "CN")
    assert {k: v.name for k, v in found.items()} == {
        "train": "cbtest_CN_train.txt", "valid": "cbtest_CN_valid_2000ex.txt", "test": "cbtest_CN_test_2500ex.txt.gz"}
    with pytest.raises(DataError, match="cbtest_V_train"):
        cbt.find_files(tmp_path / "CBTest", "V")


def test_sentences_fixture_names_every_candidate():
    assert set(CANDS) <= set(doc_tokens(sentences()))
