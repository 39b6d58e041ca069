"""make-cloze without spaCy: recipes, writers, splits, determinism, error paths and the round trip
through ``prepare``, with the rule-based tagger of ``tests/_cloze_fake.py``."""

from __future__ import annotations

import gzip
import random
import re
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from iaa.cli import cli
from iaa.data.formats import cbt, cnn
from iaa.data import bad_input as E
from iaa.data.cloze import cbt_recipe, cnn_recipe, splits
from iaa.data.cloze.sources import TEXT, TOKENS, SourceSpec, read_documents
from iaa.data.cloze.tagging import DEFAULT_PIPELINE, SpacyTagger, decode, encode, make_units
from iaa.data.bad_input import DataError
from iaa.errors import IaaError
from iaa.jobs.own_data import make_cloze
from iaa.jobs.datasets import prepare
from tests._cloze_fake import FakeTagger, NAMES, NOUNS, article, book, make_fake

CFG = dict(valid=1, test=1, seed=3)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    path.write_bytes(gzip.compress(data, mtime=0) if path.name.endswith(".gz") else data)
    return path


def books(tmp_path: Path, n: int = 4, sentences: int = 60) -> Path:
    return write(tmp_path / "src" / "books.txt.gz", "".join(book(f"Book {i}", sentences, seed=i) for i in range(n)))


def make(style: str, sources: list[Path | str], out: Path, overwrite: bool = False, **kw) -> make_cloze.ClozeResult:
    cfg = make_cloze.ClozeConfig(style, tuple(SourceSpec.parse(str(s)) for s in sources),
                                 **{**CFG, **kw})
    return make_cloze.run(cfg, out, workers=0, tagger=make_fake, progress=False, overwrite=overwrite)


def tagged(text: str, kind: str = TOKENS):
    return FakeTagger().tag([(kind, text)])[0]


# --- recipes ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("word_type", ["NE", "CN", "V", "P"])
@pytest.mark.parametrize("stride", [1, 7, 25])
def test_cbt_questions_follow_the_recipe(word_type, stride):
    sents = tagged(book("B", 80, seed=1).split("\n", 1)[1])
    qs = list(cbt_recipe.questions(sents, word_type, random.Random(0), stride=stride))
    assert qs, "every window of this book has words of every type"
    for q in qs:
        context_words = {w for line in q.context for w in line.split()}
        assert len(q.context) == 20 and q.query.split().count("XXXXX") == 1
        assert len(q.candidates) == 10 == len(set(q.candidates)) and list(q.candidates) == sorted(q.candidates)
        assert q.answer in q.candidates and set(q.candidates) <= context_words
        pool = {"NE": NAMES, "CN": NOUNS}.get(word_type)
        if pool is not None:
            assert set(q.candidates) <= set(pool)
    # One question per window at most, and the window's query is the sentence after its context.
    assert len(qs) <= len(range(20, len(sents), stride))


def test_cbt_drops_a_question_when_the_context_has_too_few_words_of_its_type():
    few_nouns = tagged(book("B", 60, seed=2, nouns=NOUNS[:5]).split("\n", 1)[1])
    assert list(cbt_recipe.questions(few_nouns, "CN", random.Random(0))) == []
    # Named entities are completed with common nouns, as in the official CBT.
    few_names = tagged(book("B", 60, seed=2, names=NAMES[:4]).split("\n", 1)[1])
    qs = list(cbt_recipe.questions(few_names, "NE", random.Random(0)))
    assert qs and all(set(q.candidates) & set(NOUNS) for q in qs)


def test_cnn_questions_follow_the_recipe():
    sents = tagged(book("B", 200, seed=4).split("\n", 1)[1])
    qs = list(cnn_recipe.questions(sents, random.Random(0), context=10, stride=3))
    assert len(qs) > 10
    orders = set()
    for q in qs:
        ids = [e for e, _ in q.entities]
        assert ids == [f"@entity{i}" for i in range(len(ids))]
        used = {t for t in q.context + q.query if t.startswith("@entity")}
        assert used <= set(ids) and q.answer in q.context and q.query.count("@placeholder") == 1
        assert not any(re.search("[A-Z]", t) for t in q.context + q.query if not t.startswith("@"))
        names = dict(q.entities)
        orders.add(tuple(names[t] for t in dict.fromkeys(q.context) if t.startswith("@entity")))
        assert sum(len(s.words) for s in sents[q.position - 10:q.position]) >= len(q.context)
    first_seen = [tuple(names) for names in orders]
    assert len(first_seen) > 1
    # Entity numbers are permuted per question: the first entity of a document is not always @entity0.
    assert len({q.context[[t.startswith("@entity") for t in q.context].index(True)] for q in qs}) > 1


def test_tagging_survives_encoding():
    sents = tagged(book("B", 5, seed=1).split("\n", 1)[1])
    assert decode(encode(sents)) == sents and decode(encode([])) == []


# --- sources and splits ------------------------------------------------------------------------------


