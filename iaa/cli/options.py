"""The options and parameter types that several commands share, defined once, and the checks of
which data a command reads."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable

import click

from iaa.data.datasets import DATASETS
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR


class _ModelKinds(click.Choice):
    """``click.Choice`` of ``iaa.model.config.MODEL_KINDS``, read on first use (the model package imports torch)."""

    def __init__(self) -> None:
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        from iaa.model.config import MODEL_KINDS

        return MODEL_KINDS


MODELS = _ModelKinds()


class FiniteFloat(click.types.FloatParamType):
    """Any finite number: nan and inf are refused."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class Finite(click.FloatRange, FiniteFloat):
    """``click.FloatRange`` that also refuses nan and inf (unbounded: ``FiniteFloat``, whose help
    shows no empty range)."""


class Duration(click.ParamType):
    """A length of time as seconds: ``90m``, ``2h``, ``1h30m``, ``1.5d``, ``45s``; a bare number is seconds."""

    name = "duration"
    UNITS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)([dhms])")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)):
            seconds = float(value)
        else:
            text = str(value).strip().lower()
            try:
                seconds = float(text)
            except ValueError:
                parts = self.PART.findall(text)
                if not parts or "".join(n + u for n, u in parts) != text.replace(" ", ""):
                    self.fail(f"{value!r} is not a length of time; give for example 90m, 2h, 1h30m or 45s "
                              "(a bare number is seconds)", param, ctx)
                seconds = sum(float(n) * self.UNITS[u] for n, u in parts)
        if not (math.isfinite(seconds) and seconds > 0):
            self.fail(f"{value!r} is not a length of time above 0", param, ctx)
        return seconds



def precision_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto", show_default=True,
                        help="What the reader multiplies in; auto: bf16 where this machine computes it faster.")(fn)


def json_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on the last line.")(fn)


def _group_workdir(ctx: click.Context, param: click.Parameter, value: Path) -> Path:
    """The command's own ``--workdir`` when given on its command line, else the group's
    (``iaa-cli --workdir W COMMAND``), else ``IAA_WORKDIR`` or the default."""
    from click.core import ParameterSource

    root = ctx.find_root()
    given = root.params.get("workdir") if root is not ctx and root.params else None
    if given is not None and ctx.get_parameter_source(param.name or "workdir") != ParameterSource.COMMANDLINE:
        return Path(given)
    return value


def workdir_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--workdir", type=click.Path(path_type=Path), default=DEFAULT_WORKDIR, envvar="IAA_WORKDIR",
        show_default=True, callback=_group_workdir,
        help="Where prepared data, runs, sweeps and the MLflow store live (also: iaa-cli --workdir W COMMAND).",
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


def need_data(dataset: str | None, data: Path | None) -> None:
    """``--dataset`` or ``--data`` (both: they must agree, which the job checks against the manifest)."""
    if dataset is None and data is None:
        raise click.UsageError("give --dataset NAME or --data PREPARED_DIR")


INPUT_FORMATS = 'JSON Lines of {"id", "document", "query", "candidates"[, "answer"]}, or a CBT / CNN file.'


def input_option(purpose: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``--input FILE``: questions in the raw formats ``predict`` reads (``purpose`` opens the help)."""
    return click.option("--input", "input_path", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                        help=purpose + INPUT_FORMATS)


def vocabulary_data(dataset: str | None, data: Path | None, workdir: Path) -> Path | None:
    """The prepared folder of ``--dataset``/``--data`` whose vocabulary to use; None: the checkpoints' own."""
    from iaa.jobs.datasets import resolve

    if dataset is not None and data is not None:
        raise click.UsageError("give at most one of --dataset NAME or --data PREPARED_DIR")
    return resolve.data_dir(dataset, data, workdir)[1] if dataset or data else None


def examples_source(dataset: str | None, data: Path | None, input_path: Path | None, workdir: Path) -> Path | None:
    """The prepared folder of ``--dataset``/``--data``: the examples, or with ``--input`` the vocabulary
    of a checkpoint too old to carry its own (None with ``--input`` alone: the checkpoint's)."""
    from iaa.jobs.datasets import resolve

    if input_path is not None:
        return vocabulary_data(dataset, data, workdir)
    if (dataset is None) == (data is None):
        raise click.UsageError("give exactly one of --dataset NAME, --data PREPARED_DIR or --input FILE")
    return resolve.data_dir(dataset, data, workdir)[1]
