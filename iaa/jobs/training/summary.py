"""How ``iaa-cli train`` ends: its result (:class:`TrainResult`), and in words the best accuracy
with its error bar and the baseline, why the run stopped (with the setting that gives it more when
it was still improving), where its files are, and the next commands, each runnable as printed."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from iaa.jobs.evaluation import closing, frequency, uncertainty
from iaa.jobs.evaluation.model_card import accuracy_words
from iaa.jobs.evaluation.result import Result, absent_when_none, spread


@dataclass(frozen=True, kw_only=True)
class TrainResult(Result):
    """A trained reader: its best checkpoint, how far it trained and why it stopped.

    ``metrics`` holds the figures of its last validation check (``step``, ``train_loss``,
    ``valid_loss``, ``temperature``, ``lr``, ``train_examples_per_s`` ...: those of the last check,
    which need not be the best one) and those its runner adds (in process:
    ``cuda_graphs``; on Ray Train workers: ``ray_storage``, ``workers``, ``threads``), each a key of
    the JSON object. ``valid_acc`` is the best check's accuracy, the same as ``best_valid_acc``
    (not the last check's, which the loop's figures also name ``valid_acc``). A tracked run
    (:func:`iaa.jobs.train.train.run_tracked`) adds the baseline beside it (:func:`with_baseline`),
    and its store, run and logged model.
    """

    metrics: Mapping[str, Any] = spread()
    best_valid_acc: float | None = None
    best_step: int | None = None
    steps: int = 0
    epoch: float | None = None                  # of the last check
    stop_reason: str = ""                       # max-epochs | max-time | early-stopped
    train_seconds: float | None = None
    precision: str | None = None                # fp32 | bf16: what the reader multiplied in
    checkpoint: str                             # the best checkpoint
    checkpoint_temperature: float | None = absent_when_none()   # the one it answers at (fitted at its check)
    run_dir: str
    model_uri: str | None = absent_when_none()
    valid_acc: float | None = absent_when_none()        # best_valid_acc under its short name
    tracking_uri: str | None = absent_when_none()
    mlflow_run_id: str | None = absent_when_none()
    baseline_valid_acc: float | None = absent_when_none()   # the most-frequent-candidate accuracy on valid
    valid_examples: int | None = absent_when_none()
    best_valid_acc_n: int | None = absent_when_none()
    best_valid_acc_stderr: float | None = absent_when_none()
    data_dir: str | None = absent_when_none()
    has_test: bool | None = absent_when_none()


NAMED = frozenset(f.name for f in dataclasses.fields(TrainResult)) - {"metrics", "warnings", "next"}


def trained(figures: Mapping[str, Any], **given: Any) -> TrainResult:
    """The result of the training loop's ``figures`` (a plain mapping, as a worker reports it), with
    ``given`` fields (``checkpoint``, ``run_dir`` ...) over them. Its ``valid_acc`` is the best
    check's (``best_valid_acc``): the figures' own ``valid_acc``, the last check's, is left out."""
    named = {key: value for key, value in figures.items() if key in NAMED and key != "valid_acc"}
    fields = {**named, **given}
    return TrainResult(**{"valid_acc": fields.get("best_valid_acc"), **fields},
                       metrics={k: v for k, v in figures.items() if k not in NAMED})


def with_baseline(result: TrainResult, prepared: Path) -> TrainResult:
    """``result`` with the most-frequent-candidate accuracy on the valid split beside its best
    accuracy (a warning when the reader is not above it), the split's size, the accuracy's
    standard error, the data folder and whether it has a test split; a result that has them
    already (a tracked run's) as it is."""
    from iaa.data.loading.loader import PreparedData

    if result.baseline_valid_acc is not None:
        return result
    baseline = frequency.run(prepared, "valid")
    acc, n = result.best_valid_acc, baseline.examples
    warnings = frequency.below_warning(acc, baseline.accuracy, "the run") if acc is not None else []
    error = uncertainty.fields("best_valid_acc", acc, n)
    return replace(result, baseline_valid_acc=baseline.accuracy, warnings=(*result.warnings, *warnings),
                   valid_examples=n, best_valid_acc_n=error["best_valid_acc_n"],
                   best_valid_acc_stderr=error["best_valid_acc_stderr"], data_dir=str(Path(prepared).resolve()),
                   has_test="test" in PreparedData.open(Path(prepared)).splits)


def describe(result: TrainResult, what: str = "train") -> str:
    """The closing lines of a training run, with its next commands."""
    return "\n".join([*head_lines(result, what), closing.next_block(result.next)])


def head_lines(result: TrainResult, what: str = "train") -> list[str]:
    """The best accuracy (beside the baseline), where and why the run stopped, and its files."""
    shown = accuracy_words(result.best_valid_acc, int(result.valid_examples or 0), result.baseline_valid_acc)
    lines = [f"{what}: best valid accuracy {shown}",
             f"  at step {_with_epoch(result.best_step, result)} of {_with_epoch(result.steps, result)}; "
             + _stop(result),
             f"  checkpoint:   {result.checkpoint}"]
    if result.model_uri:
        lines.append(f"  model:        {result.model_uri}")
    return lines


def run_note(result: TrainResult, checkpoint: str) -> str:
    """The tracked run's description (MLflow's runs page shows it): its best accuracy with its
    interval and the baseline, where and why it stopped, and its best ``checkpoint``."""
    shown = accuracy_words(result.best_valid_acc, int(result.valid_examples or 0), result.baseline_valid_acc)
    return (f"Best valid_acc {shown}, at step {_with_epoch(result.best_step, result)} of "
            f"{_with_epoch(result.steps, result)}; {_stop(result, advice=False)}. Its best checkpoint is "
            f"`{checkpoint}`.")


def _stop(result: TrainResult, advice: bool = True) -> str:
    """Why ``result``'s run stopped, in words (with ``advice``: how to give it more, where it was
    still improving)."""
    epoch = float(result.epoch or 0.0)
    epochs = round(epoch + 0.5) if epoch > 0 else None
    return closing.stop_words(result.stop_reason, steps=result.steps, best_step=result.best_step, epochs=epochs,
                              checks=result.metrics.get("checks"), advice=advice)


def _with_epoch(step: int | None, result: TrainResult) -> str:
    """``120 (epoch 0.58)``: ``step`` with its epoch, from the last check's step and epoch."""
    if step is None:
        return "?"
    checked, epoch = result.metrics.get("step"), result.epoch
    if not checked or not epoch:
        return str(step)
    return f"{step} (epoch {closing.rounded(step * float(epoch) / float(checked))})"


def next_commands(result: TrainResult, req: Any = None) -> tuple[closing.Command, ...]:
    """Score the checkpoint on test, explain it on valid, serve it; ``req`` (with ``workdir`` and
    ``tracking_uri``) names the work folder and store the lines name."""
    ckpt, data = result.checkpoint, result.data_dir or ""
    at = closing.where(getattr(req, "workdir", None), getattr(req, "tracking_uri", None))
    split = "test" if result.has_test else "valid"
    return (closing.Command.of("evaluate", checkpoint=ckpt, data=data, split=split, **at),
            closing.Command.of("explain", checkpoint=ckpt, data=data, first=5,
                               **closing.where(getattr(req, "workdir", None))),
            closing.Command.of("serve", checkpoint=ckpt, **closing.where(getattr(req, "workdir", None))))