def test_sources_read_books_plain_text_and_folders(tmp_path):
    write(tmp_path / "a" / "x.txt", book("One", 3, seed=1) + "\n" + book("Two", 2, seed=2))
    write(tmp_path / "a" / "sub" / "y.txt.gz", article(7, seed=1))
    write(tmp_path / "a" / "ignored.md", "not text")
    docs = read_documents([SourceSpec(tmp_path / "a"), SourceSpec.parse(f"valid={tmp_path / 'a' / 'x.txt'}")])
    # ids are relative to the source; the file given a second time gets its own file id
    assert [(d.doc_id, d.kind, len(d.pieces), d.split) for d in docs] == [
        ("sub/y.txt.gz", TEXT, 2, None), ("x.txt:One", TOKENS, 3, None), ("x.txt:Two", TOKENS, 2, None),
        ("x.txt#2:One", TOKENS, 3, "valid"), ("x.txt#2:Two", TOKENS, 2, "valid")]
    assert docs[3].path == str(tmp_path / "a" / "x.txt") and docs[3].file_id == "x.txt#2"
    units = make_units(docs, pieces=2)
    assert [(u.doc, u.text.count("\n") + 1) for u in units] == [(0, 2), (1, 2), (1, 1), (2, 2), (3, 2), (3, 1), (4, 2)]


def test_splits_are_by_document_and_follow_the_seed(tmp_path):
    write(tmp_path / "b.txt", "".join(book(f"B{i}", 3, seed=i) for i in range(6)))
    docs = read_documents([SourceSpec(tmp_path / "b.txt")])
    a = splits.assign(docs, valid=2, test=1, seed=0)
    assert sorted(a) == ["test", "train", "train", "train", "valid", "valid"]
    assert a == splits.assign(docs, valid=2, test=1, seed=0)
    assert len({tuple(splits.assign(docs, valid=2, test=1, seed=s)) for s in range(10)}) > 1
    by_file = splits.assign(docs, valid=0, test=1, seed=0, split_by="file")
    assert by_file == ["test"] * 6
    with pytest.raises(IaaError, match="asks for 7 documents"):
        splits.assign(docs, valid=4, test=3, seed=0)


# --- the job: round trip, determinism --------------------------------------------------------------


def test_cbt_output_round_trips_through_prepare(tmp_path):
    result = make("cbt-ne", [books(tmp_path)], tmp_path / "out")
    assert result.documents == {"train": 2, "valid": 1, "test": 1} and result.tokens > 0
    files = sorted(p.name for p in (tmp_path / "out").glob("cbtest_*"))
    assert files == ["cbtest_NE_test_2500ex.txt", "cbtest_NE_train.txt", "cbtest_NE_valid_2000ex.txt"]
    for split, path in cbt.find_files(tmp_path / "out", "NE").items():
        examples = cbt.read(path).examples()
        assert len(examples) == result.questions[split] > 0
        ex = examples[0]
        assert len(ex.candidates) == 10 and ex.answer in ex.candidates and "XXXXX" in ex.query
    prepared = prepare.run("cbt-ne", tmp_path / "out", tmp_path / "prepared", progress=False)
    assert prepared.counts == result.questions


def test_cnn_output_round_trips_through_prepare(tmp_path):
    result = make("cnn", [books(tmp_path, sentences=120)], tmp_path / "out", context=10)
    assert set(result.questions) == {"train", "valid", "test"}
    read = cnn.read(tmp_path / "out")
    assert {s: len(c.examples()) for s, c in read.items()} == result.questions
    for ex in read["train"].examples():
        assert ex.answer in ex.candidates and "@placeholder" in ex.query
    prepared = prepare.run("cnn", tmp_path / "out", tmp_path / "prepared", progress=False)
    assert prepared.counts == result.questions


def test_plain_text_articles_make_cnn_questions(tmp_path):
    src = [write(tmp_path / "news" / f"{i}.txt", article(25, seed=i)) for i in range(3)]
    result = make("cnn", [src[0].parent], tmp_path / "out", context=8, valid=0, test=0)
    assert result.documents == {"train": 3} and result.questions["train"] >= 3


