"""Every use case hands back a frozen, typed result; the command line renders it, and its
``--json`` object keeps the keys the commands have always printed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from _faults import invoke, make_checkpoint, make_prepared
from iaa.jobs.datasets.prepare import PrepareResult
from iaa.jobs.distill.outcome import DistillResult
from iaa.jobs.ensemble.ensemble_result import EnsembleResult
from iaa.jobs.evaluation import evaluate, frequency
from iaa.jobs.evaluation.explaining import explain
from iaa.jobs.evaluation.closing import Command
from iaa.jobs.evaluation.evaluate import EvaluateResult
from iaa.jobs.evaluation.explaining.explain import ExplainResult
from iaa.jobs.evaluation.frequency import BaselineResult
from iaa.jobs.evaluation.result import Result, absent_when_none, hidden, spread
from iaa.jobs.inference.predict import PredictResult
from iaa.jobs.own_data.cloze_summary import ClozeResult
from iaa.jobs.reports.report import ReportResult
from iaa.jobs.reports.sweep_report import SweepReportResult
from iaa.jobs.train.bench import BenchResult
from iaa.jobs.training.summary import TrainResult, trained
from iaa.jobs.tune.best import TuneResult

RESULTS = (PrepareResult, ClozeResult, BaselineResult, EvaluateResult, ExplainResult, PredictResult, ReportResult,
           SweepReportResult, BenchResult, TrainResult, DistillResult, EnsembleResult, TuneResult)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("results")
    _, data = make_prepared(root)
    return data, make_checkpoint(data, root / "ckpt.pt")


@pytest.mark.parametrize("kind", RESULTS, ids=lambda kind: kind.__name__)
def test_every_result_is_a_frozen_result(kind) -> None:
    assert issubclass(kind, Result) and dataclasses.is_dataclass(kind)
    assert kind.__dataclass_params__.frozen
    names = {f.name for f in dataclasses.fields(kind)}
    assert {"warnings", "next"} <= names


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Sample(Result):
    figures: dict = spread()
    accuracy: float
    where: Path
    steps: tuple[int, ...] = ()
    halting: float | None = absent_when_none()
    table: str = hidden("a table")


def test_fields_is_the_json_object() -> None:
    sample = _Sample(figures={"lr": 0.1, "accuracy": 0.0}, accuracy=0.5, where=Path("/x"), steps=(1, 2),
                     warnings=("careful",), next=(Command.of("train", data="/d"),))
    found = sample.fields()
    assert found == {"warnings": ["careful"], "lr": 0.1, "accuracy": 0.5, "where": "/x", "steps": [1, 2]}
    assert "halting" in _Sample(accuracy=0.5, where=Path("/x"), halting=2.0).fields()
    with pytest.raises(dataclasses.FrozenInstanceError):
        sample.accuracy = 1.0  # type: ignore[misc]


def test_a_training_runs_figures_keep_their_keys_and_named_ones_are_attributes() -> None:
    figures = {"step": 12, "epoch": 2.0, "train_loss": 1.5, "valid_acc": 0.25, "best_valid_acc": 0.3,
               "best_step": 8, "steps": 12, "stop_reason": "max-epochs", "train_seconds": 3.0, "precision": "fp32",
               "cuda_graphs": False, "cuda_graphs_refused": None, "workers": 2}
    result = trained(figures, checkpoint="/r/best.pt", run_dir="/r")
    assert (result.best_valid_acc, result.steps, result.stop_reason, result.epoch) == (0.3, 12, "max-epochs", 2.0)
    assert result.valid_acc == 0.3                      # the best check's, as best_valid_acc
    assert result.metrics == {"step": 12, "train_loss": 1.5, "cuda_graphs": False, "cuda_graphs_refused": None,
                              "workers": 2}
    assert result.fields() == {**figures, "valid_acc": 0.3, "checkpoint": "/r/best.pt", "run_dir": "/r",
                               "warnings": []}
    tracked = dataclasses.replace(result, valid_acc=0.3, mlflow_run_id="abc")
    assert tracked.fields()["valid_acc"] == 0.3 and tracked.fields()["mlflow_run_id"] == "abc"


def test_baseline_json_keeps_its_keys(prepared) -> None:
    data, _ = prepared
    result = frequency.run(data, "valid")
    assert isinstance(result, BaselineResult) and result["accuracy"] == result.accuracy     # indexable still
    code, output = invoke("baseline", "--data", data, "--json")
    assert code == 0, output
    shown = json.loads(output.strip().splitlines()[-1])
    assert {"baseline", "split", "accuracy", "examples"} <= set(shown)
    assert shown["accuracy"] == result.accuracy and shown["examples"] == result.examples


def test_evaluate_returns_its_next_steps_as_commands_and_prints_todays_keys(prepared, tmp_path) -> None:
    data, ckpt = prepared
    result = evaluate.run(ckpt, data, "valid", tmp_path / "p.parquet")
    assert [c.name for c in result.next] == ["explain", "serve"] and all(isinstance(c, Command) for c in result.next)
    assert "input" not in result.fields() and "next" not in result.fields()
    code, output = invoke("evaluate", "--checkpoint", ckpt, "--data", data, "--split", "valid",
                          "--out", tmp_path / "q.parquet", "--json")
    assert code == 0, output
    shown = json.loads(output.strip().splitlines()[-1])
    assert {"accuracy", "accuracy_stderr", "baseline_accuracy", "data_dir", "predictions", "split", "examples", "model",
            "checkpoint", "examples_per_s", "precision"} <= set(shown)
    code, output = invoke("evaluate", "--checkpoint", ckpt, "--data", data, "--split", "valid",
                          "--out", tmp_path / "r.parquet")
    assert code == 0 and {"accuracy", "baseline_accuracy", "examples", "predictions"} <= {
        line.split(": ")[0] for line in output.splitlines()}


def test_explain_result_reads_as_attributes_and_json(prepared, tmp_path) -> None:
    data, ckpt = prepared
    result = explain.run(ckpt, data, "valid", first=1, out=tmp_path / "e.html")
    assert isinstance(result, ExplainResult) and Path(result.html).is_file() and result.png is None
    assert result["html"] == result.html and "png" not in result.fields()
    assert result.examples and result.examples[0].example_id
