"""``train --resume --run-dir DIR`` needs no data flag: the run folder names the prepared data its
run trained on (``RUN_DIR/data.json``), data given is held to it, and a folder without the record
asks for the data. In-process on the fake tracker (tests/fakes.py), seconds each."""

from __future__ import annotations

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
from fakes import FakeRun, FakeTracker

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_prepared(tmp_path_factory.mktemp("tiny"))


@pytest.fixture
def tracker(monkeypatch: pytest.MonkeyPatch) -> FakeTracker:
    from iaa import cli

    fake = FakeTracker()
    monkeypatch.setattr(cli.training, "open_tracker", lambda uri: fake)
    return fake


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
