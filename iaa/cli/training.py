"""Training commands: ``train`` (one reader) and ``bench`` (time the paper's workload)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from iaa.cli.adapters import ray_launcher, open_tracker
from iaa.cli.options import (MODELS, Finite, cluster_options, config_options, data_options,
                             json_option, workdir_option)
from iaa.cli.output import CLOSING_KEYS, print_summary, emit, friendly, progress_shown
from iaa.jobs.workdir.paths import Workdir


@click.command()
@data_options
@click.option("--model", "model_kind", type=MODELS, help="Reader variant [default: from config, iaa].")
@config_options
@click.option("--run-dir", type=click.Path(path_type=Path), help="[default: WORKDIR/runs/DATASET-MODEL-seedN]")
@click.option("--resume", is_flag=True,
              help="Continue from the run directory's last checkpoint, with the configuration it holds "
                   "(--set on top) and on the data its run recorded (--data and --dataset may be left out; "
                   "given, they must hold the same data).")
@click.option("--overwrite", is_flag=True, help="Replace the run the run directory holds and start afresh.")
@click.option("--register", metavar="NAME", help="Also register the logged MLflow model under NAME.")
@click.option("--data-parallel-workers", "--workers", "workers", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Ray Train workers that train this one reader data-parallel; 0 trains in this process without Ray.")
@click.option("--gpus-per-worker", type=Finite(min=0), default=0.0, show_default=True,
              help="GPUs per Ray worker (NCCL); with --workers 0, any value > 0 trains on this machine's GPU.")
@cluster_options
@workdir_option
@json_option
@friendly
def train(resume: bool, overwrite: bool, as_json: bool, **request: Any) -> None:
    """Train one reader, with validation checks, checkpoints and an MLflow run.

    The data is --dataset or --data, or what the --config file names: `iaa-cli train --config
    WORKDIR/sweeps/NAME/best_config.yaml` trains a sweep's best configuration on the sweep's data.
    With none of them, `iaa-cli train --resume --run-dir DIR` continues the run on the data that DIR
    recorded (DIR/data.json)."""
    from iaa.jobs.train import train as job
    from iaa.jobs.training import summary

    if request["dataset"] is None and request["data"] is None and request["config_file"] is None:
        if not resume:
            raise click.UsageError("give --dataset NAME, --data PREPARED_DIR, or a --config file that names its data")
        if request["run_dir"] is None:
            raise click.UsageError("--resume without --dataset or --data needs the --run-dir DIR of the run "
                                   "(it names its data)")
    if resume and overwrite:
        raise click.UsageError("give --resume (continue the run) or --overwrite (replace it), not both")
    req = job.TrainRequest(**request, resume=resume, overwrite=overwrite, show_progress=progress_shown())
    result = job.run_request(req, open_tracker, ray_launcher(req.address, req.storage_path) if req.workers > 0 else None)
    print_summary(summary.describe, result)
    emit(result, as_json, keys=CLOSING_KEYS)


@click.command()
@click.option("--model", "model_kind", type=MODELS, default="iaa", show_default=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a model field (d, h, s, T ... as model.embed_dim=256) or a bench setting "
                   "(bench.batch_size=64, bench.threads, bench.steps, bench.precision ...).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@workdir_option
@json_option
@friendly
def bench(model_kind: str, sets: tuple[str, ...], device: str, workdir: Path, as_json: bool) -> None:
    """Time training steps and inference on the CBT-NE-shaped workload at the paper config;
    the result is also saved as WORKDIR/bench/MODEL-DEVICE.json."""
    from iaa.jobs.train import bench as job
    from iaa.jobs.config.job_config import parse_sets

    overrides, settings = job.settle(model_kind, parse_sets(sets))
    saved = Workdir(workdir).writable() / "bench" / f"{model_kind}-{device}.json"      # before minutes of timing
    result = job.run(model=model_kind, overrides=overrides, device=device, **settings.keywords())
    emit(job.save(result, saved), as_json)