def files_of(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("style", ["cbt-cn", "cnn"])
def test_same_inputs_and_seed_give_byte_identical_outputs(tmp_path, style):
    src = books(tmp_path, sentences=100)
    make(style, [src], tmp_path / "a", context=10)
    make(style, [src], tmp_path / "b", context=10)
    make(style, [src], tmp_path / "c", context=10, seed=4)
    assert files_of(tmp_path / "a") == files_of(tmp_path / "b")
    assert files_of(tmp_path / "a") != files_of(tmp_path / "c")


@pytest.mark.parametrize("style", ["cbt-ne", "cnn"])
def test_the_same_files_give_the_same_questions_from_any_path(tmp_path, style, monkeypatch):
    src = books(tmp_path, sentences=100)
    moved = tmp_path / "elsewhere" / "deeper" / src.name
    moved.parent.mkdir(parents=True)
    moved.write_bytes(src.read_bytes())
    make(style, [src], tmp_path / "a", context=10)
    monkeypatch.chdir(moved.parent)                                 # a relative path, another folder
    make(style, [Path(src.name)], tmp_path / "b", context=10)
    make(style, [moved.parent.parent], tmp_path / "c", context=10)  # a folder source: ids relative to it
    data = {k: v for k, v in files_of(tmp_path / "a").items() if k != make_cloze.MANIFEST}
    assert data and data == {k: v for k, v in files_of(tmp_path / "b").items() if k != make_cloze.MANIFEST}
    assert len(files_of(tmp_path / "c")) == len(files_of(tmp_path / "a"))
    manifest = make_cloze.json.loads((tmp_path / "c" / make_cloze.MANIFEST).read_text())
    assert all(d.startswith("deeper/books.txt.gz:") for ds in manifest["documents"].values() for d in ds)


def test_a_split_named_on_the_source_is_kept_and_no_book_is_in_two_splits(tmp_path):
    train = books(tmp_path, n=3)
    held = write(tmp_path / "held" / "v.txt", book("Held", 40, seed=9))
    make("cbt-p", [train, f"valid={held}"], tmp_path / "out", valid=0, test=1)
    manifest = make_cloze.json.loads((tmp_path / "out" / make_cloze.MANIFEST).read_text())
    docs = manifest["documents"]
    assert docs["valid"] == ["v.txt:Held"] and len(docs["test"]) == 1 and len(docs["train"]) == 2
    assert not set(docs["train"]) & set(docs["test"])


def test_refuses_to_overwrite_a_folder_it_did_not_make(tmp_path):
    write(tmp_path / "out" / "precious.txt", "keep me")
    with pytest.raises(IaaError, match=r"refusing to write .* holds other files \(precious.txt\)"):
        make("cbt-ne", [books(tmp_path)], tmp_path / "out")
    make("cbt-ne", [books(tmp_path)], tmp_path / "made")
    make("cbt-ne", [books(tmp_path)], tmp_path / "made")  # the same questions again: remade
    with pytest.raises(IaaError, match="already holds a cloze question set .* add `overwrite`"):
        make("cbt-ne", [books(tmp_path)], tmp_path / "made", seed=1)
    make("cbt-ne", [books(tmp_path)], tmp_path / "made", seed=1, overwrite=True)  # its own output is replaced


# --- error paths -----------------------------------------------------------------------------------


def test_empty_file_is_named(tmp_path):
    empty = write(tmp_path / "empty.txt", "\n  \n")
    with pytest.raises(DataError, match=r"empty\.txt: the file is empty"):
        make("cbt-ne", [empty], tmp_path / "out")


def test_document_too_short_for_one_window(tmp_path):
    short = write(tmp_path / "short.txt", book("Tiny", 20, seed=1))
    with pytest.raises(DataError, match=r"no document is long enough.*Tiny: 20 sentence\(s\), a question needs 21"):
        make("cbt-ne", [short], tmp_path / "out", valid=0, test=0)
    # Among long ones a short document is skipped and counted.
    long = write(tmp_path / "long.txt", book("Long", 40, seed=2))
    result = make("cbt-ne", [short, long], tmp_path / "out", valid=0, test=0)
    assert result.skipped_documents == 1 and result.documents == {"train": 1}


def test_undecodable_bytes_name_the_line(tmp_path):
    bad = write(tmp_path / "bad.txt", book("B", 30, seed=1).encode().replace(b"Then", b"Th\xe9n", 3))
    with pytest.raises(DataError, match=r"bad\.txt, line 2: not UTF-8 \(byte 0xe9") as err:
        make("cbt-ne", [bad], tmp_path / "out")
    assert err.value.reason == E.NOT_UTF8


def test_missing_spacy_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)
    with pytest.raises(IaaError, match=r'pip install -e "\.\[cloze\]"'):
        SpacyTagger()


def test_cli_reports_a_missing_tagger_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy", None)
    res = CliRunner().invoke(cli, ["make-cloze", "--style", "cbt-ne", "--source", str(books(tmp_path)),
                                   "--out", str(tmp_path / "out"), "--workers", "0"])
    assert res.exit_code == 1 and 'pip install -e ".[cloze]"' in res.output and "Traceback" not in res.output
    assert not (tmp_path / "out").exists()


def test_cli_rejects_a_bad_source_argument(tmp_path):
    # make-cloze checks its spaCy pipeline before it reads any source
    spacy = pytest.importorskip("spacy", reason='spaCy is an optional extra: pip install -e ".[cloze]"')
    if not spacy.util.is_package(DEFAULT_PIPELINE):
        pytest.skip(f"the spaCy pipeline {DEFAULT_PIPELINE} is not installed")
    res = CliRunner().invoke(cli, ["make-cloze", "--style", "cnn", "--source", str(tmp_path / "nope"),
                                   "--out", str(tmp_path / "out")])
    assert res.exit_code != 0 and "no such file or folder" in res.output
