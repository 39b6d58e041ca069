"""Fault suite, outputs: nothing a user owns is lost.

An output never replaces an input or a store, a rebuild deletes only what it wrote, a name stays
inside its folder, an ensemble means the same from any folder, and a damaged checkpoint, a full
disk or a read-only folder is one ``Error:`` line naming the file, with every file that was
there before left byte for byte as it was.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from _faults import (assert_one_message, assert_unchanged, fill, invoke, make_checkpoint, make_prepared, make_store,
                     question, questions, small_fs, snapshot)


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("faults")
    source, prepared = make_prepared(root)
    ckpt = make_checkpoint(prepared, root / "run" / "checkpoints" / "best.pt")
    other = make_checkpoint(prepared, root / "run2" / "checkpoints" / "best.pt", seed=1)
    return {"root": root, "source": source, "prepared": prepared, "ckpt": ckpt, "other": other}


@pytest.fixture
def w(base, tmp_path) -> dict[str, Path]:
    """A fresh copy of everything for one test to point outputs at."""
    for name in ("source", "prepared", "run", "run2"):
        shutil.copytree(base["root"] / name, tmp_path / name)
    return {"root": tmp_path, "source": tmp_path / "source" / "CBTest", "prepared": tmp_path / "prepared",
            "ckpt": tmp_path / "run" / "checkpoints" / "best.pt", "other": tmp_path / "run2" / "checkpoints" / "best.pt",
            "questions": questions(tmp_path / "q.jsonl", [question(1), question(2)])}


# ---- an output never replaces an input or a store: every command with --out, at each of its inputs ----

def _commands(w: dict[str, Path]) -> dict[str, tuple[list[object], dict[str, Path]]]:
    """Per command: its arguments without --out, and its inputs by name."""
    data = w["prepared"]
    shard = sorted((data / "train").glob("*.parquet"))[0]
    data_files = {"manifest": data / "manifest.json", "vocab": data / "vocab.json", "shard": shard}
    return {
        "evaluate": (["evaluate", "--checkpoint", w["ckpt"], "--data", data, "--split", "valid"],
                     {"checkpoint": w["ckpt"], **data_files}),
        "predict": (["predict", "--checkpoint", w["ckpt"], "--data", data, "--input", w["questions"]],
                    {"input": w["questions"], "checkpoint": w["ckpt"], **data_files}),
        "explain": (["explain", "--checkpoint", w["ckpt"], "--data", data, "--first", "1"],
                    {"checkpoint": w["ckpt"], **data_files}),
        "report": (["report", "--experiment", "train-cbt-ne", "--workdir", w["root"] / "work", "--baseline-data", data],
                   {"tracking database": w["root"] / "work" / "mlflow.db", **data_files}),
        "prepare": (["prepare", "--dataset", "cbt-ne", "--source", w["source"]],
                    {"source": w["source"], "source file": w["source"] / "data" / "cbtest_NE_train.txt"}),
    }


OUT_CASES = [("evaluate", i) for i in ("checkpoint", "manifest", "vocab", "shard")] + \
            [("predict", i) for i in ("input", "checkpoint", "manifest", "shard")] + \
            [("explain", i) for i in ("checkpoint", "manifest", "vocab")] + \
            [("report", i) for i in ("tracking database", "manifest", "shard")] + \
            [("prepare", i) for i in ("source", "source file")]


@pytest.mark.parametrize("command, target", OUT_CASES, ids=[f"{c}-{t}" for c, t in OUT_CASES])
def test_out_pointed_at_an_input_leaves_every_input_byte_identical(w, command, target):
    if command == "report":
        make_store(w["root"] / "work")
    args, inputs = _commands(w)[command]
    out = inputs[target]
    before = snapshot(w["root"])
    assert_one_message(*invoke(*args, "--out", out), out)
    assert_unchanged(before, w["root"])


def test_explain_png_over_the_checkpoint_is_refused(w):
    before = snapshot(w["root"])
    code, out = invoke("explain", "--checkpoint", w["ckpt"], "--data", w["prepared"], "--first", "1",
                       "--out", w["root"] / "e.html", "--png", w["ckpt"])
    assert_one_message(code, out, w["ckpt"])
    assert_unchanged(before, w["root"])


def test_predict_out_over_a_file_of_its_ensemble_is_refused(w):
    ens = w["root"] / "ens"
    ens.mkdir()
    (ens / "ensemble.json").write_text(json.dumps({"members": [str(w["ckpt"].resolve())]}))
    before = snapshot(w["root"])
    code, out = invoke("predict", "--ensemble", ens, "--data", w["prepared"], "--input", w["questions"],
                       "--out", ens / "ensemble.json")
    assert_one_message(code, out, ens / "ensemble.json")
    assert_unchanged(before, w["root"])


def test_report_out_with_a_suffix_that_is_not_png_is_refused(w):
    make_store(w["root"] / "work")
    before = snapshot(w["root"])
    code, out = invoke("report", "--experiment", "train-cbt-ne", "--workdir", w["root"] / "work",
                       "--out", w["root"] / "x.txt")
    assert_one_message(code, out, w["root"] / "x.txt", ".png")
    assert not (w["root"] / "x.txt").exists()
    assert_unchanged(before, w["root"])


# ---- a rebuild deletes only what it wrote -----------------------------------------------------------

def test_prepare_rebuild_keeps_the_users_files_beside_the_dataset(w):
    data = w["prepared"]
    (data / "notes.txt").write_text("my notes")
    (data / "runs" / "mine").mkdir(parents=True)
    (data / "runs" / "mine" / "best.pt").write_bytes(b"my weights")
    old_shards = {p.relative_to(data) for p in data.glob("*/*.parquet")}
    mine = snapshot(data / "notes.txt", data / "runs")
    source = json.loads((data / "manifest.json").read_text())["source_path"]   # the source it was made from
    code, out = invoke("prepare", "--dataset", "cbt-ne", "--source", source, "--out", data, "--min-count", "2")
    assert code == 0, out
    assert_unchanged(mine, data / "notes.txt", data / "runs")
    manifest = json.loads((data / "manifest.json").read_text())
    new_shards = {Path(s["file"]) for split in manifest["splits"].values() for s in split["shards"]}
    assert {p.relative_to(data) for p in data.glob("*/*.parquet")} == new_shards  # stale shards went
    assert old_shards and invoke("baseline", "--data", data)[0] == 0


def test_prepare_with_its_source_inside_out_is_refused(w):
    data = w["prepared"]
    shutil.move(w["source"], data / "source")
    (data / "notes.txt").write_text("my notes")
    before = snapshot(w["root"])
    code, out = invoke("prepare", "--dataset", "cbt-ne", "--source", data / "source", "--out", data, "--min-count", "2")
    assert_one_message(code, out, data)
    assert_unchanged(before, w["root"])


def test_prepare_of_another_dataset_does_not_replace_one_without_overwrite(w):
    before = snapshot(w["root"])
    code, out = invoke("prepare", "--dataset", "demo", "--out", w["prepared"])
    assert_one_message(code, out, w["prepared"], "--overwrite")
    assert_unchanged(before, w["root"])


def test_prepare_into_a_folder_of_other_files_names_them(w):
    folder = w["root"] / "mine"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    before = snapshot(w["root"])
    code, out = invoke("prepare", "--dataset", "cbt-ne", "--source", w["source"], "--out", folder)
    assert_one_message(code, out, folder, "thesis.tex")
    assert_unchanged(before, w["root"])


def test_make_cloze_refuses_an_out_folder_that_holds_its_texts(w):
    out = w["root"] / "cloze"
    out.mkdir()
    (out / "cloze.json").write_text("{}")           # an earlier make-cloze output ...
    (out / "texts").mkdir()
    (out / "texts" / "book.txt").write_text("Once upon a time .\n" * 40)  # ... that now holds the texts
    before = snapshot(w["root"])
    code, msg = invoke("make-cloze", "--style", "cbt-ne", "--source", out / "texts", "--out", out, "--workers", "0")
    assert_one_message(code, msg, out, "which the command uses")
    assert_unchanged(before, w["root"])


def test_make_cloze_into_the_current_folder(tmp_path, monkeypatch):
    from _cloze_fake import book, make_fake

    from iaa.data.cloze.sources import SourceSpec
    from iaa.jobs.own_data import make_cloze

    texts = tmp_path / "texts"
    texts.mkdir()
    (texts / "b.txt").write_text(book("A Book", 60, seed=0))
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    cfg = make_cloze.ClozeConfig("cbt-ne", (SourceSpec(texts),))
    result = make_cloze.run(cfg, Path("."), workers=0, tagger=make_fake, progress=False)
    assert result.questions["train"] > 0 and (here / "cloze.json").is_file()
    assert (texts / "b.txt").is_file()


# ---- names stay inside their folders ------------------------------------------------------------------

@pytest.mark.parametrize("name", ["../../x", "/tmp/iaa-escaped-name", "a/b", ".."])
def test_an_ensemble_name_that_leaves_its_folder_is_refused(w, name):
    before = snapshot(w["root"])
    code, out = invoke("ensemble", "--members", w["ckpt"], w["other"], "--data", w["prepared"], "--name", name,
                       "--workdir", w["root"] / "work")
    assert_one_message(code, out, "--name", repr(name), "letters, digits")
    assert not (w["root"] / "work" / "ensembles").exists() and not Path("/tmp/iaa-escaped-name").exists()
    assert_unchanged(before, w["root"])


@pytest.mark.parametrize("name", ["../../x", "/tmp/iaa-escaped-name"])
def test_a_sweep_name_that_leaves_its_folder_is_refused(w, name):
    before = snapshot(w["root"])
    code, out = invoke("tune", "--dataset", "cbt-ne", "--data", w["prepared"], "--name", name, "--num-samples", "1",
                       "--max-epochs", "0.01", "--workdir", w["root"] / "work", "--set", "train.batch_size=8")
    assert_one_message(code, out, "--name", repr(name))
    assert not (w["root"] / "work" / "sweeps").exists() and not (w["root"] / "x").exists()
    assert_unchanged(before, w["root"])


@pytest.mark.parametrize("name", ["", "  ", "a/b", "x:y", "../m"])
def test_a_registered_model_name_that_mlflow_refuses_is_refused_before_training(w, name):
    before = snapshot(w["root"])
    code, out = invoke("train", "--data", w["prepared"], "--register", name, "--workdir", w["root"] / "work",
                       *[a for s in ("model.embed_dim=16", "model.hidden_dim=8", "model.state_dim=12",
                                     "model.gate_dim=10", "model.steps=1", "train.max_epochs=0.01")
                         for a in ("--set", s)])
    assert_one_message(code, out, "--register", repr(name), "MLflow")
    assert not (w["root"] / "work" / "runs").exists()
    assert_unchanged(before, w["root"])


# ---- ensembles are self-contained ------------------------------------------------------------------

def _ensemble(folder: Path, record: object) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "ensemble.json").write_text(record if isinstance(record, str) else json.dumps(record))
    return folder


def test_an_ensemble_with_relative_members_reads_them_from_its_work_folder_not_the_current_one(w, monkeypatch):
    from iaa.data.prepared.shards import file_sha256

    member = "run/checkpoints/best.pt"                          # relative to the work folder (w["root"])
    ens = _ensemble(w["root"] / "ensembles" / "e", {"members": [member],
                                                    "member_sha256": {member: file_sha256(w["ckpt"])}})
    elsewhere = w["root"] / "elsewhere"
    shutil.copytree(w["root"] / "run2", elsewhere / "run")      # another model at the same relative path
    monkeypatch.chdir(elsewhere)
    before = snapshot(w["root"] / "run")
    code, out = invoke("predict", "--ensemble", ens, "--data", w["prepared"], "--input", w["questions"],
                       "--out", w["root"] / "answers.jsonl")
    assert code == 0, out
    assert (w["root"] / "answers.jsonl").is_file()
    assert_unchanged(before, w["root"] / "run")
    from iaa.jobs.evaluation.ensembling import ensemble_record

    assert ensemble_record.members(ens) == [w["ckpt"]]
    monkeypatch.chdir(w["root"])
    _ensemble(ens, {"members": [member], "member_sha256": {member: file_sha256(w["other"])}})
    code, out = invoke("predict", "--ensemble", ens, "--data", w["prepared"], "--input", w["questions"],
                       "--out", w["root"] / "answers2.jsonl")
    assert_one_message(code, out, str(w["ckpt"]), "changed")     # its own member, whatever sits elsewhere


def test_an_ensemble_member_changed_after_the_ensemble_was_made_is_refused(w):
    from iaa.data.prepared.shards import file_sha256

    member = str(w["ckpt"].resolve())
    ens = _ensemble(w["root"] / "ens", {"members": [member], "member_sha256": {member: file_sha256(w["ckpt"])}})
    shutil.copyfile(w["other"], w["ckpt"])                      # the member was retrained in place
    before = snapshot(w["root"])
    code, out = invoke("predict", "--ensemble", ens, "--data", w["prepared"], "--input", w["questions"],
                       "--out", w["root"] / "answers.jsonl")
    assert_one_message(code, out, member, "changed")
    assert_unchanged(before, w["root"])


@pytest.mark.parametrize("record, what", [("{not json", "not valid JSON"), ({"members": "run"}, "list"),
                                          ({"members": [1, 2]}, "list"), ([], "list")])
def test_a_malformed_ensemble_json_is_one_message(w, record, what):
    ens = _ensemble(w["root"] / "ens", record)
    before = snapshot(w["root"])
    code, out = invoke("predict", "--ensemble", ens, "--data", w["prepared"], "--input", w["questions"],
                       "--out", w["root"] / "answers.jsonl")
    assert_one_message(code, out, ens / "ensemble.json", what)
    assert_unchanged(before, w["root"])


@pytest.mark.slow
def test_a_second_ensemble_of_the_same_name_does_not_replace_the_first(w):
    args = ["ensemble", "--members", w["ckpt"], w["other"], "--data", w["prepared"], "--name", "mine",
            "--workdir", w["root"] / "work", "--json"]
    code, out = invoke(*args)
    assert code == 0, out
    summary = json.loads((w["root"] / "work" / "ensembles" / "mine" / "ensemble.json").read_text())
    assert all(Path(m).is_absolute() for m in summary["members"]) and set(summary["member_sha256"]) >= set(summary["members"])
    before = snapshot(w["root"])
    assert_one_message(*invoke(*args[:-1], "--select", "greedy"), w["root"] / "work" / "ensembles" / "mine",
                       "--overwrite")
    assert_unchanged(before, w["root"])
    assert invoke(*args, "--select", "greedy", "--overwrite")[0] == 0


# ---- a damaged checkpoint ---------------------------------------------------------------------------

CUTS = [1, 2, 10, 22, 30, 64, 100, 200, 512, 1000, 2000, 4000, 8000, 12000, 16000, 20000, 24000, 28000,
        32000, 36000, -1000, -200, -100, -22, -2, -1]


@pytest.mark.parametrize("cut", CUTS)
def test_a_truncated_checkpoint_is_one_message_at_any_cut_point(w, cut):
    raw = w["ckpt"].read_bytes()
    cut_file = w["root"] / "cut.pt"
    cut_file.write_bytes(raw[:cut])
    before = snapshot(w["root"])
    code, out = invoke("evaluate", "--checkpoint", cut_file, "--data", w["prepared"], "--split", "valid",
                       "--out", w["root"] / "p.parquet")
    assert_one_message(code, out, cut_file)
    assert_unchanged(before, w["root"])


# ---- a full disk, a read-only folder ---------------------------------------------------------------

def _file_outputs(w: dict[str, Path], folder: Path) -> dict[str, list[object]]:
    return {
        "evaluate": ["evaluate", "--checkpoint", w["ckpt"], "--data", w["prepared"], "--split", "valid",
                     "--out", folder / "p.parquet"],
        "predict": ["predict", "--checkpoint", w["ckpt"], "--data", w["prepared"], "--input", w["questions"],
                    "--out", folder / "a.jsonl"],
        "explain": ["explain", "--checkpoint", w["ckpt"], "--data", w["prepared"], "--first", "1",
                    "--out", folder / "e.html"],
        "explain-png": ["explain", "--checkpoint", w["ckpt"], "--data", w["prepared"], "--first", "1",
                        "--out", w["root"] / "e.html", "--png", folder / "e.png"],
        "report": ["report", "--experiment", "train-cbt-ne", "--workdir", w["root"] / "work", "--out", folder / "c.png"],
        "prepare": ["prepare", "--dataset", "cbt-ne", "--source", w["source"], "--out", folder / "data"],
    }


DISK_CASES = ["evaluate", "predict", "explain", "explain-png", "report", "prepare"]


@pytest.mark.parametrize("command", DISK_CASES)
def test_a_full_disk_is_one_message_naming_the_output(w, command):
    with small_fs(w["root"] / "full", size="64k") as folder:
        (folder / "kept.txt").write_text("written before the disk filled")
        fill(folder)
        if command == "report":
            make_store(w["root"] / "work")
        args = _file_outputs(w, folder)[command]
        before = snapshot(w["root"])
        code, out = invoke(*args)
        assert_one_message(code, out, args[-1])
        assert_unchanged(before, w["root"])


@pytest.mark.parametrize("command", DISK_CASES)
def test_a_read_only_output_folder_is_one_message_naming_the_output(w, command):
    with small_fs(w["root"] / "ro", read_only=True) as folder:
        if command == "report":
            make_store(w["root"] / "work")
        args = _file_outputs(w, folder)[command]
        before = snapshot(w["root"])
        code, out = invoke(*args)
        assert_one_message(code, out, folder if command == "prepare" else args[-1])  # prepare: the folder to create in
        assert_unchanged(before, w["root"])


@pytest.mark.parametrize("command", [c for c in DISK_CASES if c != "prepare"])
def test_an_output_under_a_file_is_one_message_before_any_work(w, command):
    blocker = w["root"] / "not-a-folder"
    blocker.write_text("a file where a folder would be")
    if command == "report":
        make_store(w["root"] / "work")
    args = _file_outputs(w, blocker)[command]
    code, out = invoke(*args)
    assert_one_message(code, out, args[-1], "Not a directory")
    assert out.strip().splitlines() == [out.strip()] and "\r" not in out, out   # no progress bar beside it


@pytest.mark.slow
def test_training_into_a_full_run_folder_is_one_message(w):
    with small_fs(w["root"] / "full", size="64k") as folder:
        fill(folder)
        run_dir = folder / "run"
        code, out = invoke("train", "--data", w["prepared"], "--run-dir", run_dir, "--workdir", w["root"] / "work",
                           *[a for s in ("model.embed_dim=16", "model.hidden_dim=8", "model.state_dim=12",
                                         "model.gate_dim=10", "model.steps=1", "train.max_epochs=0.05")
                             for a in ("--set", s)])
        assert_one_message(code, out, run_dir)


def test_make_cloze_into_a_full_disk_names_the_output(tmp_path):
    from _cloze_fake import book, make_fake

    from iaa.data.cloze.sources import SourceSpec
    from iaa.errors import IaaError
    from iaa.jobs.own_data import make_cloze

    (tmp_path / "b.txt").write_text(book("A Book", 400, seed=0))
    with small_fs(tmp_path / "full", size="64k") as folder:
        fill(folder)
        cfg = make_cloze.ClozeConfig("cbt-ne", (SourceSpec(tmp_path / "b.txt"),))
        with pytest.raises(IaaError, match=str(folder / "cloze")):
            make_cloze.run(cfg, folder / "cloze", workers=0, tagger=make_fake, progress=False)


# ---- the local cluster's settings ---------------------------------------------------------------------

def test_a_bad_dashboard_host_is_one_message(w):
    import ray

    ray.shutdown()     # a Ray that another test left in this process would be reused, the host never read
    code, out = invoke("tune", "--dataset", "cbt-ne", "--data", w["prepared"], "--num-samples", "1",
                       "--max-epochs", "0.01", "--workdir", w["root"] / "work",
                       env={"IAA_DASHBOARD_HOST": "no-such-host.invalid", "RAY_ADDRESS": ""})
    assert_one_message(code, out, "IAA_DASHBOARD_HOST", "no-such-host.invalid")


def test_resume_refuses_storage_that_others_can_write(tmp_path):
    from iaa.errors import IaaError
    from iaa.platform.cluster.storage import check_private

    folder = tmp_path / "sweep"
    folder.mkdir()
    (folder / "tuner.pkl").write_bytes(b"pickle")
    os.chmod(folder, 0o755)
    check_private(folder)                                       # the user's own: fine
    os.chmod(folder / "tuner.pkl", 0o666)
    with pytest.raises(IaaError, match=r"tuner\.pkl is writable by group or others"):
        check_private(folder)
    os.chmod(folder / "tuner.pkl", 0o644)
    os.chmod(folder, 0o777)
    with pytest.raises(IaaError, match="sweep is writable by group or others"):
        check_private(folder)
    os.chmod(folder, 0o755)
    if os.getuid() != 0:
        return                                                  # only root can give a file away
    os.chown(folder / "tuner.pkl", 12345, -1)
    with pytest.raises(IaaError, match="owned by uid 12345"):
        check_private(folder)


@pytest.mark.parametrize("target", ["prepared", "store"])
def test_a_run_folder_that_is_an_input_is_refused(w, target):
    make_store(w["root"] / "work")
    run_dir = w["prepared"] if target == "prepared" else w["root"] / "work" / "mlflow.db"
    before = snapshot(w["root"])
    code, out = invoke("train", "--data", w["prepared"], "--run-dir", run_dir, "--workdir", w["root"] / "work",
                       "--set", "train.max_epochs=0.01")
    assert_one_message(code, out, run_dir, "--run-dir")
    assert_unchanged(before, w["root"])


def test_a_trial_model_the_store_refuses_marks_its_run_failed_and_is_named(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Every output of the sweep is written; the trial run whose model the store refused ends FAILED,
    and the loss is reported (the command then exits 1) rather than passed over."""
    from iaa.jobs.evaluation.explaining import explain
    from iaa.jobs.tune import tune
    from iaa.jobs.ports import TrialRecord

    monkeypatch.setattr(explain, "run", lambda *a, **k: explain.ExplainResult(
        html=str(tmp_path / "e.html"), png=str(tmp_path / "e.png"), examples=(), title="t", precision="fp32",
        temperature=1.0))

    class Run:
        def __init__(self, run_id: str) -> None:
            self.run_id, self.lost, self.status = run_id, [], "FINISHED"

        def log_artifact(self, path: Path, folder: str | None = None) -> None:
            pass

        def end(self, status: str = "FINISHED") -> None:
            self.status = status

    class Store:
        uri = "sqlite:///store.db"

        def __init__(self) -> None:
            self.runs: dict[str, Run] = {}

        def attach(self, run_id: str) -> Run:
            return self.runs.setdefault(run_id, Run(run_id))

        def log_model(self, run: Run, files, register=None, *, code, card=None) -> str | None:
            if run.run_id == "refused":
                run.lost.append("the model (No space left on device)")
                return None
            return f"models:/m-{run.run_id}"

    checkpoints = []
    for name in ("best", "refused"):
        checkpoints.append(tmp_path / f"{name}.pt")
        checkpoints[-1].write_bytes(b"weights")
    best, other = (TrialRecord(trial_id=n, config=None, best_valid_acc=acc,  # type: ignore[arg-type]
                               checkpoint=str(c), mlflow_run_id=n)
                   for n, acc, c in (("best", 0.9, checkpoints[0]), ("refused", 0.5, checkpoints[1])))
    store = Store()
    outputs, unlogged = tune.best_outputs(best, store, tmp_path, tmp_path, None, [best, other])
    assert outputs["model_uri"] == "models:/m-best"
    assert store.runs["refused"].status == "FAILED" and store.runs["best"].status == "FINISHED"
    assert len(unlogged) == 1 and "refused" in unlogged[0] and "No space left" in unlogged[0]
