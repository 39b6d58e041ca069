"""Ensemble commands: ``ensemble`` (average several seeds) and ``distill`` (one student of an ensemble)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from iaa.cli.adapters import ray_launcher, workdir_tracker
from iaa.cli.options import (MODELS, Finite, address_option, cluster_options, config_options, data_options,
                             json_option, tracking_option, workdir_option)
from iaa.cli.output import CLOSING_KEYS, print_summary, emit, friendly, progress_shown


@click.command()
@click.option("--sweep", help="Name of a finished sweep under the workdir.")
@click.option("--members", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Checkpoints to ensemble as they are (repeat the flag, or list them after one flag).")
@click.argument("more_members", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@click.option("--top-configs", type=click.IntRange(1, 1000), default=1, show_default=True, help="K best configurations of the sweep.")
@click.option("--seeds", type=click.IntRange(1, 1000), default=5, show_default=True, help="N seeds of each configuration.")
@click.option("--select", type=click.Choice(["all", "top-p", "greedy"]), default="all", show_default=True)
@click.option("--p", "p", type=Finite(0, 1, min_open=True), default=0.5, show_default=True, help="Fraction kept by --select top-p.")
@click.option("--calibrate/--no-calibrate", default=True, show_default=True,
              help="Scale the averaged distributions by the temperature that fits them best on valid "
                   "(answers unchanged); predict, serve and the logged model answer with it.")
@click.option("--name", "name", help="Ensemble name [default: from the sweep or members].")
@click.option("--workers-per-member", "--workers", "workers_per_trial", type=click.IntRange(1, 1024), default=1,
              show_default=True, help="Ray Train workers for each member that must be trained (as tune's --workers-per-trial).")
@click.option("--gpus-per-worker", type=Finite(min=0), default=0.0, show_default=True,
              help="GPUs per worker for the members that must be trained.")
@click.option("--register", metavar="NAME", help="Register the ensemble's MLflow model under NAME.")
@click.option("--overwrite", is_flag=True, help="Replace a finished ensemble of the same name.")
@click.option("--verbose", is_flag=True, help="Also print Ray Tune's own status tables while members train.")
@workdir_option
@cluster_options
@json_option
@friendly
def ensemble(members: tuple[Path, ...], more_members: tuple[Path, ...], workdir: Path, tracking_uri: str | None,
             address: str | None, as_json: bool, **request: Any) -> None:
    """Average the pointer-sum distributions of several seeds (paper: 5-seed ensembles)."""
    from iaa.jobs.ensemble import ensemble as job
    from iaa.jobs.ensemble.ensemble_request import EnsembleRequest

    req = EnsembleRequest(members=members + more_members, workdir=workdir, address=address,
                          tracking_uri=tracking_uri, show_progress=progress_shown(), **request)
    store = tracking_uri or job.sweep_store(workdir, req.sweep)          # a sweep's ensemble joins its runs
    emit(job.run(req, workdir_tracker(workdir, store), ray_launcher(req.address, req.storage_path)), as_json,
          keys=("name", "valid_acc", "test_acc", "ensemble_dir", "model_uri"))


@click.command()
@click.option("--ensemble", "ensemble_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="An ensemble folder from `iaa-cli ensemble` (WORKDIR/ensembles/NAME): the teacher.")
@click.option("--model", "model_kind", type=MODELS, help="Student variant [default: the members'].")
@config_options
@click.option("--alpha", type=Finite(0, 1), default=None,
              help="Weight of the gold NLL; 1 - alpha goes to the KL to the teacher (1: ordinary training) "
                   "[default: the config's distill.alpha where --config or --set gives it, else 0.5].")
@click.option("--temperature", type=Finite(0, 1000, min_open=True), default=None,
              help="Softens teacher and student alike [default: the config's distill.temperature where --config "
                   "or --set gives it, else 1].")
@click.option("--train-examples", type=click.IntRange(min=1), default=None,
              help="Distil on the first N training examples only [default: all].")
@click.option("--refresh-teacher", is_flag=True, help="Compute the teacher again even where a stored one exists.")
@click.option("--run-dir", type=click.Path(path_type=Path), help="[default: WORKDIR/runs/distill-ENSEMBLE-MODEL-seedN]")
@click.option("--overwrite", is_flag=True, help="Replace the run the run directory holds and start afresh.")
@click.option("--resume", is_flag=True, help="Continue the student's run from its run directory's last checkpoint.")
@click.option("--register", metavar="NAME", help="Also register the student's MLflow model under NAME.")
@click.option("--teacher-workers", "--workers", "workers", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Score the teacher's members as this many parallel Ray tasks; 0: in this process (unless --address).")
@address_option
@tracking_option
@workdir_option
@json_option
@friendly
def distill(ensemble_dir: Path, model_kind: str | None, config_file: Path | None, sets: tuple[str, ...],
            alpha: float | None, temperature: float | None, train_examples: int | None, refresh_teacher: bool,
            run_dir: Path | None, resume: bool, overwrite: bool, register: str | None, workers: int,
            address: str | None, tracking_uri: str | None, workdir: Path, as_json: bool) -> None:
    """Train one reader against an ensemble's averaged distributions (knowledge distillation)."""
    from functools import partial

    from iaa.jobs.distill import distill as job
    from iaa.jobs.distill import outcome
    from iaa.jobs.workdir import names, rundir
    from iaa.jobs.distill import teacher
    from iaa.jobs.train import train as train_job

    names.registered_name(register)
    if resume and overwrite:
        raise click.UsageError("give --resume (continue the run) or --overwrite (replace it), not both")
    from iaa.platform import teacher_ray

    tracker = workdir_tracker(workdir, tracking_uri)
    req = job.DistillRequest(ensemble_dir, model_kind=model_kind, config_file=config_file, sets=sets, alpha=alpha,
                             temperature=temperature, train_examples=train_examples, run_dir=run_dir,
                             workdir=workdir, tracking_uri=tracking_uri, refresh_teacher=refresh_teacher,
                             register=register, teacher_workers=workers, address=address,
                             show_progress=progress_shown(), resume=resume)
    score = (teacher_ray.scorer(teacher.score_member, req.teacher_workers or None, req.address, progress_shown())
             if (req.teacher_workers or req.address) else teacher.score_in_process)
    claim = partial(rundir.claim, resume=resume, overwrite=overwrite)
    result = job.run(req, train=train_job.tracked_in(tracker), score=score, claim=claim, tracker=tracker)
    print_summary(outcome.describe, result)
    emit(result, as_json, keys=CLOSING_KEYS)
