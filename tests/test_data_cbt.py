"""CBT reader: exact records on the real official samples, and a clear error for each kind of bad input."""

from __future__ import annotations

import gzip
import itertools
import re
from pathlib import Path

import pytest

from _cbt_fixtures import CANDS, doc_tokens, example, sentences
from _shared import require_shared
from iaa.data.formats import cbt
from iaa.data import bad_input as E
from iaa.data.bad_input import DataError

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
        "eleven_candidates": (good + example(cands=CANDS + ("Kim",)), E.CANDIDATE_COUNT, 22 + 21),
        "nine_candidates": (good + example(cands=CANDS[:9]), E.CANDIDATE_COUNT, 22 + 21),
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


def test_every_candidate_of_the_fixture_is_located_in_its_document(tmp_path):
    """Each of the ten candidates gets the document positions where its word stands."""
    chunk = cbt.read(write(tmp_path, example()))
    doc = doc_tokens(sentences())
    for slot, name in enumerate(CANDS):
        assert [i for i, c in enumerate(chunk.doc_cand.tolist()) if c == slot] == [
            i for i, w in enumerate(doc) if w == name]


RECON = "cbt-recon/CBTest/data"


def _recon_example(name: str, line21: int) -> str:
    """The 21 lines of one cbt-recon example that ends at file line ``line21``."""
    path = require_shared(f"{RECON}/{name}")
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = list(itertools.islice(f, line21 - 21, line21))
    return "".join(lines) + "\n"


@pytest.mark.parametrize("name, line21, answer, other", [
    ("cbtest_NE_train.txt.gz", 20525, "Tom", "TOM"),
    ("cbtest_NE_valid_2000ex.txt", 373, "Jack", "JACK"),
])
def test_lowercase_keeps_candidates_that_differ_only_in_case_apart(tmp_path, name, line21, answer, other):
    """Real cbt-recon examples whose candidates include both ``TOM`` and ``Tom``: folding case must not merge them."""
    path = write(tmp_path, _recon_example(name, line21))
    exact, folded = cbt.read(path), cbt.read(path, lowercase=True)
    (ex,) = folded.examples()
    assert ex.answer == answer and {answer, other} <= set(ex.candidates)
    assert folded.answer.tolist() == exact.answer.tolist()
    doc = exact.examples()[0].doc
    slot, other_slot = ex.candidates.index(answer), ex.candidates.index(other)
    marks = folded.doc_cand.tolist()
    assert [i for i, c in enumerate(marks) if c == slot] == [i for i, w in enumerate(doc) if w == answer]
    assert [i for i, c in enumerate(marks) if c == other_slot] == [i for i, w in enumerate(doc) if w.lower() == other.lower() and w != answer]


@pytest.mark.slow
def test_lowercase_drops_no_cbt_recon_ne_question(tmp_path):
    """All 108,719 train and 2,000 valid NE questions survive --lowercase (590 and 54 were dropped before)."""
    from iaa.jobs.datasets import prepare

    source = require_shared("cbt-recon/CBTest")
    result = prepare.run("cbt-ne", source, tmp_path / "ne", on_error="skip", lowercase=True, progress=False)
    assert result.counts == {"train": 108719, "valid": 2000}
    assert result.skipped == {"train": 0, "valid": 0}


def test_case_variants_not_spelled_like_any_candidate_go_to_the_first_one(tmp_path):
    context = sentences()
    context[0] = "TOM and Tom and tom met ."
    path = write(tmp_path, example(context=context, answer="Tom", cands=("TOM", "Tom") + CANDS[2:]))
    chunk = cbt.read(path, lowercase=True)
    assert chunk.doc_cand.tolist()[:6] == [0, -1, 1, -1, 0, -1]


def test_query_with_two_placeholders_and_duplicate_candidates_are_errors(tmp_path):
    two = example(query="XXXXX saw XXXXX .")
    dup = example(cands=CANDS[:9] + ("Anna",))
    for text, reason, what in ((two, E.MANY_PLACEHOLDERS, "2 XXXXX placeholders"),
                               (dup, E.DUPLICATE_CANDIDATE, "['Anna'] listed more than once")):
        path = write(tmp_path, example() + text)
        with pytest.raises(DataError, match=re.escape(what)) as info:
            cbt.read(path)
        assert (info.value.reason, info.value.line) == (reason, 43)
        assert dict(cbt.read(path, on_error="skip").skipped) == {reason: 1}


def test_prepare_warns_of_what_it_did_not_use_also_under_quiet_and_in_json(tmp_path):
    """Skipped examples (by reason) and a cut-off last example are warnings: shown with ``--quiet``,
    listed in ``--json``, and the counts by reason are in ``--json`` as in the manifest."""
    import json

    from click.testing import CliRunner

    from _cbt_fixtures import write_source
    from iaa.cli import cli

    source = write_source(tmp_path)
    train = source / "data" / "cbtest_NE_train.txt"
    train.write_text(example(answer="Nobody") + train.read_text(encoding="utf-8") + "1 a cut", encoding="utf-8")
    result = CliRunner().invoke(cli, ["--quiet", "prepare", "--dataset", "cbt-ne", "--source", str(source), "--out",
                                      str(tmp_path / "prepared"), "--on-error", "skip", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout.strip().splitlines()[-1])
    assert shown["skipped_reasons"] == {"train": {E.ANSWER_NOT_CANDIDATE: 1}} and shown["counts"]["train"] == 40
    skipped = [w for w in shown["warnings"] if "skipped 1 bad example" in w]
    cut = [w for w in shown["warnings"] if "cut off" in w]
    assert len(skipped) == len(cut) == 1 and E.ANSWER_NOT_CANDIDATE in skipped[0] and str(train) in cut[0]
    assert "skipped 1 bad example" in result.stderr and "cut off" in result.stderr


def test_a_cbt_file_given_as_the_source_names_the_folder_to_give(tmp_path):
    from _cbt_fixtures import write_source

    train = write_source(tmp_path) / "data" / "cbtest_NE_train.txt"
    with pytest.raises(DataError) as info:
        cbt.find_files(train, "NE")
    assert info.value.reason == E.MISSING_SOURCE
    assert str(train) in str(info.value) and f"the folder that holds it ({train.parent})" in str(info.value)
