"""``train --resume``.

- ``--resume --run-dir DIR`` needs no data flag: the run folder names the prepared data its run
  trained on (``RUN_DIR/data.json``), data given is held to it, and a folder without the record
  asks for the data.
- Without ``--model`` and ``--config`` the run goes on with the config its checkpoint holds,
  ``--set`` on top; a resume its checkpoint refuses is one line before the tracked run is
  reopened, so the run's record stays as the stop left it.

In-process on the fake tracker (tests/fakes.py), seconds each."""

from __future__ import annotations

import copy
import json
import os
import shlex
import shutil
import signal
from pathlib import Path

import pytest
from click.testing import CliRunner

from _faults import assert_one_message, make_prepared, snapshot
from _tiny import TINY_SETS, make_tiny_prepared
from fakes import FakeRun, FakeTracker, train_on

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def tracker(monkeypatch: pytest.MonkeyPatch) -> FakeTracker:
    return train_on(monkeypatch, FakeTracker())


# --- the data a resume trains on ------------------------------------------------------------------


def _train(*args: object, epochs: int = 1) -> tuple[int, str]:
    from iaa import cli

    sets = [arg for s in (*TINY_SETS, "train.threads=1", f"train.max_epochs={epochs}") for arg in ("--set", s)]
    result = CliRunner().invoke(cli.cli, ["train", *map(str, args), *sets])
    assert not (result.exception and not isinstance(result.exception, SystemExit)), result.exc_info
    return result.exit_code, result.output


