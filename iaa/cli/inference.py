"""Inference commands: ``evaluate``, ``baseline``, ``explain``, ``predict`` and ``serve`` (with the
application a Ray Serve config names, :func:`serve_app`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from iaa.cli.adapters import open_tracker
from iaa.cli.options import (INPUT_FORMATS, examples_source, Finite, need_data,
                             vocabulary_data, address_option, data_options,
                             input_option, json_option, precision_option, tracking_option, workdir_option)
from iaa.cli.output import print_summary, emit, friendly, show_warnings, progress_bar, shown
from iaa.jobs.workdir.paths import Workdir


@click.command()
@click.option("--checkpoint", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@input_option("Score these questions instead (each with its answer), with the vocabulary the checkpoint carries "
              "(with --data or --dataset: theirs, as an older checkpoint without one needs): ")
@click.option("--split", type=click.Choice(["train", "valid", "test"]), help="The split of --data/--dataset to score.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="Predictions Parquet file [default: WORKDIR/evaluations/MODEL/predictions-SPLIT.parquet].")
@precision_option
@tracking_option
@workdir_option
@json_option
@friendly
def evaluate(checkpoint: Path, dataset: str | None, data: Path | None, input_path: Path | None, split: str | None,
             out: Path | None, precision: str, tracking_uri: str | None, workdir: Path, as_json: bool) -> None:
    """Score a checkpoint on a split (or a questions file) and write per-example predictions; the
    figures also go to the MLflow run that trained it."""
    from iaa.jobs.evaluation import evaluate as job

    prepared = examples_source(dataset, data, input_path, workdir)
    if (split is None) == (input_path is None):
        raise click.UsageError("give --split with --dataset or --data, and no --split with --input (whose "
                               "--data or --dataset only lends the vocabulary)")
    with progress_bar("scoring") as progress:
        result = job.run(checkpoint, prepared, split, out, input_path=input_path, precision=precision,
                         progress=progress, workdir=workdir)
    store = tracking_uri or str(Workdir(workdir).root / Workdir.TRACKING_DB)
    found = tracking_uri is not None or Path(store).is_file()
    result = job.record(result, (lambda: open_tracker(Workdir(workdir).tracking_uri(tracking_uri)))
                        if found and split is not None else None, store)
    print_summary(job.describe, result)
    emit(result, as_json, keys=("accuracy", "baseline_accuracy", "examples", "predictions"))


@click.command()
@data_options
@click.option("--split", default="valid", show_default=True, type=click.Choice(["train", "valid", "test"]))
@workdir_option
@json_option
@friendly
def baseline(dataset: str | None, data: Path | None, split: str, workdir: Path, as_json: bool) -> None:
    """Accuracy of the most-frequent-candidate baseline on a split."""
    from iaa.jobs.evaluation import frequency
    from iaa.jobs.datasets import resolve

    need_data(dataset, data)
    _, prepared = resolve.data_dir(dataset, data, workdir)
    emit(frequency.run(prepared, split), as_json)


@click.command()
@click.option("--checkpoint", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path))
@data_options
@input_option("Explain these questions instead, with the vocabulary the checkpoint carries (with --data or "
              "--dataset: theirs, as an older checkpoint without one needs): ")
@click.option("--split", default="valid", show_default=True, type=click.Choice(["train", "valid", "test"]))
@click.option("--example-id", "example_ids", multiple=True, metavar="ID", help="An example to explain (repeatable).")
@click.option("--first", type=click.IntRange(min=1), default=None,
              help="Explain the split's first N examples [with --input: every question of a small file].")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="HTML page [default: explain-SPLIT.html, or explain-STEM.html of --input, in "
                   "WORKDIR/evaluations/MODEL].")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), help="Also draw the first example as a PNG figure.")
@precision_option
@workdir_option
@json_option
@friendly
def explain(checkpoint: Path, dataset: str | None, data: Path | None, input_path: Path | None, split: str,
            example_ids: tuple[str, ...], first: int | None, out: Path | None, png: Path | None, precision: str,
            workdir: Path, as_json: bool) -> None:
    """Show what the reader attends to at each inference step, as an HTML page (and a PNG)."""
    from iaa.jobs.evaluation.explaining import explain as job

    prepared = examples_source(dataset, data, input_path, workdir)
    if not example_ids and not first and input_path is None:
        raise click.UsageError("choose examples with --example-id ID (repeatable) or --first N")
    result = job.run(checkpoint, prepared, None if input_path else split, example_ids=example_ids, first=first,
                     out=out, png=png, input_path=input_path, workdir=workdir, precision=precision)
    if as_json:                 # the summary on stderr, as every command keeps it with --json
        print_summary(job.describe, result)
        emit(result, True)
    else:
        show_warnings(result)
        click.echo(shown(job.describe(result), keep_lines=True))


@click.command()
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
@friendly
def predict(checkpoint: Path | None, ensemble_dir: Path | None, input_path: Path, out: Path, dataset: str | None,
            data: Path | None, precision: str, workdir: Path, as_json: bool) -> None:
    """Answer cloze questions given as raw text (or a CBT / CNN file)."""
    from iaa.jobs.inference import predict as job

    if (checkpoint is None) == (ensemble_dir is None):
        raise click.UsageError("give exactly one of --checkpoint CKPT or --ensemble DIR")
    prepared = vocabulary_data(dataset, data, workdir)
    with progress_bar("answering") as progress:
        result = job.run(input_path, out, checkpoint=checkpoint, ensemble_dir=ensemble_dir, data_dir=prepared,
                         precision=precision, progress=progress)
    if str(out) == "-":                  # the answers on stdout, the result on stderr
        click.echo(job.json_lines(result.answers), nl=False)
    emit(result, as_json, err=str(out) == "-")


def _autoscale(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    low, sep, high = value.partition(":")
    if not (sep and low.isdigit() and high.isdigit()) or int(low) > int(high) or int(high) < 1:
        raise click.BadParameter(f"{value!r}: expected MIN:MAX replicas, 0 <= MIN <= MAX, MAX >= 1")
    return int(low), int(high)


@click.command()
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
@click.option("--batch-wait-ms", type=Finite(min=0), default=5.0, show_default=True,
              help="How long a batch waits for more requests.")
@click.option("--cpus-per-replica", type=Finite(min=0.01), default=0.5, show_default=True,
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
@friendly
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
    prepared = vocabulary_data(dataset, data, workdir)
    cfg = job.config(model_uri=model_uri, checkpoint=checkpoint, ensemble_dir=ensemble_dir, data_dir=prepared,
                     workdir=workdir, tracking_uri=tracking_uri, replicas=replicas or 1, autoscale=autoscale,
                     max_batch=max_batch, batch_wait_ms=batch_wait_ms, cpus_per_replica=cpus_per_replica,
                     threads=threads, max_document_words=max_document_words, max_query_words=max_query_words,
                     max_candidates=max_candidates, host=host, port=port, address=address)
    job.check_source(cfg.source)                # before Ray starts: a file no replica could load fails at once
    from iaa.platform import serve_life

    serve_life.check_port(cfg)                  # before Ray is imported: a taken port fails in a second
    from iaa.platform import ray_serve as platform_serve

    platform_serve.run_forever(cfg, job.CODE)


def serve_app(args: dict[str, Any]) -> Any:
    """The application a Ray Serve config names (``import_path: iaa.cli:serve_app``, as in
    ``deploy/serve.yaml``): the Ray Serve adapter with the serve job's model loader."""
    from iaa.jobs.inference import serve as job
    from iaa.platform import ray_serve as platform_serve

    return platform_serve.build(args, job.CODE)
