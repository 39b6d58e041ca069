"""One voice: the jobs log and name options by their Python names; the command line spells the
flags and installs the one console handler; a library caller hears nothing it did not ask for."""

from __future__ import annotations

import json
import logging

import pytest
from click.testing import CliRunner

from iaa.cli.flags import render
from iaa.cli.group import cli
from iaa.jobs.evaluation.closing import Command


def test_a_command_renders_with_the_flags_of_its_own_command() -> None:
    cmd = Command.of("train", data="/d ir", sets=("a=1", "b=2"), workers=None, register=False, resume=True)
    assert str(cmd) == "iaa-cli train `data` '/d ir' `sets` a=1 `sets` b=2 `resume`"
    assert render(str(cmd), cli) == "iaa-cli train --data '/d ir' --set a=1 --set b=2 --resume"
    # the same Python name is another flag in another command
    assert render("iaa-cli ensemble `workers_per_trial` 2", cli) == "iaa-cli ensemble --workers-per-member 2"
    assert render("iaa-cli ensemble `no_calibrate`", cli) == "iaa-cli ensemble --no-calibrate"   # an on/off flag off
    assert render("iaa-cli distill `ensemble_dir` E", cli) == "iaa-cli distill --ensemble E"
    assert render("iaa-cli serve `model_uri` models:/m/1", cli) == "iaa-cli serve --model models:/m/1"


def test_only_known_options_are_spelled_and_nothing_outside_a_command_line() -> None:
    assert render("give `run_dir`; ``run_dir`` is code; `nonsense` stays", cli) == \
        "give --run-dir; ``run_dir`` is code; `nonsense` stays"
    assert render("give `run_dir`") == "give `run_dir`"           # no click context: a library caller


def test_a_job_error_names_the_flag_on_the_command_line(tmp_path) -> None:
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest

    with pytest.raises(Exception) as caught:             # the job's own words, for a library caller
        EnsembleRequest(workdir=tmp_path)
    assert "`sweep`" in str(caught.value)
    result = CliRunner().invoke(cli, ["ensemble", "--workdir", str(tmp_path)])
    assert result.exit_code == 1
    assert "--sweep" in result.output and "`" not in result.output


def _stderr_lines(capsys: pytest.CaptureFixture[str]) -> list[str]:
    return capsys.readouterr().err.splitlines()


def test_the_library_installs_no_handler(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    logging.getLogger("iaa.jobs.tune.settle").warning("a note")
    assert _stderr_lines(capsys) == []                   # pytest's own capture aside, nothing was printed
    assert [r.getMessage() for r in caplog.records] == ["a note"]


def test_the_console_handler_speaks_text_json_or_only_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    from iaa import logs

    log = logging.getLogger("iaa.jobs.example")
    logs.to_console(render=lambda text: render(text, cli))
    log.info("progress with `run_dir`")
    log.warning("careful")
    assert _stderr_lines(capsys) == ["progress with --run-dir", "warning: careful"]

    logs.to_console(quiet=True)
    log.info("progress")
    log.warning("careful")
    assert _stderr_lines(capsys) == ["warning: careful"]

    logs.to_console(json_lines=True)
    logs.event(log, "trial_restored", "trial 3 restored from check 2", trial="3", check=2)
    (line,) = _stderr_lines(capsys)
    assert json.loads(line) == {"level": "info", "logger": "iaa.jobs.example", "message": "trial 3 restored from check 2",
                                "event": "trial_restored", "trial": "3", "check": 2}
    assert len([h for h in logging.getLogger("iaa").handlers]) == 1     # each call replaced the last


def test_a_sweeps_trial_events_are_json_lines_with_their_fields(capsys: pytest.CaptureFixture[str]) -> None:
    """``--log-format json``: a program following a sweep reads each trial event's fields, not its words."""
    from iaa import logs
    from iaa.jobs.sweeps.console import SweepConsole

    logs.to_console(json_lines=True)
    try:
        console = SweepConsole(None, ["train.lr"])
        console.trial_started("trial-0000", {"train.lr": 0.002})
        console.trial_checked("trial-0000", {"checks": 1, "epoch": 0.5, "valid_acc": 0.25, "best_valid_acc": 0.25})
        console.trial_restored("trial-0000", 1)
        console.trial_ended("trial-0000", "asha")
        lines = [json.loads(line) for line in _stderr_lines(capsys)]
    finally:
        logs.to_console()
    events = [{k: v for k, v in line.items() if k not in ("level", "logger", "message")} for line in lines]
    assert events == [
        {"event": "trial_started", "trial": "trial-0000", "params": {"train.lr": 0.002}},
        {"event": "trial_checked", "trial": "trial-0000", "check": 1, "epoch": 0.5, "valid_acc": 0.25,
         "best_valid_acc": 0.25},
        {"event": "trial_restored", "trial": "trial-0000", "check": 1, "restores": 1},
        {"event": "trial_ended", "trial": "trial-0000", "state": "stopped", "reason": "asha", "checks": 1,
         "best_valid_acc": 0.25}]
    assert "stopped by ASHA" in lines[-1]["message"]


def test_quiet_and_json_are_options_of_the_command_line(tmp_path) -> None:
    result = CliRunner().invoke(cli, ["--quiet", "--log-format", "json", "prepare", "--help"])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(cli, ["--log-format", "yaml", "prepare", "--help"]).exit_code == 2


def test_a_commands_paths_are_absolute_so_it_runs_from_any_folder(tmp_path, monkeypatch) -> None:
    from pathlib import Path

    from iaa.jobs.evaluation.closing import where

    monkeypatch.chdir(tmp_path)
    cmd = Command.of("evaluate", checkpoint="runs/best.pt", members=(Path("a.pt"),), split="valid",
                     **where(Path("work")), tracking_uri="sqlite:///m.db")
    assert dict(cmd.options) == {"checkpoint": str(tmp_path / "runs/best.pt"), "members": (str(tmp_path / "a.pt"),),
                                 "split": "valid", "workdir": str(tmp_path / "work"), "tracking_uri": "sqlite:///m.db"}


def test_a_line_said_while_a_progress_bar_runs_starts_a_line_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bar is cleared for the line and drawn again under it, never continued by it."""
    import io

    from tqdm import tqdm

    from iaa import logs

    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    logs.to_console()
    with tqdm(total=10, desc="parsing", file=err) as bar:
        bar.update(3)
        logging.getLogger("iaa.jobs.datasets.prepare").warning("no valid split in the source")
        drawn = err.getvalue()
    before = drawn[:drawn.index("warning: no valid split")]
    assert before.endswith("\r") and "parsing" in before            # the bar's line cleared first
    assert "parsing" in drawn[drawn.index("no valid split"):]         # and the bar drawn again after it
