"""prepare: text -> shards round trip, candidate positions from words, manifest, idempotence."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from _cbt_fixtures import doc_tokens, example, sentences
from iaa.data.formats import cbt
from iaa.data.prepared import manifest as M, verify
from iaa.data.bad_input import DataError
from iaa.data.loading.loader import PreparedData
from iaa.data.prepared.shards import SCHEMA, file_sha256
from iaa.errors import IaaError
from iaa.jobs.datasets import prepare

TRAIN_NAMES = ("Anna", "Ben", "Clara", "Dan", "Emma", "Finn", "Gus", "Hana", "Ivo", "Jon")
UNSEEN = ("Quill", "Roux")  # only in the valid split: both map to <unk>


def make_cbtest(root: Path, *, bad_train: bool = False, cut_valid: bool = False) -> Path:
    """``root/CBTest/data`` with NE train (6 examples) and valid (2 examples, two unseen candidates)."""
    data = root / "CBTest" / "data"
    data.mkdir(parents=True, exist_ok=True)
    train = "".join(example(answer=c, query=f"then XXXXX saw {c} again .") for c in TRAIN_NAMES[:6])
    if bad_train:
        train += example(answer="Zoe")
    names = TRAIN_NAMES[:8] + UNSEEN
    valid = "".join(example(context=sentences(names), cands=names, answer=a) for a in UNSEEN)
    if cut_valid:
        valid += "\n".join(example().split("\n")[:7])
    (data / "cbtest_NE_train.txt").write_text(train)
    (data / "cbtest_NE_valid_2000ex.txt").write_text(valid)
    return root / "CBTest"


def decode(ids, vocab):
    return [vocab.tokens[i] for i in ids]


def test_round_trip_tokens_answers_and_candidate_positions(tmp_path):
    source = make_cbtest(tmp_path)
    out = tmp_path / "out"
    result = prepare.run("cbt-ne", source, out, min_count=2, progress=False)
    assert result.counts == {"train": 6, "valid": 2} and result.created and not result.rebuilt
    data = PreparedData.open(out)
    assert data.vocab.tokens[:3] == ("<pad>", "<unk>", "XXXXX")
    for split in ("train", "valid"):
        table = data.table(split)
        assert table.schema == SCHEMA
        originals = cbt.read(source / "data" / cbt.find_files(source, "NE")[split].name).examples()
        for row, ex in zip(table.to_pylist(), originals):
            expect = [w if w in data.vocab.tokens else "<unk>" for w in ex.doc]
            assert decode(row["doc"], data.vocab) == expect
            assert decode(row["query"], data.vocab) == [w if w in data.vocab.tokens else "<unk>" for w in ex.query]
            assert row["candidate_words"] == list(ex.candidates)
            assert row["candidate_words"][row["answer"]] == ex.answer
            assert row["doc_cand"] == [ex.candidates.index(w) if w in ex.candidates else -1 for w in ex.doc]
            assert row["doc_len"] == len(ex.doc) and row["query_len"] == len(ex.query)


def test_two_unseen_candidates_keep_distinct_positions(tmp_path):
    out = tmp_path / "out"
    prepare.run("cbt-ne", make_cbtest(tmp_path), out, progress=False)
    data = PreparedData.open(out)
    row = data.table("valid").to_pylist()[0]
    q, r = row["candidate_words"].index("Quill"), row["candidate_words"].index("Roux")
    assert row["candidates"][q] == row["candidates"][r] == 1  # both <unk>
    doc_words = [w for s in sentences(TRAIN_NAMES[:8] + UNSEEN) for w in s.split()]
    assert [i for i, c in enumerate(row["doc_cand"]) if c == q] == [i for i, w in enumerate(doc_words) if w == "Quill"]
    assert [i for i, c in enumerate(row["doc_cand"]) if c == r] == [i for i, w in enumerate(doc_words) if w == "Roux"]
    assert row["doc_cand"].count(q) > 0 and row["doc_cand"].count(r) > 0


def test_manifest_records_counts_checksums_vocab_and_reports(tmp_path, capsys, console):
    out = tmp_path / "out"
    result = prepare.run("cbt-ne", make_cbtest(tmp_path, bad_train=True, cut_valid=True), out,
                         on_error="skip", progress=False)
    assert result.skipped == {"train": 1, "valid": 0} and result.truncated == {"train": 0, "valid": 1}
    err = capsys.readouterr().err
    assert "skipped 1 bad example" in err and "answer_not_candidate" in err and "cut off" in err
    m = json.loads((out / "manifest.json").read_text())
    assert m["schema_version"] == M.SCHEMA_VERSION and m["dataset"] == "cbt-ne"
    assert m["vocab_hash"] == __import__("hashlib").sha256((out / "vocab.json").read_bytes()).hexdigest()
    assert json.loads((out / "vocab.json").read_text())[:3] == ["<pad>", "<unk>", "XXXXX"]
    assert m["splits"]["train"]["skipped"] == {"answer_not_candidate": 1}
    assert "Zoe" in m["splits"]["train"]["skipped_examples"][0]
    assert m["splits"]["valid"]["truncated"] == 1
    assert m["options"] == {"on_error": "skip", "lowercase": False, "min_count": 1, "max_vocab": None}
    hist = m["splits"]["train"]["doc_len_histogram"]
    assert sum(hist["counts"]) == 6 and hist["min"] == hist["max"] == len(doc_tokens()) == 160
    for split in ("train", "valid"):
        for shard in m["splits"][split]["shards"]:
            path = out / shard["file"]
            assert shard["file"].startswith(f"{split}/part-") and shard["sha256"] == file_sha256(path)
            assert pq.read_metadata(path).num_rows == shard["rows"]
            assert pq.read_metadata(path).row_group(0).column(1).compression == "ZSTD"
    verify.verify(out)                     # every shard, its rows and value ranges match the manifest


def test_fail_mode_raises_and_leaves_no_output(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(DataError, match="Zoe"):
        prepare.run("cbt-ne", make_cbtest(tmp_path, bad_train=True), out, progress=False)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_idempotent_until_source_or_options_change(tmp_path):
    source, out = make_cbtest(tmp_path), tmp_path / "out"
    assert prepare.run("cbt-ne", source, out, progress=False).created
    stamp = (out / "manifest.json").stat().st_mtime_ns
    again = prepare.run("cbt-ne", source, out, progress=False)
    assert not again.rebuilt and not again.created and again.counts == {"train": 6, "valid": 2}
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    assert prepare.run("cbt-ne", source, out, min_count=2, progress=False).rebuilt
    assert not prepare.run("cbt-ne", source, out, min_count=2, progress=False).rebuilt
    train = source / "data" / "cbtest_NE_train.txt"
    train.write_text(train.read_text() + example(answer="Ben"))
    changed = prepare.run("cbt-ne", source, out, min_count=2, progress=False)
    assert changed.rebuilt and not changed.created and changed.counts["train"] == 7
    (out / "train" / "part-00000.parquet").unlink()
    assert prepare.run("cbt-ne", source, out, min_count=2, progress=False).rebuilt


def test_output_does_not_depend_on_workers(tmp_path):
    source = make_cbtest(tmp_path)
    prepare.run("cbt-ne", source, tmp_path / "one", workers=1, progress=False)
    prepare.run("cbt-ne", source, tmp_path / "two", workers=2, progress=False)
    strip = lambda m: {s: [x.sha256 for x in e.shards] for s, e in m.splits.items()}  # noqa: E731
    assert strip(M.read(tmp_path / "one")) == strip(M.read(tmp_path / "two"))


def test_lowercase_and_vocab_limits(tmp_path):
    out = tmp_path / "out"
    prepare.run("cbt-ne", make_cbtest(tmp_path), out, lowercase=True, max_vocab=10, progress=False)
    data = PreparedData.open(out)
    assert len(data.vocab) == 10 and data.vocab.placeholder == "XXXXX"
    assert all(t == t.lower() for t in data.vocab.tokens if t != "XXXXX")
    row = data.table("train").to_pylist()[0]
    assert row["candidate_words"][0] == "Anna"  # words as written; ids and positions use folded words
    assert row["doc_cand"][0] == 0


def test_refuses_to_overwrite_a_foreign_folder(tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(IaaError, match=r"refusing to write .* holds other files \(notes.txt\)"):
        prepare.run("cbt-ne", make_cbtest(tmp_path), out, progress=False)
    assert (out / "notes.txt").read_text() == "keep me"


def test_ensure_prepared_names_the_prepare_command(tmp_path):
    with pytest.raises(DataError, match=r"iaa-cli prepare `dataset` cbt-cn `source` PATH `out`"):
        prepare.ensure_prepared("cbt-cn", tmp_path)
    out = tmp_path / "data" / "cbt-ne"
    prepare.run("cbt-ne", make_cbtest(tmp_path), out, progress=False)
    assert prepare.ensure_prepared("cbt-ne", tmp_path) == out


def test_cnn_prepare_keeps_entities_and_placeholder(tmp_path):
    from test_data_cnn import GOOD, write_tgz

    out = tmp_path / "out"
    result = prepare.run("cnn", write_tgz(tmp_path / "cnn.tgz", GOOD), out, min_count=5, progress=False)
    assert result.counts == {"train": 2, "valid": 1, "test": 1}
    vocab = PreparedData.open(out).vocab
    assert vocab.tokens[:3] == ("<pad>", "<unk>", "@placeholder")
    assert {"@entity0", "@entity3", "@entity7"} <= set(vocab.tokens) and "met" not in vocab.tokens


def test_bad_arguments(tmp_path):
    with pytest.raises(DataError, match="dataset"):
        prepare.run("squad", None, tmp_path / "o")
    with pytest.raises(DataError, match="on_error"):
        prepare.run("demo", None, tmp_path / "o", on_error="ignore")
    with pytest.raises(DataError, match="needs `source`"):
        prepare.run("cbt-ne", None, tmp_path / "o")
    assert not os.path.exists(tmp_path / "o")


def test_a_corpus_without_usable_training_examples_is_an_error(tmp_path):
    from iaa.data.bad_input import DataError
    from iaa.jobs.datasets import prepare

    data = tmp_path / "CBTest" / "data"
    data.mkdir(parents=True)
    for name in ("cbtest_NE_train.txt", "cbtest_NE_valid_2000ex.txt"):
        (data / name).write_text("1 a b c .\n2 d e f .\n", encoding="utf-8")  # only a cut-off example
    with pytest.raises(DataError, match="no usable training example"):
        prepare.run("cbt-ne", tmp_path / "CBTest", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_prepare_ends_with_what_it_holds_and_the_commands_that_train_on_it(tmp_path, monkeypatch) -> None:
    from click.testing import CliRunner

    from iaa.cli import cli

    monkeypatch.chdir(tmp_path)
    source = make_cbtest(tmp_path)
    done = CliRunner().invoke(cli, ["prepare", "--dataset", "cbt-ne", "--source", str(source), "--out", "out",
                                    "--workdir", "w"])
    assert done.exit_code == 0, done.output
    lines = done.stderr.splitlines()
    head = next(line for line in lines if line.startswith("prepare: "))
    assert f"cbt-ne prepared in {(tmp_path / 'out').resolve()}" in head and "questions, a vocabulary of" in head
    commands = lines[lines.index("next:") + 1:]
    assert commands == [f"  iaa-cli {name} --data {tmp_path / 'out'} --workdir {tmp_path / 'w'}" for name in ("train", "tune")]
    again = CliRunner().invoke(cli, ["prepare", "--dataset", "cbt-ne", "--source", str(source), "--out", "out"])
    assert f"cbt-ne up to date in {(tmp_path / 'out').resolve()}" in again.stderr
