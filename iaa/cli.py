"""``iaa-cli``: prepare data, train, evaluate, tune, ensemble and benchmark the IAA reader.

Each command parses flags and calls one job; heavy imports happen inside commands so that
``iaa-cli --help`` stays instant.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Callable

import click

from iaa import __version__

DATASETS = ("demo", "cbt-ne", "cbt-cn", "cbt-v", "cbt-p", "cnn")
TUNE_DATASETS = ("demo", "cbt-ne", "cbt-cn", "cnn")
MODELS = ("iaa", "iaa-fixed-query", "as-reader")
DEFAULT_WORKDIR = "iaa-work"


def _emit(result: dict[str, Any], as_json: bool) -> None:
    """Print a result: a JSON object as the last stdout line with ``--json``, else key: value lines."""
    if as_json:
        click.echo(json.dumps(result, default=str))
    else:
        for key, value in result.items():
            click.echo(f"{key}: {value}")


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the errors users cause (bad data, bad config, missing files) into clear exits."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from iaa.errors import IaaError
        from iaa.jobs.config import ConfigError

        try:
            return fn(*args, **kwargs)
        except (IaaError, ConfigError, FileNotFoundError, ValueError, KeyError) as err:
            message = err.args[0] if isinstance(err, KeyError) and err.args else str(err)
            raise click.ClickException(str(message)) from err

    return wrapper


def workdir_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--workdir", type=click.Path(path_type=Path), default=DEFAULT_WORKDIR, envvar="IAA_WORKDIR",
        show_default=True, help="Where prepared data, runs, sweeps and the MLflow store live.",
    )(fn)


def config_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
                      help="Override a config value, e.g. --set train.lr=5e-4 --set model.steps=5.")(fn)
    fn = click.option("--config", "config_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                      help="YAML job config (for example a sweep's best_config.yaml).")(fn)
    return fn


def data_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--data", "data", type=click.Path(exists=True, file_okay=False, path_type=Path),
                      help="A prepared data folder (from `iaa-cli prepare`).")(fn)
    fn = click.option("--dataset", type=click.Choice(DATASETS), help="A dataset prepared under the workdir; demo is made on first use.")(fn)
    return fn


def cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option("--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                      help="MLflow tracking server; default: a SQLite store under the workdir.")(fn)
    fn = click.option("--address", envvar="RAY_ADDRESS", help="Existing Ray cluster; default: start a local one.")(fn)
    fn = click.option("--storage-path", help="Shared storage for checkpoints (NFS path or s3://); required on multi-node clusters.")(fn)
    return fn


def _need_data(dataset: str | None, data: Path | None) -> None:
    if (dataset is None) == (data is None):
        raise click.UsageError("give exactly one of --dataset NAME or --data PREPARED_DIR")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="iaa-cli")
def cli() -> None:
    """Iterative Alternating Attention reader: prepare, train, evaluate, tune and ensemble."""


@cli.command()
@click.option("--dataset", required=True, type=click.Choice(DATASETS))
@click.option("--source", type=click.Path(exists=True, path_type=Path),
              help="CBT: the CBTest folder or its data/ folder. CNN: the folder holding questions/, or the .tgz.")
@click.option("--out", type=click.Path(path_type=Path), help="Output folder [default: WORKDIR/data/DATASET].")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="fail: stop at the first bad example. skip: skip bad examples, count them and report the count.")
@click.option("--lowercase/--no-lowercase", default=None, help="Lowercase tokens [default: per dataset].")
@click.option("--min-count", type=int, default=1, show_default=True, help="Drop training words seen fewer times.")
@click.option("--max-vocab", type=int, default=None, help="Keep at most this many words (by frequency).")
@click.option("--threads", type=int, default=None, help="Parser threads [default: all cores]; the output does not depend on it.")
@workdir_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")
@_friendly
def prepare(dataset: str, source: Path | None, out: Path | None, on_error: str, lowercase: bool | None,
            min_count: int, max_vocab: int | None, threads: int | None, workdir: Path, as_json: bool) -> None:
    """Parse a corpus into Parquet shards, a vocabulary and a manifest."""
    from iaa.jobs import prepare as job

    if dataset != "demo" and source is None:
        raise click.UsageError(f"--source is required for {dataset}")
    result = job.run(dataset, source, out or workdir / "data" / dataset, on_error=on_error, lowercase=lowercase,
                     min_count=min_count, max_vocab=max_vocab, workers=threads, progress=not as_json)
    _emit(result, as_json)


@cli.command()
@data_options
@click.option("--model", "model_kind", type=click.Choice(MODELS), help="Reader variant [default: from config, iaa].")
@config_options
@click.option("--run-dir", type=click.Path(path_type=Path), help="[default: WORKDIR/runs/DATASET-MODEL-seedN]")
@click.option("--resume", is_flag=True, help="Continue from the run directory's last checkpoint.")
@click.option("--register", metavar="NAME", help="Also register the logged MLflow model under NAME.")
@click.option("--workers", type=int, default=0, show_default=True,
              help="Ray Train data-parallel workers; 0 trains in this process without Ray.")
@click.option("--gpus-per-worker", type=float, default=0.0, show_default=True,
              help="GPUs per Ray worker (NCCL); with --workers 0, any value > 0 trains on this machine's GPU.")
@cluster_options
@workdir_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")
@_friendly
def train(dataset: str | None, data: Path | None, model_kind: str | None, config_file: Path | None,
          sets: tuple[str, ...], run_dir: Path | None, resume: bool, register: str | None, workers: int,
          gpus_per_worker: float,
          tracking_uri: str | None, address: str | None, storage_path: str | None, workdir: Path, as_json: bool) -> None:
    """Train one reader, with validation checks, checkpoints and an MLflow run."""
    from iaa.jobs import resolve
    from iaa.platform import train as platform_train

    _need_data(dataset, data)
    name, prepared = resolve.data_dir(dataset, data, workdir)
    cfg = resolve.job_config(name, prepared, model_kind=model_kind, config_file=config_file, sets=sets)
    run_dir = run_dir or workdir / "runs" / f"{name}-{cfg.model.kind}-seed{cfg.train.seed}"
    result = platform_train.run(cfg, prepared, run_dir, resume=resume, workers=workers,
                                gpus_per_worker=gpus_per_worker, workdir=workdir, tracking_uri=tracking_uri,
                                address=address, storage_path=storage_path, show_progress=not as_json,
                                register=register)
    _emit(result, as_json)


@cli.command()
@click.option("--checkpoint", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@click.option("--split", required=True, type=click.Choice(["train", "valid", "test"]))
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Predictions Parquet file.")
@workdir_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")
@_friendly
def evaluate(checkpoint: Path, dataset: str | None, data: Path | None, split: str, out: Path | None,
             workdir: Path, as_json: bool) -> None:
    """Score a checkpoint on a split and write per-example predictions."""
    from iaa.jobs import evaluate as job
    from iaa.jobs import resolve

    _need_data(dataset, data)
    _, prepared = resolve.data_dir(dataset, data, workdir)
    result = job.run(checkpoint, prepared, split, out)
    if not as_json:
        click.echo(f"{split} accuracy: {result['accuracy']:.4f} over {result['examples']} examples")
    _emit(result, as_json)


@cli.command()
@data_options
@click.option("--split", default="valid", show_default=True, type=click.Choice(["train", "valid", "test"]))
@workdir_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")
@_friendly
def baseline(dataset: str | None, data: Path | None, split: str, workdir: Path, as_json: bool) -> None:
    """Accuracy of the most-frequent-candidate baseline on a split."""
    from iaa.jobs import frequency, resolve

    _need_data(dataset, data)
    _, prepared = resolve.data_dir(dataset, data, workdir)
    _emit(frequency.run(prepared, split), as_json)


@cli.command()
@click.option("--dataset", required=True, type=click.Choice(TUNE_DATASETS))
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path), help="A prepared data folder.")
@click.option("--model", "model_kind", type=click.Choice(MODELS), default="iaa", show_default=True)
@click.option("--num-samples", type=int, default=None, help="Trials [default: per dataset preset].")
@click.option("--max-concurrent", type=int, default=None, help="Trials at once [default: what the cluster fits].")
@click.option("--max-epochs", type=float, default=None, help="Epochs per trial [default: per dataset preset].")
@click.option("--search-space", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML search space overriding the paper's grid.")
@click.option("--workers-per-trial", type=int, default=1, show_default=True, help="Ray Train workers per trial.")
@click.option("--gpus-per-worker", type=float, default=0.0, show_default=True)
@click.option("--name", "sweep_name", help="Sweep name [default: DATASET-MODEL-<short id>, new for every sweep].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the TPE sampler and of the trials.")
@config_options
@workdir_option
@cluster_options
@click.option("--register", metavar="NAME", help="Register the best trial's MLflow model under NAME.")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[NAME]",
              help="Continue the interrupted sweep NAME (or --name; alone: the latest of this dataset and model).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")
@_friendly
def tune(dataset: str, data: Path | None, model_kind: str, num_samples: int | None, max_concurrent: int | None,
         max_epochs: float | None, search_space: Path | None, workers_per_trial: int, gpus_per_worker: float,
         sweep_name: str | None, seed: int, config_file: Path | None, sets: tuple[str, ...], workdir: Path,
         tracking_uri: str | None, address: str | None, storage_path: str | None, register: str | None,
         resume: str | None, as_json: bool) -> None:
    """Search hyperparameters with Optuna (TPE) on Ray Tune, with ASHA and MLflow tracking."""
    from iaa.platform import tune as job

    if resume and sweep_name and resume != sweep_name:
        raise click.UsageError(f"--resume {resume} and --name {sweep_name} name different sweeps")
    sweep_name = resume or sweep_name

    result = job.run(
        job.TuneRequest(
            dataset=dataset, data=data, model_kind=model_kind, num_samples=num_samples,
            max_concurrent=max_concurrent, max_epochs=max_epochs, search_space=search_space,
            workers_per_trial=workers_per_trial, gpus_per_worker=gpus_per_worker, name=sweep_name, seed=seed,
            config_file=config_file, sets=tuple(sets), workdir=workdir, tracking_uri=tracking_uri,
            address=address, storage_path=storage_path, resume=resume is not None, show_progress=not as_json,
            register=register,
        )
    )
    _emit(result, as_json)


@cli.command()
@click.option("--sweep", help="Name of a finished sweep under the workdir.")
@click.option("--members", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Checkpoints to ensemble as they are (repeat the flag, or list them after one flag).")
@click.argument("more_members", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@click.option("--top-configs", type=int, default=1, show_default=True, help="K best configurations of the sweep.")
@click.option("--seeds", type=int, default=5, show_default=True, help="N seeds of each configuration.")
@click.option("--select", type=click.Choice(["all", "top-p", "greedy"]), default="all", show_default=True)
@click.option("--p", "top_p", type=float, default=0.5, show_default=True, help="Fraction kept by --select top-p.")
@click.option("--name", "ensemble_name", help="Ensemble name [default: from the sweep or members].")
@click.option("--workers", "workers_per_trial", type=int, default=1, show_default=True,
              help="Ray Train workers for each member that must be trained.")
@click.option("--gpus-per-worker", type=float, default=0.0, show_default=True,
              help="GPUs per worker for the members that must be trained.")
@click.option("--register", metavar="NAME", help="Register the ensemble's MLflow model under NAME.")
@workdir_option
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")
@_friendly
def ensemble(sweep: str | None, members: tuple[Path, ...], more_members: tuple[Path, ...], dataset: str | None,
             data: Path | None, top_configs: int, seeds: int, select: str, top_p: float, ensemble_name: str | None,
             workers_per_trial: int, gpus_per_worker: float, register: str | None, workdir: Path,
             tracking_uri: str | None,
             address: str | None, storage_path: str | None, as_json: bool) -> None:
    """Average the pointer-sum distributions of several seeds (paper: 5-seed ensembles)."""
    from iaa.platform import ensemble as job

    members = tuple(members) + tuple(more_members)
    if (sweep is None) == (not members):
        raise click.UsageError("give exactly one of --sweep NAME or --members CKPT ...")
    if not 0 < top_p <= 1:
        raise click.UsageError("--p must be in (0, 1]")
    result = job.run(
        job.EnsembleRequest(
            sweep=sweep, members=members, dataset=dataset, data=data, top_configs=top_configs, seeds=seeds,
            select=select, p=top_p, name=ensemble_name, workdir=workdir, tracking_uri=tracking_uri,
            address=address, storage_path=storage_path, workers_per_trial=workers_per_trial,
            gpus_per_worker=gpus_per_worker, show_progress=not as_json, register=register,
        )
    )
    _emit(result, as_json)


@cli.command()
@click.option("--model", "model_kind", type=click.Choice(MODELS), default="iaa", show_default=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a model field (d, h, s, T ... as model.embed_dim=256) or bench.batch_size=64.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")
@_friendly
def bench(model_kind: str, sets: tuple[str, ...], device: str, as_json: bool) -> None:
    """Time training steps and inference on the CBT-NE-shaped workload at the paper config."""
    from iaa.jobs import bench as job
    from iaa.jobs.config import parse_sets

    overrides = parse_sets(sets)
    unknown = set(overrides) - {"model", "bench"}
    if unknown:
        raise click.UsageError(f"--set keys must start with model. or bench., got {sorted(unknown)}")
    result = job.run(model=model_kind, overrides=overrides.get("model", {}), device=device, **overrides.get("bench", {}))
    _emit(result, as_json)


@cli.command()
@click.option("--checkpoint", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@click.option("--split", default="valid", show_default=True, type=click.Choice(["train", "valid", "test"]))
@click.option("--example-id", "example_ids", multiple=True, metavar="ID", help="An example to explain (repeatable).")
@click.option("--first", type=int, default=None, help="Explain the split's first N examples.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="HTML page [default: explain-SPLIT.html beside the run's checkpoints folder].")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), help="Also draw the first example as a PNG figure.")
@workdir_option
@click.option("--json", "as_json", is_flag=True, help="Print the result, with every attention value, as JSON on the last line.")
@_friendly
def explain(checkpoint: Path, dataset: str | None, data: Path | None, split: str, example_ids: tuple[str, ...],
            first: int | None, out: Path | None, png: Path | None, workdir: Path, as_json: bool) -> None:
    """Show what the reader attends to at each inference step, as an HTML page (and a PNG)."""
    from iaa.jobs import explain as job
    from iaa.jobs import resolve

    _need_data(dataset, data)
    if not example_ids and not first:
        raise click.UsageError("choose examples with --example-id ID (repeatable) or --first N")
    _, prepared = resolve.data_dir(dataset, data, workdir)
    result = job.run(checkpoint, prepared, split, example_ids=example_ids, first=first, out=out, png=png)
    if as_json:
        _emit(result, True)
        return
    for r in result["examples"]:
        mark = "correct" if r["pred"] == r["gold"] else f"wrong (gold {r['candidates'][r['gold']]})"
        click.echo(f"{r['example_id']}: predicted {r['candidates'][r['pred']]} "
                   f"p={r['probs'][r['pred']]:.3f}, {mark}")
    click.echo(f"html: {result['html']}" + (f"\npng: {result['png']}" if "png" in result else ""))


@cli.command()
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="A trained reader.")
@click.option("--ensemble", "ensemble_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder written by `iaa-cli ensemble`: its selected members are averaged.")
@click.option("--input", "input_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='JSON Lines of {"id", "document", "query", "candidates"[, "answer"]}, or a CBT / CNN file.')
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="Output JSON Lines.")
@data_options
@workdir_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")
@_friendly
def predict(checkpoint: Path | None, ensemble_dir: Path | None, input_path: Path, out: Path, dataset: str | None,
            data: Path | None, workdir: Path, as_json: bool) -> None:
    """Answer cloze questions given as raw text (or a CBT / CNN file)."""
    from iaa.jobs import predict as job
    from iaa.jobs import resolve

    if (checkpoint is None) == (ensemble_dir is None):
        raise click.UsageError("give exactly one of --checkpoint CKPT or --ensemble DIR")
    checkpoints = [checkpoint] if checkpoint is not None else job.ensemble_members(ensemble_dir)
    if dataset is not None and data is not None:
        raise click.UsageError("give at most one of --dataset NAME or --data PREPARED_DIR")
    prepared = (resolve.data_dir(dataset, data, workdir)[1] if dataset or data
                else job.default_data_dir(checkpoints[0], workdir))
    result = job.run(input_path, out, checkpoints=checkpoints, data_dir=prepared)
    for warning in result["warnings"]:
        click.echo(f"warning: {warning}", err=True)
    _emit(result, as_json)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli()


if __name__ == "__main__":
    main()
