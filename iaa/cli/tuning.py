"""``tune``: a hyperparameter sweep on the cluster."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import click

from iaa.cli.adapters import ray_launcher, open_tracker
from iaa.cli.options import (MODELS, Duration, Finite, need_data,
                             cluster_options, config_options, json_option, workdir_option)
from iaa.cli.output import emit, friendly, progress_shown
from iaa.data.datasets import TUNE_DATASETS
from iaa.jobs.config.presets import SAMPLERS

_log = logging.getLogger(__name__)


@click.command()
@click.option("--dataset", type=click.Choice(TUNE_DATASETS),
              help="The dataset prepared under the workdir; with --data, the one its manifest names (checked).")
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A prepared data folder; its dataset comes from its manifest.")
@click.option("--model", "model_kind", type=MODELS, default="iaa", show_default=True)
@click.option("--num-samples", type=click.IntRange(1, 100_000), default=None, help="Trials [default: per dataset preset].")
@click.option("--max-concurrent", type=click.IntRange(1, 1024), default=None, help="Trials at once [default: what the cluster fits].")
@click.option("--max-epochs", type=Finite(min=0, min_open=True), default=None, help="Epochs per trial [default: per dataset preset].")
@click.option("--time-budget", "time_budget_s", type=Duration(), default=None, metavar="DURATION",
              help="Stop the sweep when its trials have run this long in all (90m, 2h, 1h30m), over every "
                   "--resume; the running trials stop where they stand and their checks count. A resume keeps "
                   "the sweep's budget unless given another. [default: none]")
@click.option("--search-space", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML search space overriding the paper's grid.")
@click.option("--grace-period", type=click.IntRange(1, 10**6), default=None,
              help="ASHA: validation checks before a trial may be stopped [default: per dataset preset].")
@click.option("--reduction-factor", type=Finite(min=1, min_open=True), default=None,
              help="ASHA: keep the best 1/F of the trials at each rung [default: per dataset preset].")
@click.option("--workers-per-trial", type=click.IntRange(1, 1024), default=None,
              help="Ray Train workers per trial [default: 1; a resumed sweep: its own].")
@click.option("--gpus-per-worker", type=Finite(min=0), default=None,
              help="GPUs (or a share of one) per worker [default: 0; a resumed sweep: its own].")
@click.option("--name", "sweep_name", help="Sweep name [default: DATASET-MODEL-<short id>, new for every sweep].")
@click.option("--sampler", type=click.Choice(SAMPLERS), default=None,
              help="How trials are proposed, all seeded by --seed: tpe (multivariate TPE), gp (a Gaussian "
                   "process), random, cmaes (CMA-ES; it models numeric parameters only, categorical ones are "
                   "drawn at random; needs pip install 'iaa[cmaes]'), each after a space-filling start and never "
                   "proposing a configuration twice; or grid (every configuration of a space of value lists, "
                   "in a seeded order; at most that many trials). A resumed sweep keeps its own. [default: tpe]")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the sampler (its space-filling start and its proposals); the trials train with the "
                   "config's train.seed (--set train.seed=N).")
@click.option("--warm-start", metavar="SWEEP",
              help="Begin with the scored trials of the earlier sweep SWEEP (of this dataset and model; a "
                   "default-named prefix such as demo-iaa means its latest): the sampler proposes from them at once "
                   "and never repeats their configurations. Trials outside this search space are left out, and "
                   "counted. A new sweep only.")
@click.option("--try-first", type=click.Path(exists=True, dir_okay=False, path_type=Path), metavar="FILE",
              help="YAML: a configuration, or a list of them (searched keys and values in the search space, "
                   "e.g. '- {train.lr: 4.0e-3, model.steps: 3}'), that the first trials run in order, each to its "
                   "end (ASHA leaves them alone); a searched key left out is proposed by the sampler, which then "
                   "learns from their scores and never proposes them again. A new sweep only.")
@config_options
@workdir_option
@cluster_options
@click.option("--register", metavar="NAME",
              help="Register the best trial's MLflow model under NAME [a resumed sweep: the name it began with].")
@click.option("--optuna-storage", metavar="URL",
              help="Optuna RDB storage of the sweep's study [default: a SQLite file, WORKDIR/optuna.db].")
@click.option("--verbose", is_flag=True, help="Also print Ray Tune's own status tables and result boxes.")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[NAME]",
              help="Continue the interrupted sweep NAME (or --name; alone: the latest of this dataset and model).")
@json_option
@friendly
def tune(address: str | None, sweep_name: str | None, resume: str | None, as_json: bool, **request: Any) -> None:
    """Search hyperparameters with Optuna (TPE by default, or --sampler) on Ray Tune, with ASHA and MLflow tracking."""
    if resume and sweep_name and resume != sweep_name:
        raise click.UsageError(f"--resume {resume} and --name {sweep_name} name different sweeps")
    if not resume:                       # --resume NAME: the sweep's record names its data
        need_data(request["dataset"], request["data"])
    from iaa.jobs.tune import tune as job

    req = job.TuneRequest(**request, name=resume or sweep_name, resume=resume is not None, address=address,
                          show_progress=progress_shown())
    plan = job.settle(req)               # a bad request fails here, before Ray or MLflow loads
    _announce(plan, address)
    emit(job.run(plan, open_tracker, ray_launcher(address, plan.storage_path)), as_json,
          keys=("sweep", "best_valid_acc", "model_uri"))


def _announce(plan: Any, address: str | None) -> None:
    """The first line, once the sweep is settled and before the libraries load and Ray starts
    (which take seconds, in silence otherwise)."""
    what = plan.dataset if plan.data is None else f"{plan.dataset} ({plan.data})"
    verb = f"resuming sweep {plan.name}" if plan.recorded is not None else f"starting sweep {plan.name}"
    ray = "" if plan.nothing_left else f", then starting {f'the Ray cluster at {address}' if address else 'a local Ray cluster'}"
    _log.info(f"tune: {verb} of {plan.base.model.kind} on {what}: loading PyTorch, MLflow and Optuna{ray}...")