def _steps(run_dir: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_a_resume_without_data_trains_on_the_data_its_run_recorded(tiny: Path, tmp_path: Path,
                                                                  tracker: FakeTracker) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    code, out = _train("--data", tiny, "--run-dir", run_dir, "--workdir", work)
    assert code == 0, out
    first = _steps(run_dir)

    code, out = _train("--resume", "--run-dir", run_dir, "--workdir", work, "--json", epochs=2)

    assert code == 0, out
    assert json.loads(out[out.index("{"):])["data_dir"] == str(tiny.resolve())
    steps = _steps(run_dir)
    assert steps[:len(first)] == first and steps[-1] == 2 * first[-1]      # went on where it stopped
    [run] = tracker.runs.values()                                          # the same tracked run, continued
    assert run.state == "FINISHED"


def test_the_same_data_in_another_place_is_taken_and_the_record_follows_it(tiny: Path, tmp_path: Path,
                                                                          tracker: FakeTracker) -> None:
    run_dir, work, moved = tmp_path / "run", tmp_path / "work", tmp_path / "moved" / "prepared"
    assert _train("--data", tiny, "--run-dir", run_dir, "--workdir", work)[0] == 0
    shutil.copytree(tiny, moved)

    code, out = _train("--resume", "--data", moved, "--run-dir", run_dir, "--workdir", work, epochs=2)
    assert code == 0, out
    code, out = _train("--resume", "--run-dir", run_dir, "--workdir", work, "--json", epochs=3)

    assert code == 0, out
    assert json.loads(out[out.index("{"):])["data_dir"] == str(moved.resolve())


def test_a_resume_on_other_data_is_refused_naming_both(tiny: Path, tmp_path: Path, tracker: FakeTracker) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    assert _train("--data", tiny, "--run-dir", run_dir, "--workdir", work)[0] == 0
    _, other = make_prepared(tmp_path / "other")                           # another vocabulary
    before = snapshot(run_dir)

    code, out = _train("--resume", "--data", other, "--run-dir", run_dir, "--workdir", work, epochs=2)

    assert_one_message(code, out, run_dir, f"trained on {tiny.resolve()}", str(other.resolve()),
                       "leave out --data and --dataset")
    assert snapshot(run_dir) == before
    [run] = tracker.runs.values()
    assert run.state == "FINISHED"                                         # never reopened


def test_a_run_folder_without_the_record_asks_for_its_data_once(tiny: Path, tmp_path: Path,
                                                               tracker: FakeTracker) -> None:
    """A folder from before the record: its resume without data is one line asking for it; given,
    the resume writes the record, so the next one needs none."""
    run_dir, work = tmp_path / "run", tmp_path / "work"
    assert _train("--data", tiny, "--run-dir", run_dir, "--workdir", work)[0] == 0
    (run_dir / "data.json").unlink()
    before = snapshot(run_dir)

    code, out = _train("--resume", "--run-dir", run_dir, "--workdir", work, epochs=2)

    assert_one_message(code, out, run_dir, "data.json", "--data")
    assert snapshot(run_dir) == before
    assert _train("--resume", "--data", tiny, "--run-dir", run_dir, "--workdir", work, epochs=2)[0] == 0
    code, out = _train("--resume", "--run-dir", run_dir, "--workdir", work, "--json", epochs=3)
    assert code == 0, out
    assert json.loads(out[out.index("{"):])["data_dir"] == str(tiny.resolve())


def test_a_resume_without_data_or_run_folder_is_a_usage_error(tmp_path: Path) -> None:
    code, out = _train("--resume", "--workdir", tmp_path / "work")
    assert code == 2 and "--run-dir" in out, out
    assert not (tmp_path / "work").exists()


def test_a_resume_without_data_stopped_by_sigint_prints_a_line_that_resumes(
        tiny: Path, tmp_path: Path, tracker: FakeTracker, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    assert _train("--data", tiny, "--run-dir", run_dir, "--workdir", work)[0] == 0
    logged, sent = FakeRun.log_metrics, []

    def log_then_ctrl_c(self: FakeRun, metrics, step=None) -> None:       # Ctrl-C after the resume's first check
        logged(self, metrics, step)
        if not sent and "valid_acc" in metrics:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(FakeRun, "log_metrics", log_then_ctrl_c)
    code, out = _train("--resume", "--run-dir", run_dir, "--workdir", work, epochs=2)

    assert code == 130, out
    [line] = [text for text in out.splitlines() if text.startswith("interrupted by SIGINT")]
    argv = shlex.split(line.split("resume with: ", 1)[1])
    assert argv[:2] == ["iaa-cli", "train"] and "--resume" in argv
    monkeypatch.setattr(FakeRun, "log_metrics", logged)
    from iaa import cli

    resumed = CliRunner().invoke(cli.cli, argv[1:])
    assert resumed.exit_code == 0, resumed.output
    assert _steps(run_dir)[-1] == 2 * 12


# --- the config a resume trains with --------------------------------------------------------------


BATCHES = 12                      # a tiny epoch: 192 examples in batches of 16
THE_RUN = ("--model", "as-reader", "--set", "train.lr=0.003", "--set", "train.max_epochs=1")


def _cli(*args: object) -> tuple[int, str]:
    from iaa import cli

    result = CliRunner().invoke(cli.cli, ["train", *map(str, args)])
    assert not (result.exception and not isinstance(result.exception, SystemExit)), result.exc_info
    return result.exit_code, result.output


def _stopped(monkeypatch: pytest.MonkeyPatch, *args: object) -> str:
    """``train ARGS`` stopped by Ctrl-C after its first check; its console output."""
    logged, sent = FakeRun.log_metrics, []

    def log_then_ctrl_c(self: FakeRun, metrics, step=None) -> None:
        logged(self, metrics, step)
        if not sent and "valid_acc" in metrics:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)

    monkeypatch.setattr(FakeRun, "log_metrics", log_then_ctrl_c)
    try:
        code, out = _cli(*args)
    finally:
        monkeypatch.setattr(FakeRun, "log_metrics", logged)
    assert code == 130, out
    return out


def _start(tiny: Path, run_dir: Path, work: Path, monkeypatch: pytest.MonkeyPatch) -> FakeRun:
    """An as-reader run with its own learning rate and a one-epoch budget, stopped after its first
    check: KILLED, as a user's Ctrl-C leaves it."""
    sets = [arg for s in (*TINY_SETS, "train.threads=1") for arg in ("--set", s)]
    _stopped(monkeypatch, "--data", tiny, "--run-dir", run_dir, "--workdir", work, *sets, *THE_RUN)
    return _last_point(run_dir)


def _last_point(run_dir: Path) -> int:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["step"]


def _files(run_dir: Path) -> dict[str, str]:
    """The folder's files, less the lock that holds it while a command runs."""
    return {path: digest for path, digest in snapshot(run_dir).items() if Path(path).name != ".lock"}


def _saved_config(run_dir: Path) -> dict:
    from iaa.jobs.modeling import checkpoint

    return checkpoint.load(run_dir / "checkpoints" / "last.pt")["config"]


def test_a_resume_without_model_or_config_goes_on_with_the_runs_own_config(
        tiny: Path, tmp_path: Path, tracker: FakeTracker, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    stopped_at = _start(tiny, run_dir, work, monkeypatch)
    assert stopped_at < BATCHES

    code, out = _cli("--resume", "--run-dir", run_dir, "--workdir", work)

    assert code == 0, out
    assert _last_point(run_dir) == BATCHES                          # its own budget: one epoch, not the preset's
    saved = _saved_config(run_dir)
    assert (saved["model"]["kind"], saved["train"]["lr"], saved["train"]["max_epochs"]) == ("as-reader", 0.003, 1.0)
    [run] = tracker.runs.values()                                   # the same tracked run, finished
    assert run.state == "FINISHED" and run.params["train.max_epochs"] == "1.0"


def test_a_resume_reads_its_checkpoint_once_before_the_session_loads_it(
        tiny: Path, tmp_path: Path, tracker: FakeTracker, monkeypatch: pytest.MonkeyPatch) -> None:
    """The config a resume goes on with and the check that holds that config to the checkpoint
    read one load of ``last.pt``; the session that resumes loads it once more, for its weights."""
    from iaa.jobs.modeling import checkpoint

    run_dir, work = tmp_path / "run", tmp_path / "work"
    _start(tiny, run_dir, work, monkeypatch)
    loaded, load = [], checkpoint.load
    monkeypatch.setattr(checkpoint, "load", lambda path: loaded.append(Path(path).name) or load(path))

    code, out = _cli("--resume", "--run-dir", run_dir, "--workdir", work)

    assert code == 0, out
    assert _last_point(run_dir) == BATCHES
    assert loaded.count("last.pt") == 2


def test_a_resume_without_model_or_config_takes_sets_on_top_of_the_runs_config(
        tiny: Path, tmp_path: Path, tracker: FakeTracker, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--set train.max_epochs`` extends the budget; the data given is no reason to leave the
    run's config."""
    run_dir, work = tmp_path / "run", tmp_path / "work"
    _start(tiny, run_dir, work, monkeypatch)

    code, out = _cli("--resume", "--data", tiny, "--run-dir", run_dir, "--workdir", work,
                     "--set", "train.max_epochs=2")

    assert code == 0, out
    assert _last_point(run_dir) == 2 * BATCHES
    saved = _saved_config(run_dir)
    assert (saved["model"]["kind"], saved["train"]["lr"], saved["train"]["max_epochs"]) == ("as-reader", 0.003, 2.0)
    [run] = tracker.runs.values()
    assert run.state == "FINISHED"


@pytest.mark.parametrize("given", [("--model", "iaa"), ("--set", "train.lr=0.01")], ids=["model", "set"])
def test_a_resume_its_checkpoint_refuses_leaves_the_run_and_its_record_as_they_were(
        tiny: Path, tmp_path: Path, tracker: FakeTracker, monkeypatch: pytest.MonkeyPatch,
        given: tuple[str, str]) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    _start(tiny, run_dir, work, monkeypatch)
    [run] = tracker.runs.values()
    assert run.state == "KILLED" and "interrupted" in run.tags
    before, record = _files(run_dir), copy.deepcopy((run.state, run.tags, run.params, run.metrics))

    code, out = _cli("--resume", "--run-dir", run_dir, "--workdir", work, *given)

    assert list(tracker.runs.values()) == [run]
    assert (run.state, run.tags, run.params, run.metrics) == record         # still KILLED, tags as the stop left them
    assert _files(run_dir) == before
    key = "model.kind" if given[0] == "--model" else "train.lr"
    assert_one_message(code, out, "cannot resume from", "the config differs", key)


def test_a_resume_given_the_runs_own_flags_builds_its_config_from_them_as_before(
        tiny: Path, tmp_path: Path, tracker: FakeTracker, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--model`` (and the run's other settings) given, the config is built from them as
    before and held to the checkpoint: the run's own flags resume it."""
    run_dir, work = tmp_path / "run", tmp_path / "work"
    _start(tiny, run_dir, work, monkeypatch)
    sets = [arg for s in (*TINY_SETS, "train.threads=1") for arg in ("--set", s)]

    code, out = _cli("--resume", "--data", tiny, "--run-dir", run_dir, "--workdir", work, *sets, *THE_RUN)

    assert code == 0, out
    assert _last_point(run_dir) == BATCHES


def test_a_resume_of_the_runs_config_stopped_by_sigint_prints_a_line_that_resumes_it(
        tiny: Path, tmp_path: Path, tracker: FakeTracker, monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    _start(tiny, run_dir, work, monkeypatch)

    out = _stopped(monkeypatch, "--resume", "--run-dir", run_dir, "--workdir", work, "--set", "train.max_epochs=2")

    [line] = [text for text in out.splitlines() if text.startswith("interrupted by SIGINT")]
    argv = shlex.split(line.split("resume with: ", 1)[1])
    assert argv[:2] == ["iaa-cli", "train"] and "--resume" in argv and "--model" not in argv
    code, out = _cli(*argv[2:])
    assert code == 0, out
    assert _last_point(run_dir) == 2 * BATCHES
    assert _saved_config(run_dir)["model"]["kind"] == "as-reader"
    [run] = tracker.runs.values()
    assert run.state == "FINISHED"
