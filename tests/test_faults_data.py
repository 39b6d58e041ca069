"""Fault suite, data within its types: a document with more candidates than int16 holds, an
archive member or a gzipped source that unpacks to far more than it weighs (a bomb), and
``iaa-cli predict --input`` records that Python's JSON reader chokes on (a lone surrogate, a
5,000-digit number, deep nesting) or that are merely large (40,000 candidates). Each is either
handled exactly or refused in one ``Error:`` line naming the file."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from _faults import assert_one_message, invoke, make_prepared, question, questions
from iaa.data.formats import cnn
from iaa.data.prepared import manifest as M
from iaa.data.cloze import sources
from iaa.data.loading.loader import PreparedData
from iaa.data.prepared.shards import file_sha256
from iaa.data.prepared.verify import verify
from test_faults_inputs import model, predict  # noqa: F401 - the fixture and how predict runs

ENTITIES = 40_000           # distinct candidates in one document: past int16's 32,767


def _cnn_question(entities: int, answer: int) -> str:
    doc = " ".join(f"@entity{i}" for i in range(entities))
    names = "\n".join(f"@entity{i}:Name {i}" for i in range(entities))
    return f"http://x\n\n{doc}\n\n@placeholder was seen\n\n@entity{answer}\n\n{names}\n"


def _write_questions(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "questions" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


@pytest.mark.timeout(300)
def test_a_document_with_40000_candidates_keeps_every_candidate_index(tmp_path):
    source = _write_questions(tmp_path / "cnn", {"training/big.question": _cnn_question(ENTITIES, ENTITIES - 7),
                                                 "validation/v.question": _cnn_question(3, 1),
                                                 "test/t.question": _cnn_question(3, 2)})
    out = tmp_path / "prepared"
    code, output = invoke("prepare", "--dataset", "cnn", "--source", source, "--out", out)
    assert code == 0, output
    data = PreparedData.open(out)
    row = data.table("train").to_pylist()[0]
    assert row["doc_cand"] == list(range(ENTITIES))          # int16 wrapped these past 32,767
    assert row["answer"] == ENTITIES - 7
    assert data.manifest.schema_version == M.SCHEMA_VERSION == 2
    verify(out)


def _as_version_1(prepared: Path) -> None:
    """Rewrite a prepared folder as schema version 1 wrote it: doc_cand as int16."""
    manifest = json.loads((prepared / M.MANIFEST).read_text())
    manifest["schema_version"] = 1
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            path = prepared / shard["file"]
            table = pq.read_table(path)
            column = table.column("doc_cand").cast(pa.list_(pa.int16()))
            pq.write_table(table.set_column(table.schema.get_field_index("doc_cand"),
                                            pa.field("doc_cand", pa.list_(pa.int16())), column), path, compression="zstd")
            shard["bytes"], shard["sha256"] = path.stat().st_size, file_sha256(path)
    (prepared / M.MANIFEST).write_text(json.dumps(manifest))


@pytest.mark.timeout(300)
def test_a_version_1_folder_with_int16_doc_cand_still_loads_and_prepare_rewrites_it(tmp_path):
    source, prepared = make_prepared(tmp_path)
    expected = PreparedData.open(prepared).table("valid").column("doc_cand").to_pylist()
    _as_version_1(prepared)
    old = PreparedData.open(prepared)
    verify(prepared)
    assert old.manifest.schema_version == 1
    assert old.table("valid").column("doc_cand").to_pylist() == expected
    assert old.table("valid").schema.field("doc_cand").type == pa.list_(pa.int32())
    code, output = invoke("prepare", "--dataset", "cbt-ne", "--source", source, "--out", prepared)
    assert code == 0, output
    assert PreparedData.open(prepared).manifest.schema_version == 2


def _bomb(path: Path, member: str, size: int) -> Path:
    """A .tgz whose one member is ``size`` zero bytes (gzip keeps it about a thousandth as large)."""
    class Zeros(io.RawIOBase):
        def __init__(self) -> None:
            self.left = size

        def readable(self) -> bool:
            return True

        def readinto(self, buffer) -> int:
            n = min(len(buffer), self.left)
            buffer[:n] = bytes(n)
            self.left -= n
            return n

    with tarfile.open(path, "w:gz", compresslevel=9) as tar:
        info = tarfile.TarInfo(member)
        info.size = size
        tar.addfile(info, io.BufferedReader(Zeros(), 1 << 20))
    return path


def test_an_archive_member_over_the_limit_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(cnn, "MAX_QUESTION_BYTES", 4096)
    archive = _bomb(tmp_path / "cnn.tgz", "cnn/questions/training/big.question", 8192)
    code, output = invoke("prepare", "--dataset", "cnn", "--source", archive, "--out", tmp_path / "out")
    assert_one_message(code, output, "cnn/questions/training/big.question", "8,192 bytes", "over the limit of 4,096")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_1_mb_tarball_holding_a_1_gib_member_is_one_line(tmp_path):
    archive = _bomb(tmp_path / "cnn.tgz", "cnn/questions/training/bomb.question", 1 << 30)
    assert archive.stat().st_size < 2 << 20
    code, output = invoke("prepare", "--dataset", "cnn", "--source", archive, "--out", tmp_path / "out")
    assert_one_message(code, output, "bomb.question", "1,073,741,824 bytes", "over the limit")


def test_a_question_file_over_the_limit_in_a_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(cnn, "MAX_QUESTION_BYTES", 4096)
    source = _write_questions(tmp_path / "cnn", {"training/big.question": "x" * 5000})
    code, output = invoke("prepare", "--dataset", "cnn", "--source", source, "--out", tmp_path / "out")
    assert_one_message(code, output, "big.question", "5,000 bytes", "over the limit of 4,096")


def test_a_gzipped_source_that_unpacks_past_the_limit_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_SOURCE_BYTES", 1 << 16)
    path = tmp_path / "book.txt.gz"
    path.write_bytes(gzip.compress(b"word " * (1 << 15)))         # 160 KiB of text in a few hundred bytes
    with pytest.raises(sources.DataError, match=r"book\.txt\.gz: holds more than 0 MiB of text once gunzipped"):
        sources.read_file(path)
    assert zlib.decompress(path.read_bytes(), 31)                     # the file itself is a good gzip


# --- predict --input --------------------------------------------------------------------------


HOSTILE = {
    "lone-surrogate": ('"document": "Anna walked \\ud800 to the river . Ben sat down ."', "document holds a lone surrogate"),
    "5000-digit-id": ('"id": ' + "7" * 5000, "id must be a non-empty string or an integer, got a number of 5,000 digits"),
    "deep-nesting": ('"answer": ' + "[" * 100_000 + "]" * 100_000, "not valid JSON (nested too deeply"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_json_line_is_one_message_naming_the_line(model, tmp_path, case):
    field, what = HOSTILE[case]
    good = json.dumps(question(1))
    path = tmp_path / "q.jsonl"
    path.write_text(good + "\n" + good[:-1].replace('"id": "q1"', '"id": "q2"') + ", " + field + "}\n", encoding="utf-8")
    code, output = predict(model, tmp_path, path)
    assert_one_message(code, output, f"{path}:2", what)
    assert len(output) < 1000 and not (tmp_path / "answers.jsonl").exists()


@pytest.mark.timeout(300)
def test_a_question_with_40000_candidates_is_answered(model, tmp_path):
    extra = [f"name{i}" for i in range(ENTITIES)]
    record = question(1, document="Anna walked to the river . Ben sat down . " + " ".join(extra),
                      candidates=["Anna", "Ben", *extra])
    code, output = predict(model, tmp_path, questions(tmp_path / "q.jsonl", [record]))
    assert code == 0, output[-2000:]
    rows = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    probs = rows[0]["probs"]
    assert len(probs) == ENTITIES + 2 and abs(sum(probs.values()) - 1) < 1e-3
    assert np.isfinite(list(probs.values())).all()


def test_a_warning_about_many_absent_candidates_names_a_few(model, tmp_path):
    absent = [f"nobody{i}" for i in range(1000)]
    record = question(1, candidates=["Anna", "Ben", *absent])
    code, output = predict(model, tmp_path, questions(tmp_path / "q.jsonl", [record]))
    assert code == 0, output
    assert "nobody0, nobody1, nobody2" in output and "and 995 more" in output and "nobody999" not in output
