"""``iaa-cli report --sweeps``: the work folder's sweeps from their records, newest first, where
each stands, and a damaged record named without hiding the others."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from _faults import assert_says

pytestmark = pytest.mark.timeout(120)


def _trial(name: str, acc: float | None = 0.5, status: str = "TERMINATED", stop_reason: str = "max-epochs"):
    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.ports import TrialRecord

    return TrialRecord(trial_id=f"id-{name}", config=JobConfig(dataset="demo"), best_valid_acc=acc, status=status,
                       checks=2 if acc is not None else 0, stop_reason=stop_reason, name=name)


def _sweeps(workdir: Path) -> dict:
    """Five sweeps, written a minute apart in this order, and the record of each."""
    from iaa.jobs.config.job_config import JobConfig, to_dict
    from iaa.jobs.ports import Carried
    from iaa.jobs.sweeps import record
    from iaa.jobs.sweeps.record import SweepRecord

    base = to_dict(JobConfig(dataset="demo"))
    made = {
        "done": SweepRecord(name="done", dataset="demo", base=base, num_samples=2, wall_s=75.0,
                            trials=(_trial("trial-0000", 0.9), _trial("trial-0001", 0.95))),
        "spent": SweepRecord(name="spent", dataset="demo", base=base, num_samples=9, time_budget_s=60.0,
                             trials=(_trial("trial-0000", 0.7), _trial("trial-0001", 0.8, stop_reason="time-budget"))),
        "stopped": SweepRecord(name="stopped", dataset="demo", base=base, num_samples=4,
                               trials=(_trial("trial-0000", 0.6), _trial("trial-0001", None, status="RUNNING"))),
        "lost": SweepRecord(name="lost", dataset="demo", base=base, num_samples=2,
                            trials=(_trial("trial-0000", 0.6), _trial("trial-0001", 0.4, "ERROR", "worker-lost"))),
        "fresh": SweepRecord(name="fresh", dataset="demo", base=base, num_samples=4,
                             warm_start=Carried(sweep="done", trials=2, best=0.95)),
    }
    for i, (name, sweep) in enumerate(made.items()):
        path = record.sweep_file(workdir, name)
        path.parent.mkdir(parents=True)
        record.write(path, sweep)
        os.utime(path, (1_000_000 + 60 * i, 1_000_000 + 60 * i))
    return made


def test_each_sweep_is_listed_newest_first_with_where_it_stands(tmp_path: Path) -> None:
    from iaa.jobs.reports import sweep_list

    _sweeps(tmp_path)
    result = sweep_list.run(tmp_path)

    assert [s.name for s in result.sweeps] == ["fresh", "lost", "stopped", "spent", "done"]
    by = {s.name: s for s in result.sweeps}
    assert {name: s.state for name, s in by.items()} == {
        "done": "finished", "spent": "budget spent", "stopped": "interrupted", "lost": "lost trials",
        "fresh": "no trials recorded"}
    assert (by["done"].best_trial, by["done"].best_valid_acc, by["done"].model) == ("trial-0001", 0.95, "iaa")
    assert by["fresh"].warm_start == "done" and by["fresh"].best_valid_acc is None
    assert by["done"].resume is None and by["spent"].resume is None
    assert by["stopped"].resume.startswith("iaa-cli tune `resume` stopped")
    text = sweep_list.describe(result)
    assert_says(text, "spent    demo", "2/9", "0m00s (budget 1m00s)", "continue stopped: iaa-cli tune `resume` stopped")
    assert (by["stopped"].trials, by["stopped"].ended) == (2, 1)   # one ended, one still running when it stopped
    [row] = [line for line in text.splitlines() if line.startswith("stopped ")]
    assert row.split()[4] == "1/4"                                  # trials ended, of those asked
    assert "continue done" not in text and "continue spent" not in text
    assert result.fields()["sweeps"][0]["name"] == "fresh" and not result.warnings


def test_a_sweep_whose_lock_a_process_holds_is_running(tmp_path: Path) -> None:
    from iaa.errors import IaaError
    from iaa.jobs.reports import sweep_list
    from iaa.jobs.workdir import lock
    from iaa.jobs.workdir.paths import Workdir

    _sweeps(tmp_path)
    path = lock.beside(Workdir(tmp_path).sweep("stopped"))
    assert lock.holder(path) is None                                          # no lock file yet
    with lock.held(path, busy=IaaError):
        running = {s.name: s for s in sweep_list.run(tmp_path).sweeps}["stopped"]
        assert (running.state, running.pid, running.resume) == ("running", str(os.getpid()), None)
        assert "running (pid" in sweep_list.describe(sweep_list.run(tmp_path))
    assert lock.holder(path) is None                                          # let go at the block's end
    assert {s.name: s for s in sweep_list.run(tmp_path).sweeps}["stopped"].state == "interrupted"


def test_a_damaged_record_is_named_and_the_others_are_listed(tmp_path: Path) -> None:
    from iaa.jobs.reports import sweep_list

    _sweeps(tmp_path)
    bad = tmp_path / "sweeps" / "bad" / "sweep.json"
    bad.parent.mkdir()
    bad.write_text(json.dumps({"name": "bad", "trials": "none"}))

    result = sweep_list.run(tmp_path)

    assert len(result.sweeps) == 5
    [warning] = result.warnings
    assert_says(warning, str(bad), "trials", "expected a list")


def test_report_sweeps_prints_the_table_or_the_json(tmp_path: Path) -> None:
    from iaa.cli import cli

    _sweeps(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(cli, ["report", "--sweeps", "--workdir", str(tmp_path)])
    assert shown.exit_code == 0 and "budget spent" in shown.output
    assert f"iaa-cli tune --resume stopped --workdir {tmp_path}" in shown.output        # flags spelled
    listed = runner.invoke(cli, ["report", "--sweeps", "--workdir", str(tmp_path), "--json"])
    assert listed.exit_code == 0
    rows = json.loads(listed.output.strip().splitlines()[-1])["sweeps"]
    assert rows[-1]["state"] == "finished"
    assert next(r for r in rows if r["name"] == "stopped")["resume"] == f"iaa-cli tune --resume stopped --workdir {tmp_path}"
    both = runner.invoke(cli, ["report", "--sweeps", "--sweep", "done", "--workdir", str(tmp_path)])
    assert both.exit_code == 2 and "give one of" in both.output
    empty = runner.invoke(cli, ["report", "--sweeps", "--workdir", str(tmp_path / "nothing")])
    assert empty.exit_code == 0 and "no sweeps in" in empty.output


def test_a_folder_whose_only_record_is_damaged_says_so_not_that_it_has_no_sweeps(tmp_path: Path) -> None:
    from iaa.cli import cli
    from iaa.jobs.reports import sweep_list

    bad = tmp_path / "sweeps" / "bad" / "sweep.json"
    bad.parent.mkdir(parents=True)
    bad.write_text('{"name": "bad", "trials": [')                  # cut short: not JSON

    result = sweep_list.run(tmp_path)

    assert (result.sweeps, result.unlisted) == ((), 1)
    [warning] = result.warnings
    assert_says(warning, str(bad), "not valid JSON")
    closing = sweep_list.describe(result)
    assert_says(closing, "no readable sweeps", str(tmp_path), "1 not listed (above)")
    assert "no sweeps in" not in closing
    shown = CliRunner().invoke(cli, ["report", "--sweeps", "--workdir", str(tmp_path)])
    assert shown.exit_code == 0
    assert shown.output.index("not valid JSON") < shown.output.index("1 not listed (above)")
    assert "no sweeps in" not in shown.output


def test_the_table_counts_the_records_it_could_not_list(tmp_path: Path) -> None:
    from iaa.jobs.reports import sweep_list

    _sweeps(tmp_path)
    for name in ("bad", "worse"):
        bad = tmp_path / "sweeps" / name / "sweep.json"
        bad.parent.mkdir()
        bad.write_text("{")

    result = sweep_list.run(tmp_path)

    assert (len(result.sweeps), result.unlisted, len(result.warnings)) == (5, 2, 2)
    assert "unlisted" not in result.fields()                      # the warnings name them in --json
    assert_says(sweep_list.describe(result).splitlines()[-1], "2 more", "not listed (above)")
    clean = sweep_list.run(tmp_path / "nothing")
    assert_says(sweep_list.describe(clean), "no sweeps in", "iaa-cli tune starts one")
