"""``report``: learning curves of tracked runs, or what a sweep learnt."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import click

from iaa.cli.options import (FiniteFloat, json_option, tracking_option, workdir_option)
from iaa.cli.output import emit, friendly, print_summary, show_warnings, shown


@click.command()
@click.option("--experiment", help="MLflow experiment: train-DATASET for train runs, tune-DATASET for sweeps.")
@click.option("--sweep", "sweep", metavar="NAME",
              help="Instead: the sweep's parameter importances, parallel coordinates and checks per trial "
                   "(from its Optuna study; --out is then a folder [default: WORKDIR/sweeps/NAME/report]).")
@click.option("--sweeps", "list_sweeps", is_flag=True,
              help="Instead: the work folder's sweeps, newest first: where each stands, its trials, best trial, "
                   "time and the sweep it began from.")
@click.option("--runs", "run_ids", multiple=True, metavar="ID",
              help="Draw only these runs (repeat the flag, or list them after one flag); a sweep's parent run "
                   "stands for its trials [default: all].")
@click.argument("more_run_ids", nargs=-1, metavar="[ID]...")
@click.option("--metric", default="valid_acc", show_default=True, help="The logged metric on the y axis.")
@click.option("--x", "x_axis", type=click.Choice(["examples", "steps", "seconds"]), default="examples", show_default=True,
              help="examples: training examples seen (step x batch size x workers); seconds: since the run started.")
@click.option("--baseline", type=FiniteFloat(), default=None, help="Draw this accuracy as a dashed line.")
@click.option("--baseline-data", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Draw the most-frequent-candidate accuracy on this prepared folder's valid split.")
@click.option("--out", type=click.Path(path_type=Path), help="The PNG to write (with --sweep: the folder).")
@tracking_option
@workdir_option
@json_option
@friendly
def report(experiment: str | None, sweep: str | None, list_sweeps: bool, run_ids: tuple[str, ...],
           more_run_ids: tuple[str, ...], metric: str, x_axis: str, baseline: float | None, baseline_data: Path | None,
           out: Path | None, tracking_uri: str | None, workdir: Path, as_json: bool) -> None:
    """Draw learning curves (a metric against examples seen) of tracked runs from the MLflow store,
    with --sweep what a sweep learnt (importances, parallel coordinates, checks per trial), or with
    --sweeps the work folder's sweeps."""
    from iaa.jobs.reports import report as job

    if [experiment is not None, sweep is not None, list_sweeps].count(True) != 1:
        raise click.UsageError("give one of --experiment (learning curves), --sweep (a sweep's analytics) and "
                               "--sweeps (the work folder's sweeps)")
    if list_sweeps:
        from iaa.jobs.reports import sweep_list

        _report_or_json(sweep_list.describe, sweep_list.run(workdir), as_json)
        return
    if sweep is not None:
        from iaa.cli.adapters import study_analyzer
        from iaa.jobs.reports import sweep_report
        from iaa.platform.tracking.tracker import MlflowTracker

        result = sweep_report.run(sweep, workdir, study_analyzer(), MlflowTracker, out=out)
        _report_or_json(sweep_report.describe, result, as_json)
        return
    if out is None:
        raise click.UsageError("--out PNG is required with --experiment")
    if more_run_ids and not run_ids:
        raise click.UsageError(f"unexpected argument {more_run_ids[0]!r}: run ids go after --runs")
    if baseline is not None and baseline_data is not None:
        raise click.UsageError("give at most one of --baseline and --baseline-data")
    from iaa.platform.tracking.tracker import MlflowTracker

    result = job.run(experiment, out, MlflowTracker, run_ids=run_ids + more_run_ids, metric=metric, x=x_axis,
                     baseline=baseline, baseline_data=baseline_data, workdir=workdir, tracking_uri=tracking_uri)
    _report_or_json(job.describe, result, as_json)


def _report_or_json(describe: Callable[[Any], str], result: Any, as_json: bool) -> None:
    """The report (``describe(result)``) is the output, on stdout; with ``--json`` it is the
    summary on stderr, as every command's is, and the JSON object is stdout's line."""
    if as_json:
        print_summary(describe, result)
        emit(result, as_json=True)             # the commands in it spelled with flags
    else:
        show_warnings(result)
        click.echo(shown(describe(result), keep_lines=True))
