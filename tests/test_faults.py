"""Fault injection: each kind of damage or bad input gives exit 1, one message naming the file and
what to do, and loses or overwrites nothing.

The fast part runs by default; cases that train a model are marked slow.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from _cbt_fixtures import example, write_source
from _faults import assert_says
from iaa import cli
from iaa.data.prepared import verify
from iaa.data.prepared.shards import SCHEMA, file_sha256

TINY = ["--set", "model.embed_dim=16", "--set", "model.hidden_dim=8", "--set", "model.state_dim=12",
        "--set", "model.gate_dim=10", "--set", "model.steps=1", "--set", "train.max_epochs=0.02"]


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    return write_source(tmp_path_factory.mktemp("source"))


@pytest.fixture(scope="module")
def prepared(source, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("template") / "cbt-ne"
    result = CliRunner().invoke(cli.cli, ["prepare", "--dataset", "cbt-ne", "--source", str(source), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture
def data(prepared, tmp_path) -> Path:
    """A fresh copy of a small prepared dataset for one test to damage."""
    verify.forget()
    copy = tmp_path / "data" / "cbt-ne"
    shutil.copytree(prepared, copy)
    return copy


def invoke(*args: str) -> tuple[int, str]:
    """Exit code and output (stdout, then stderr) of one command; a traceback fails the test."""
    result = CliRunner().invoke(cli.cli, list(args))
    assert not (result.exception and not isinstance(result.exception, SystemExit)), result.exc_info
    return result.exit_code, result.output


def rebuilt(data: Path, source: Path) -> bool:
    """Run prepare as the damage message says; True when it rebuilt ``data``."""
    args = ["prepare", "--dataset", "cbt-ne", "--source", str(source), "--out", str(data), "--json"]
    result = CliRunner().invoke(cli.cli, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.splitlines()[-1])["rebuilt"]


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def first_shard(data: Path, split: str = "train") -> Path:
    return sorted((data / split).glob("*.parquet"))[0]


def assert_one_message(code: int, output: str, *parts: str) -> None:
    assert code == 1, output
    lines = [line for line in output.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    for part in parts:
        assert part in lines[0], (part, lines[0])


def rewrite_shard(data: Path, shard: Path, change) -> None:
    """Replace ``shard`` by valid Parquet with changed values, and record it in the manifest as prepare would."""
    table = change(pq.read_table(shard, schema=SCHEMA))
    pq.write_table(table, shard, compression="zstd")
    manifest = json.loads((data / "manifest.json").read_text())
    for entry in manifest["splits"].values():
        for s in entry["shards"]:
            if data / s["file"] == shard:
                s.update(bytes=shard.stat().st_size, sha256=file_sha256(shard))
    (data / "manifest.json").write_text(json.dumps(manifest))


# ---- verified data --------------------------------------------------------------------------------

def test_flipped_byte_is_caught_and_prepare_rebuilds_it(data, source):
    shard = first_shard(data)
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    shard.write_bytes(bytes(raw))
    code, out = invoke("baseline", "--data", str(data))
    assert_one_message(code, out, str(shard), "sha256",
                       f"rebuild it with: iaa-cli prepare --dataset cbt-ne --source {source.resolve()} --out {data}")
    assert rebuilt(data, source) is True
    assert invoke("baseline", "--data", str(data))[0] == 0
    assert rebuilt(data, source) is False


def test_zstd_corrupted_shard_of_the_same_size_is_caught(data):
    shard = first_shard(data, "valid")
    raw = bytearray(shard.read_bytes())
    raw[200:400] = bytes(200)
    shard.write_bytes(bytes(raw))
    assert_one_message(*invoke("baseline", "--data", str(data)), str(shard), "changed after prepare")


def test_deleted_shard_is_named(data):
    shard = first_shard(data, "valid")
    shard.unlink()
    assert_one_message(*invoke("baseline", "--data", str(data)), str(shard), "is missing", "rebuild it with: iaa-cli prepare")


def test_shifted_answers_in_valid_parquet_are_caught_by_the_value_check(data):
    shard = first_shard(data)
    rewrite_shard(data, shard, lambda t: t.set_column(t.schema.get_field_index("answer"), "answer",
                                                      pc.add(t.column("answer"), 1)))
    assert_one_message(*invoke("baseline", "--data", str(data)), str(shard), "answer index outside its candidates")


def test_token_ids_outside_the_vocabulary_are_caught(data):
    shard = first_shard(data, "valid")
    vocab_size = len(json.loads((data / "vocab.json").read_text()))

    def shift_ids(table):
        import pyarrow as pa

        doc = table.column("doc").combine_chunks()
        shifted = pa.ListArray.from_arrays(doc.offsets, pc.add(doc.values, vocab_size))
        return table.set_column(table.schema.get_field_index("doc"), "doc", shifted)

    rewrite_shard(data, shard, shift_ids)
    assert_one_message(*invoke("baseline", "--data", str(data)), str(shard), "outside the vocabulary")


def test_vocabulary_edited_after_prepare_is_caught(data):
    vocab = json.loads((data / "vocab.json").read_text())
    (data / "vocab.json").write_text(json.dumps(vocab[:-1]))
    assert_one_message(*invoke("baseline", "--data", str(data)), "vocab.json", "vocab_hash")


@pytest.mark.parametrize("text, what", [("[]", "is not a manifest"), ("{bad", "is not valid JSON")])
def test_broken_manifest_is_one_message_and_prepare_replaces_it(data, source, text, what):
    (data / "manifest.json").write_text(text)
    assert_one_message(*invoke("baseline", "--data", str(data)), "manifest.json", what, "rebuild it with: iaa-cli prepare")
    assert rebuilt(data, source) is True


def test_the_typed_manifest_reads_and_writes_the_file_key_for_key(data):
    from iaa.data.prepared import manifest as M

    written = json.loads((data / "manifest.json").read_text())
    manifest = M.read(data)
    assert manifest.to_json() == written
    assert list(manifest.to_json()) == list(written)          # in the same order, as prepare wrote it
    assert manifest.count("train") == written["splits"]["train"]["count"] and manifest.count("absent") == 0


@pytest.mark.parametrize("change, what", [
    (lambda m: m.update(schema_version=99), "schema version 99"),
    (lambda m: m["splits"]["train"]["shards"][0].update(rows="12"), "of the wrong kind"),
    (lambda m: m.pop("vocab_size"), "lacks its splits"),
    (lambda m: m.update(splits=[]), "lacks its splits"),
])
def test_a_manifest_field_of_the_wrong_kind_is_one_message_and_prepare_replaces_it(data, source, change, what):
    manifest = json.loads((data / "manifest.json").read_text())
    change(manifest)
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert_one_message(*invoke("baseline", "--data", str(data)), "manifest.json", what,
                       "rebuild it with: iaa-cli prepare --dataset cbt-ne")
    assert rebuilt(data, source) is True


def test_an_unchanged_file_is_verified_once_per_process_but_a_change_is_caught(data):
    verify.verify(data)
    shard = first_shard(data)
    stat = shard.stat()
    raw = bytearray(shard.read_bytes())
    raw[-100] ^= 0xFF
    shard.write_bytes(bytes(raw))
    os.utime(shard, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same size and mtime: only ctime tells
    with pytest.raises(verify.DataError, match="sha256"):
        verify.verify(data)


def test_a_manifest_edited_after_verification_is_checked_again(data):
    verify.verify(data)
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["train"]["shards"][0]["sha256"] = "0" * 64
    (data / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(verify.DataError, match="sha256"):
        verify.verify(data)


@pytest.mark.parametrize("where", ["counts", "splits"])
def test_a_count_edited_in_the_manifest_is_named_with_both_numbers(data, where):
    manifest = json.loads((data / "manifest.json").read_text())
    rows = manifest["counts"]["train"]
    if where == "counts":
        manifest["counts"]["train"] = rows + 1
    else:
        manifest["splits"]["train"]["count"] = rows + 1
    (data / "manifest.json").write_text(json.dumps(manifest))
    named = "counts.train" if where == "counts" else "splits.train.count"
    assert_one_message(*invoke("baseline", "--data", str(data)), "manifest.json",
                       f"the train split holds {rows} rows", f"{named} says {rows + 1}")

def test_empty_valid_split_is_an_error_not_accuracy_zero(data):
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["splits"]["valid"].update(shards=[], count=0)
    manifest["counts"]["valid"] = 0
    (data / "manifest.json").write_text(json.dumps(manifest))
    assert_one_message(*invoke("baseline", "--data", str(data)), "the valid split is empty")


# ---- bad sources: prepare -----------------------------------------------------------------------------

def cbt_source(tmp_path: Path, train: str, valid: str | None = None) -> Path:
    folder = tmp_path / "CBTest" / "data"
    folder.mkdir(parents=True)
    (folder / "cbtest_NE_train.txt").write_text(train)
    if valid is not None:
        (folder / "cbtest_NE_valid_2000ex.txt").write_text(valid)
    return folder.parent


def prepare(dataset: str, source: Path, out: Path) -> tuple[int, str]:
    return invoke("prepare", "--dataset", dataset, "--source", str(source), "--out", str(out))


def test_cbt_file_of_blank_lines(tmp_path):
    source = cbt_source(tmp_path, "\n\n\n\n")
    assert_one_message(*prepare("cbt-ne", source, tmp_path / "out"), "cbtest_NE_train.txt", "only blank lines")
    assert not (tmp_path / "out").exists()


def test_empty_validation_split_is_refused_by_prepare(tmp_path):
    source = cbt_source(tmp_path, example(), "1 a b .\n2 c d .\n")
    assert_one_message(*prepare("cbt-ne", source, tmp_path / "out"), "no usable validation example")


def test_data_without_a_valid_split_is_refused_by_training_before_any_run_opens(tmp_path):
    code, output = prepare("cbt-ne", cbt_source(tmp_path, example() * 3), tmp_path / "out")
    assert code == 0, output
    assert_says(output, "no valid split in the source", "need train and valid")          # said at once, too
    work = tmp_path / "work"
    for command in (["train"], ["tune", "--num-samples", "1"]):
        assert_one_message(*invoke(*command, "--data", str(tmp_path / "out"), "--workdir", str(work)),
                           "no valid split here (it has train)", "reads train and valid", "iaa-cli prepare")
    assert not (work / "mlflow.db").exists() and not (work / "runs").exists()     # no run opened, none FAILED

def test_a_utf8_byte_order_mark_is_dropped_and_utf16_is_named(tmp_path):
    plain = cbt_source(tmp_path / "plain", example() * 2, example())
    marked = cbt_source(tmp_path / "marked", example() * 2, example())
    train = marked / "data" / "cbtest_NE_train.txt"
    train.write_bytes(b"\xef\xbb\xbf" + train.read_bytes())
    for source, out in ((plain, "a"), (marked, "b")):
        assert prepare("cbt-ne", source, tmp_path / out)[0] == 0
    assert [pq.read_table(first_shard(tmp_path / out)).to_pylist() for out in "ab"][0] == \
        pq.read_table(first_shard(tmp_path / "b")).to_pylist()                       # the same rows
    wide = cbt_source(tmp_path / "wide", "", example())
    (wide / "data" / "cbtest_NE_train.txt").write_bytes((example() * 2).encode("utf-16"))
    assert_one_message(*prepare("cbt-ne", wide, tmp_path / "c"), "cbtest_NE_train.txt", "line 1", "is UTF-16",
                       "convert it to UTF-8")

def test_valid_questions_that_train_holds_too_are_named_as_a_leak(tmp_path):
    from _cbt_fixtures import CANDS

    train = "".join(example(answer=CANDS[i % len(CANDS)]) for i in range(20))
    code, output = prepare("cbt-ne", cbt_source(tmp_path, train, train[: len(train) // 4]), tmp_path / "out")
    assert code == 0, output
    assert_says(output, "5 of the 5 valid questions are in train too", "a valid score counts what the reader trained on")
    apart = cbt_source(tmp_path / "apart", example(), example(query="later XXXXX ran off ."))
    code, output = prepare("cbt-ne", apart, tmp_path / "apart-out")
    assert code == 0 and "in train too" not in output, output

def question(entity: int = 1) -> str:
    return (f"http://x\n\n@entity{entity} met @entity2 at home .\n\n@placeholder met @entity2\n\n"
            f"@entity{entity}\n\n@entity{entity}:A\n@entity2:B\n")


def cnn_tgz(path: Path, members: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    return path


def test_truncated_tgz(tmp_path):
    full = cnn_tgz(tmp_path / "full.tgz", {f"questions/training/q{i}.question": question() * 20 for i in range(40)})
    cut = tmp_path / "cnn.tgz"
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    assert_one_message(*prepare("cnn", cut, tmp_path / "out"), str(cut), "ends early")


@pytest.mark.parametrize("content, what", [(b"", "is empty"), (b"plain text\n", "is not gzip-compressed")])
def test_empty_or_non_gzip_tgz(tmp_path, content, what):
    path = tmp_path / "cnn.tgz"
    path.write_bytes(content)
    assert_one_message(*prepare("cnn", path, tmp_path / "out"), str(path), what)


def test_folder_named_like_a_question_file(tmp_path):
    root = tmp_path / "cnn" / "questions"
    (root / "training" / "odd.question").mkdir(parents=True)
    (root / "training" / "a.question").write_text(question())
    assert_one_message(*prepare("cnn", tmp_path / "cnn", tmp_path / "out"), "odd.question", "not a file")


@pytest.mark.parametrize("members", [
    {"questions/training/a.question": question(), "questions/validation/a.question": question()},
    {"questions/training/a.question": question(), "x/questions/training/a.question": question()},
])
def test_duplicate_example_ids_across_members_or_splits_name_both_files(tmp_path, members):
    path = cnn_tgz(tmp_path / "cnn.tgz", members)
    first, second = members
    assert_one_message(*prepare("cnn", path, tmp_path / "out"), "example id 'a' occurs 2 times",
                       f"cnn.tgz:{first} in train", f"cnn.tgz:{second} in ")


def test_a_failed_prepare_keeps_the_previous_dataset(data, tmp_path):
    before = snapshot(data)
    path = tmp_path / "cnn.tgz"
    path.write_bytes(b"")
    code, _ = prepare("cnn", path, data)
    assert code == 1 and snapshot(data) == before


# ---- settings and the workdir -------------------------------------------------------------------------

@pytest.mark.parametrize("item", ["train.check_every=-5", "train.lr_decay=0", "train.threads=-3",
                                  "train.max_minutes=-1", "train.max_epochs=nan"])
def test_nonsense_settings_are_refused_naming_the_key(data, tmp_path, item):
    code, out = invoke("train", "--data", str(data), "--set", item, "--workdir", str(tmp_path / "w"))
    assert_one_message(code, out, item.split("=")[0])
    assert not (tmp_path / "w" / "runs").exists()


def test_yaml_syntax_error_in_config(data, tmp_path):
    config = tmp_path / "best_config.yaml"
    config.write_text("train:\n  lr: 0.1\n  seed: [1, 2\n")
    code, out = invoke("train", "--data", str(data), "--config", str(config), "--workdir", str(tmp_path / "w"))
    assert_one_message(code, out, str(config), "line", "not valid YAML")


def test_unwritable_workdir(data, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, out = invoke("train", "--data", str(data), "--workdir", str(blocker / "w"))
    assert_one_message(code, out, str(blocker / "w"), "not writable", "--workdir")
    assert blocker.read_text() == "not a folder"


def test_corrupted_mlflow_db(data, tmp_path):
    workdir = tmp_path / "w"
    workdir.mkdir()
    (workdir / "mlflow.db").write_bytes(b"this is not sqlite" * 100)
    code, out = invoke("train", "--data", str(data), "--workdir", str(workdir))
    assert_one_message(code, out, "mlflow.db", "not a readable MLflow database", "--tracking-uri")
    assert (workdir / "mlflow.db").read_bytes() == b"this is not sqlite" * 100


def test_same_checkpoint_twice_in_an_ensemble_is_refused(tmp_path):
    ckpt = tmp_path / "best.pt"
    ckpt.write_bytes(b"x")
    code, out = invoke("ensemble", "--members", str(ckpt), str(tmp_path / "." / "best.pt"),
                       "--workdir", str(tmp_path / "w"))
    assert_one_message(code, out, "listed twice")


# ---- run folders ----------------------------------------------------------------------------------

def fake_run(run_dir: Path) -> dict[str, str]:
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "checkpoints" / "best.pt").write_bytes(b"weights of run A")
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    return snapshot(run_dir)


def test_a_run_folder_in_use_is_refused_naming_the_holder(data, tmp_path):
    run_dir = tmp_path / "run"
    before = fake_run(run_dir)
    with open(run_dir / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write("4242\n")
        lock.flush()
        code, out = invoke("train", "--data", str(data), "--run-dir", str(run_dir), "--resume",
                           "--workdir", str(tmp_path / "w"))
    assert_one_message(code, out, str(run_dir), "in use by another run (pid 4242)")
    assert {k: v for k, v in snapshot(run_dir).items() if k != ".lock"} == before


def test_a_finished_run_is_not_replaced_without_overwrite_or_resume(data, tmp_path):
    run_dir = tmp_path / "run"
    before = fake_run(run_dir)
    code, out = invoke("train", "--data", str(data), "--run-dir", str(run_dir), "--workdir", str(tmp_path / "w"))
    assert_one_message(code, out, str(run_dir), "already holds a run", "--resume", "--overwrite")
    assert {k: v for k, v in snapshot(run_dir).items() if k != ".lock"} == before


def test_resume_of_a_folder_without_a_checkpoint_is_refused_and_trains_nothing(data, tmp_path):
    missing, empty, metrics_only = tmp_path / "nope", tmp_path / "empty", tmp_path / "metrics-only"
    empty.mkdir()
    metrics_only.mkdir()
    (metrics_only / "metrics.jsonl").write_text('{"step": 312}\n')
    for run_dir, why in ((missing, "does not exist"), (empty, "holds no checkpoint"),
                         (metrics_only, "but no checkpoint")):
        before = snapshot(run_dir) if run_dir.exists() else None
        code, out = invoke("train", "--data", str(data), "--run-dir", str(run_dir), "--resume",
                           "--workdir", str(tmp_path / "w"))
        assert_one_message(code, out, str(run_dir), "nothing to resume", why, "leave out --resume")
        assert (snapshot(run_dir) if run_dir.exists() else None) == before
    assert "--overwrite" in out                                    # the folder with metrics can be started afresh


@pytest.mark.slow
def test_overwrite_replaces_a_finished_run_and_the_lock_is_released(data, tmp_path):
    run_dir = tmp_path / "run"
    fake_run(run_dir)
    args = ["train", "--data", str(data), "--run-dir", str(run_dir), "--workdir", str(tmp_path / "w"), *TINY]
    code, out = invoke(*args, "--overwrite", "--json")
    assert code == 0, out
    assert (run_dir / "checkpoints" / "best.pt").read_bytes() != b"weights of run A"
    code, out = invoke(*args, "--resume", "--json")  # the first run's lock is gone
    assert code == 0, out


@pytest.mark.slow
def test_gzip_cbt_source_that_ends_early(tmp_path):
    folder = tmp_path / "CBTest" / "data"
    folder.mkdir(parents=True)
    data = gzip.compress((example() * 50).encode())
    (folder / "cbtest_NE_train.txt.gz").write_bytes(data[: len(data) // 2])
    assert_one_message(*prepare("cbt-ne", folder.parent, tmp_path / "out"), "cbtest_NE_train.txt.gz", "cannot gunzip")
