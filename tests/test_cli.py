"""The CLI: expected failures are one line, genuine bugs keep their traceback, --debug shows all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from _cbt_fixtures import write_source
from _shared import REPO
from iaa import cli
from iaa.data.bad_input import DataError


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A small prepared CBT-NE folder."""
    root = tmp_path_factory.mktemp("cli")
    out = root / "cbt-ne"
    result = CliRunner().invoke(cli.cli, ["prepare", "--dataset", "cbt-ne", "--source", str(write_source(root)),
                                          "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_a_genuine_bug_keeps_its_traceback(prepared, monkeypatch):
    from iaa.jobs.evaluation import frequency

    def broken(*args, **kwargs):
        return {}["accuracy"]  # a KeyError from a bug, not from the user

    monkeypatch.setattr(frequency, "run", broken)
    result = CliRunner().invoke(cli.cli, ["baseline", "--data", str(prepared)])
    assert result.exit_code == 1
    assert isinstance(result.exception, KeyError)  # not turned into a click message
    assert "Error:" not in result.output


def test_an_expected_error_is_one_line_and_debug_shows_its_traceback(prepared, monkeypatch):
    from iaa.jobs.evaluation import frequency

    def bad_data(*args, **kwargs):
        raise DataError("row 3: answer index outside its candidates", path="x.parquet")

    monkeypatch.setattr(frequency, "run", bad_data)
    args = ["baseline", "--data", str(prepared)]
    result = CliRunner().invoke(cli.cli, args)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.strip() == "Error: x.parquet: row 3: answer index outside its candidates"
    debug = CliRunner().invoke(cli.cli, ["--debug", *args])
    assert debug.exit_code == 1 and isinstance(debug.exception, DataError)
    monkeypatch.setenv("IAA_DEBUG", "1")
    assert isinstance(CliRunner().invoke(cli.cli, args).exception, DataError)


def test_traceback_reaches_stderr_in_a_real_process(tmp_path):
    """End to end: an injected bug in a job prints a Python traceback and exits 1."""
    code = ("import sys; from iaa import cli; from iaa.jobs.datasets import prepare;"
            "prepare.run = lambda *a, **k: {}['counts']; sys.argv = ['iaa-cli', *sys.argv[1:]]; cli.main()")
    bug = subprocess.run([sys.executable, "-c", code, "prepare", "--dataset", "demo", "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert bug.returncode == 1 and "Traceback" in bug.stderr and "KeyError: 'counts'" in bug.stderr


def test_help_does_not_import_torch():
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "iaa.cli", "--help"], capture_output=True,
                         text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0
    assert " torch" not in out.stderr and "ray" not in out.stderr.split() and " mlflow" not in out.stderr


def test_dataset_and_model_choices_come_from_their_single_sources():
    from iaa.data.datasets import DATASETS
    from iaa.model.config import MODEL_KINDS

    params = {p.name: p for p in cli.train.params}
    assert tuple(params["dataset"].type.choices) == DATASETS
    assert tuple(params["model_kind"].type.choices) == MODEL_KINDS
    assert tuple(cli.prepare.params[0].type.choices) == DATASETS


def test_every_command_with_json_shares_one_option():
    with_json = [c for c in cli.cli.commands.values() if any(p.name == "as_json" for p in c.params)]
    assert len(with_json) >= 7
    helps = {next(p for p in c.params if p.name == "as_json").help for c in with_json}
    assert helps == {"Print the result as JSON on the last line."}


def test_tune_keeps_an_explicit_max_epochs_even_when_it_equals_the_preset(prepared, tmp_path):
    from iaa.jobs.tune import tune

    preset = tune.TUNE_PRESETS["cbt-ne"]
    epochs = preset.max_epochs
    explicit = tune.TuneRequest(data=prepared, workdir=tmp_path, sets=(f"train.max_epochs={epochs}",))
    assert tune.settle(explicit).base.train.max_epochs == epochs           # the preset's own value, kept
    assert tune.settle(explicit).train_epochs == epochs
    config = tmp_path / "c.yaml"
    config.write_text(f"train:\n  max_epochs: {epochs}\n")
    from_file = tune.TuneRequest(data=prepared, workdir=tmp_path, config_file=config)
    assert tune.settle(from_file).base.train.max_epochs == epochs
    default = tune.settle(tune.TuneRequest(data=prepared, workdir=tmp_path, max_epochs=epochs / 2))
    assert default.base.train.max_epochs == epochs / 2 and default.train_epochs != epochs / 2


@pytest.mark.parametrize("args, flag", [
    (["prepare", "--dataset", "demo", "--threads", "-3"], "--threads"),
    (["tune", "--dataset", "demo", "--max-epochs", "nan"], "--max-epochs"),
    (["tune", "--dataset", "demo", "--num-samples", "0"], "--num-samples"),
    (["train", "--dataset", "demo", "--gpus-per-worker", "inf"], "--gpus-per-worker"),
])
def test_out_of_range_flags_are_usage_errors_naming_the_flag(args, flag, tmp_path):
    result = CliRunner().invoke(cli.cli, [*args, "--workdir", str(tmp_path)])
    assert result.exit_code == 2 and flag in result.output
    assert not any(tmp_path.iterdir())
