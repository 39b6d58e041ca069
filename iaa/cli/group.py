"""The ``iaa-cli`` group: ``--version``, ``--debug``, ``--workdir``, and every command, in the order of its help."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import click

from iaa import __version__, logs
from iaa.cli import data, ensembles, flags, inference, output, reports, training, tuning


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="iaa-cli")
@click.option("--debug", is_flag=True, help="Show the traceback of every error (also: IAA_DEBUG=1).")
@click.option("--workdir", type=click.Path(path_type=Path), default=None,
              help="The work folder of the command that follows (its own --workdir wins).")
@click.option("--quiet", is_flag=True, help="Warnings and errors only on stderr: no progress lines.")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Progress and warnings on stderr as text lines or as JSON objects, one per line.")
def cli(debug: bool, workdir: Path | None, quiet: bool, log_format: str) -> None:
    """Iterative Alternating Attention reader: prepare, train, evaluate, tune and ensemble."""
    logs.to_console(json_lines=log_format == "json", quiet=quiet, render=functools.partial(flags.render, cli=cli))


COMMANDS = (data.prepare, training.train, inference.evaluate, inference.baseline, tuning.tune, ensembles.ensemble,
            training.bench, data.make_cloze, ensembles.distill, inference.explain, inference.predict, reports.report,
            inference.serve)
for _command in COMMANDS:
    cli.add_command(_command)


def main() -> None:
    from iaa.platform.cluster import head_watch

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    output.EXIT_AT_ONCE = True
    head_watch.stop_on_loss()          # a command on a cluster whose head dies stops as a SIGTERM stops it
    cli()
