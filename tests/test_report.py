"""``iaa-cli report``: the figure's data is the MLflow metric history, and the PNG is written.

Runs are logged straight into a temporary SQLite store (no Ray, no training), with a known
history, so the test can compare what the command plotted with what MLflow holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from _faults import assert_says
from iaa.cli import cli
from iaa.jobs.workdir.paths import Workdir
from iaa.platform.tracking import queries
from iaa.platform.tracking import store as tracking

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HISTORY = {"iaa": [(200, 0.31), (400, 0.36), (600, 0.41)], "as-reader": [(200, 0.30), (400, 0.33), (600, 0.35)]}


def _log_run(uri: str, experiment: str, name: str, model: str, points: list[tuple[int, float]], *,
             batch: int = 32, workers: str = "0", parent: str | None = None, sweep: str | None = None) -> str:
    tags = {"model": model, "workers": workers, **({"sweep": sweep} if sweep else {})}
    run = tracking.Run.start(uri, experiment, name, tags=tags, parent_run_id=parent)
    run.log_params({"train": {"batch_size": batch}, "model": {"kind": model}})
    for step, acc in points:
        run.log_metrics({"valid_acc": acc, "step": step, "train_loss": 2.0 - acc}, step=step)
    run.end()
    return run.run_id


def _report(workdir: Path, *args: str) -> dict:
    result = CliRunner().invoke(cli, ["report", "--workdir", str(workdir), "--json", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture()
def store(tmp_path: Path) -> tuple[Path, str]:
    uri = Workdir(tmp_path).tracking_uri()
    for model, points in HISTORY.items():
        _log_run(uri, "train-demo", f"demo-{model}-seed0", model, points)
    return tmp_path, uri


def test_report_plots_the_metric_history(store: tuple[Path, str]) -> None:
    workdir, uri = store
    out = workdir / "fig" / "curves.png"
    result = _report(workdir, "--experiment", "train-demo", "--out", str(out), "--baseline", "0.28")
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 5000
    assert {r["model"] for r in result["runs"]} == set(HISTORY)
    for r in result["runs"]:
        history = queries.metric_history(uri, r["run_id"], "valid_acc")
        assert r["y"] == [m.value for m in history]
        assert r["steps"] == [m.step for m in history]
        assert r["x"] == [m.step * 32 for m in history]          # examples seen: step x batch size
        assert r["y"] == [acc for _, acc in HISTORY[r["model"]]]
    assert result["baseline"] == 0.28


def test_report_x_axes_and_workers(tmp_path: Path) -> None:
    uri = Workdir(tmp_path).tracking_uri()
    run_id = _log_run(uri, "train-demo", "two-workers", "iaa", [(10, 0.5), (20, 0.6)], batch=8, workers="2")
    out = tmp_path / "f.png"
    examples = _report(tmp_path, "--experiment", "train-demo", "--out", str(out))["runs"][0]
    assert examples["run_id"] == run_id and examples["x"] == [160.0, 320.0]   # 10 x 8 x 2, 20 x 8 x 2
    steps = _report(tmp_path, "--experiment", "train-demo", "--out", str(out), "--x", "steps")["runs"][0]
    assert steps["x"] == [10.0, 20.0]
    seconds = _report(tmp_path, "--experiment", "train-demo", "--out", str(out), "--x", "seconds")["runs"][0]
    assert all(s >= 0 for s in seconds["x"]) and seconds["x"] == sorted(seconds["x"])
    loss = _report(tmp_path, "--experiment", "train-demo", "--out", str(out), "--metric", "train_loss")["runs"][0]
    assert loss["y"] == pytest.approx([1.5, 1.4])


def test_report_draws_a_sweeps_children(tmp_path: Path) -> None:
    uri = Workdir(tmp_path).tracking_uri()
    parent = tracking.Run.start(uri, "tune-demo", "sweep")
    parent.log_metrics({"best_valid_acc": 0.9})
    parent.end()
    kids = {_log_run(uri, "tune-demo", f"sweep-t{i}", "iaa", [(1, 0.1 * i), (2, 0.2 * i)], parent=parent.run_id)
            for i in (1, 2, 3)}
    out = tmp_path / "sweep.png"
    by_experiment = _report(tmp_path, "--experiment", "tune-demo", "--out", str(out))
    assert {r["run_id"] for r in by_experiment["runs"]} == kids
    assert by_experiment["skipped"] == [parent.run_id]            # the parent has no valid_acc history
    ensemble = tracking.Run.start(uri, "tune-demo", "ensemble-sweep", tags={"kind": "ensemble"},
                                  parent_run_id=parent.run_id)
    ensemble.log_metrics({"valid_acc": 0.95})                      # one figure, and no batches of its own
    ensemble.end()
    with_ensemble = _report(tmp_path, "--experiment", "tune-demo", "--out", str(out))
    assert {r["run_id"] for r in with_ensemble["runs"]} == kids
    assert set(with_ensemble["skipped"]) == {parent.run_id, ensemble.run_id}
    under_parent = _report(tmp_path, "--experiment", "tune-demo", "--out", str(out), "--runs", parent.run_id)
    assert {r["run_id"] for r in under_parent["runs"]} == kids and under_parent["skipped"] == [ensemble.run_id]
    named = CliRunner().invoke(cli, ["report", "--workdir", str(tmp_path), "--experiment", "tune-demo",
                                     "--out", str(out), "--runs", ensemble.run_id])
    assert named.exit_code == 1                                     # asked for by name: said, not skipped
    assert_says(named.stderr, ensemble.run_id, "no train.batch_size", "--x steps")
    ensemble_steps = _report(tmp_path, "--experiment", "tune-demo", "--out", str(out), "--x", "steps")
    assert ensemble.run_id in {r["run_id"] for r in ensemble_steps["runs"]}
    by_parent = _report(tmp_path, "--experiment", "tune-demo", "--out", str(out), "--runs", parent.run_id)
    assert {r["run_id"] for r in by_parent["runs"]} == kids
    one, two, _ = sorted(kids)
    assert [r["run_id"] for r in _report(tmp_path, "--experiment", "tune-demo", "--out", str(out),
                                         "--runs", one)["runs"]] == [one]
    listed = _report(tmp_path, "--experiment", "tune-demo", "--out", str(out), "--runs", one, two)["runs"]
    repeated = _report(tmp_path, "--experiment", "tune-demo", "--out", str(out), "--runs", one, "--runs", two)["runs"]
    assert {r["run_id"] for r in listed} == {r["run_id"] for r in repeated} == {one, two}
    stray = CliRunner().invoke(cli, ["report", "--workdir", str(tmp_path), "--experiment", "tune-demo",
                                     "--out", str(out), one])
    assert stray.exit_code == 2 and "after --runs" in stray.output


def test_report_names_what_is_missing(store: tuple[Path, str]) -> None:
    workdir, _ = store
    out = workdir / "x.png"
    runner = CliRunner()
    missing = runner.invoke(cli, ["report", "--workdir", str(workdir), "--experiment", "train-cnn", "--out", str(out)])
    assert missing.exit_code != 0 and "train-cnn" in missing.output and "train-demo" in missing.output
    no_metric = runner.invoke(cli, ["report", "--workdir", str(workdir), "--experiment", "train-demo",
                                    "--metric", "nope", "--out", str(out)])
    assert no_metric.exit_code != 0 and "nope" in no_metric.output
    bad_run = runner.invoke(cli, ["report", "--workdir", str(workdir), "--experiment", "train-demo",
                                  "--runs", "abc", "--out", str(out)])
    assert bad_run.exit_code != 0 and "abc" in bad_run.output
    assert not out.exists()


def test_legend_entries_that_would_read_the_same_carry_their_run_ids() -> None:
    from iaa.jobs.reports.report import Curve, labels

    def curve(run_id: str, name: str, model: str) -> Curve:
        return Curve(run_id, name, model, (1,), (1.0,), (0.5,))

    twice = [curve("aaaaaaaa11", "demo-iaa-seed0", "iaa"), curve("bbbbbbbb22", "demo-iaa-seed0", "iaa"),
             curve("cccccccc33", "run", "as-reader")]
    assert labels(twice) == ["demo-iaa-seed0 [aaaaaaaa]", "demo-iaa-seed0 [bbbbbbbb]", "run (as-reader)"]


def test_the_trials_of_two_sweeps_are_told_apart_by_their_sweeps_names(tmp_path: Path) -> None:
    """Every sweep numbers its trials from trial-0000: drawn together, each trial's legend entry and
    line begin with its sweep's name; the trials of one sweep alone read as their runs are named."""
    workdir = tmp_path / "work"
    uri = Workdir(workdir).tracking_uri()
    for sweep, h in (("demo-iaa-aaa111", 8), ("demo-iaa-bbb222", 16)):
        parent = tracking.Run.start(uri, "tune-demo", sweep, tags={"sweep": sweep})
        parent.end()
        _log_run(uri, "tune-demo", f"trial-0000 h={h}", "iaa", HISTORY["iaa"], parent=parent.run_id, sweep=sweep)
    out = workdir / "sweeps.png"
    result = CliRunner().invoke(cli, ["report", "--workdir", str(workdir), "--experiment", "tune-demo",
                                      "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = sorted(line.split(":")[0] for line in result.output.splitlines() if "points;" in line)
    assert lines == ["demo-iaa-aaa111 trial-0000 h=8 (iaa)", "demo-iaa-bbb222 trial-0000 h=16 (iaa)"]
    [run_id] = [r.run_id for r in queries.find_runs(uri, "tune-demo", {"sweep": "demo-iaa-aaa111"}) if r.parent_run_id]
    one = CliRunner().invoke(cli, ["report", "--workdir", str(workdir), "--experiment", "tune-demo", "--out", str(out),
                                   "--runs", run_id])
    assert one.exit_code == 0 and one.output.startswith("trial-0000 h=8 (iaa): 3 points"), one.output
    drawn = _report(workdir, "--experiment", "tune-demo", "--out", str(out))["runs"]
    assert sorted(run["sweep"] for run in drawn) == ["demo-iaa-aaa111", "demo-iaa-bbb222"]


def test_the_best_of_a_loss_is_its_lowest_and_numbers_are_grouped(store: tuple[Path, str]) -> None:
    from _faults import assert_says

    workdir, _ = store
    out = workdir / "loss.png"
    for metric, best in (("train_loss", "best 1.5900 at examples 19,200"), ("valid_acc", "best 0.4100 at examples 19,200")):
        result = CliRunner().invoke(cli, ["report", "--workdir", str(workdir), "--experiment", "train-demo",
                                          "--out", str(out), "--metric", metric])
        assert result.exit_code == 0, result.output
        line = next(line for line in result.output.splitlines() if line.startswith("demo-iaa-seed0:"))
        assert_says(line, best)


def test_with_json_the_summary_goes_to_stderr_and_stdout_holds_the_json_line_alone(store: tuple[Path, str]) -> None:
    workdir, _ = store
    for args in (["--experiment", "train-demo", "--out", str(workdir / "j.png")], ["--sweeps"]):
        result = CliRunner().invoke(cli, ["report", "--workdir", str(workdir), "--json", *args])
        assert result.exit_code == 0, result.output
        [line] = result.stdout.splitlines()
        assert isinstance(json.loads(line), dict)
        assert result.stderr.strip(), args                     # the summary, not dropped
    plain = CliRunner().invoke(cli, ["report", "--workdir", str(workdir), "--experiment", "train-demo",
                                     "--out", str(workdir / "p.png")])
    assert "demo-iaa-seed0:" in plain.stdout and "figure:" in plain.stdout
