"""Scoring and per-example predictions of a trained reader.

Two distributions are kept apart. Training maximises the paper's unnormalised pointer-sum
P(a|Q,D) = sum of d_{i,T} over a's positions (eq. 2), whose candidate values add up to at most 1.
The ``probs`` written here are those pointer-sums renormalised over the candidates: a proper
distribution with the same argmax, where a candidate absent from the document gets exactly 0.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch import nn

from iaa.data.loading.batch import Batch
from iaa.errors import IaaError, printable
from iaa.files import atomic_write, spellings
from iaa.jobs.evaluation import calibration, frequency, uncertainty
from iaa.jobs.evaluation.closing import Command, where
from iaa.jobs.evaluation.result import Result, absent_when_none
from iaa.jobs.modeling import precision_policy as precision_lib
from iaa.jobs.ports import Tracker
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR, RunFolder, Workdir
from iaa.model.pointer import candidate_probs, nll_loss

PREDICTION_SCHEMA = pa.schema(
    [
        ("example_id", pa.string()),
        ("candidate_words", pa.list_(pa.string())),
        ("probs", pa.list_(pa.float32())),
        ("calibrated_probs", pa.list_(pa.float32())),   # probs at the reader's temperature: what it answers with
        ("pred", pa.int32()),
        ("gold", pa.int32()),
        ("steps", pa.int32()),   # inference steps the example took (ACT readers); null otherwise
    ]
)


@torch.no_grad()
def score_batches(model: nn.Module, batches: Iterable[Batch], device: torch.device | str = "cpu",
                  forward: Callable[[Batch], torch.Tensor] | None = None,
                  kept: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> list[float]:
    """``[correct, total, summed nll]`` of ``model`` over ``batches`` (eval mode).

    ``forward`` gives a batch's (B, C) log-probabilities (default: ``model(batch).log_probs``;
    :class:`iaa.jobs.modeling.graphs.CapturedForward` replays it from CUDA graphs). The sums
    stay on the device until the last batch: one read back, not two per batch. ``kept``: a list
    that each batch's candidate probabilities (B, C) and gold answers (B,) are appended to, on
    the device (:func:`iaa.jobs.evaluation.calibration.stacked` reads them back).
    """
    model.eval()
    forward = forward or (lambda batch: model(batch).log_probs)
    sums = torch.zeros(2, dtype=torch.float64, device=device)            # correct, summed nll
    total = 0
    for batch in batches:
        batch = batch.to(device)
        log_p = forward(batch)                                 # (B, C)
        sums[0] += (log_p.argmax(dim=1) == batch.answer).sum()
        sums[1] += nll_loss(log_p, batch.answer).double() * len(batch)
        if kept is not None:
            kept.append((candidate_probs(log_p.detach()), batch.answer))
        total += len(batch)
    correct, nll = sums.tolist()
    return [correct, float(total), nll]


@torch.no_grad()
def predict(model: nn.Module, batches: Iterable[Batch], device: torch.device | str = "cpu") -> Iterator[dict[str, Any]]:
    """Per example: ``example_id``, ``probs`` (renormalised over candidates), ``pred``, ``gold``,
    and ``steps`` (the inference steps it took, for an ACT reader; else None)."""
    model.eval()
    for batch in batches:
        batch = batch.to(device)
        out = model(batch)                                     # ReaderOutput
        log_p, halting = out.log_probs, out.halting
        probs = candidate_probs(log_p).cpu()                   # (B, C)
        steps = [None] * len(batch) if halting is None else halting.steps.tolist()
        n_cands = batch.cand_mask.sum(dim=1).cpu()
        for b, example_id in enumerate(batch.example_ids):
            row = probs[b, : int(n_cands[b])]
            yield {
                "example_id": example_id,
                "probs": row.tolist(),
                "pred": int(row.argmax()),
                "gold": int(batch.answer[b]),
                "steps": steps[b],
            }


def write_predictions(rows: list[dict[str, Any]], words: dict[str, list[str]], out: Path) -> Path:
    """Write prediction rows, with each example's ``candidate_words``, as zstd Parquet."""
    table = pa.Table.from_pylist(
        [{**row, "candidate_words": words[row["example_id"]]} for row in rows], schema=PREDICTION_SCHEMA
    )
    return atomic_write(out, lambda tmp: pq.write_table(table, tmp, compression="zstd"))


@dataclass(frozen=True)
class Examples:
    """A checkpoint's reader and the examples to run it on: a prepared split, or a raw file's questions."""

    model: nn.Module
    kind: str                  # the reader variant
    table: pa.Table            # rows in iaa.data.prepared.shards.SCHEMA; ``answer`` is -1 where a question gives none
    tokens: Sequence[str]      # the vocabulary's words, by id
    name: str                  # the split, or the input's :func:`input_name`: in default output names
    title: str                 # "DATASET (SPLIT)", or the input file
    inputs: dict[str, Any]     # what the output policy keeps outputs off
    warnings: tuple[str, ...] = ()   # about the input's questions (a candidate absent from its document)
    temperature: float = 1.0         # the one the reader answers at (iaa.jobs.modeling.checkpoint.temperature)
    # per row of ``table``, the real names of its entity words (``@entity0`` -> ``Ann Lee``) where
    # the input gives them (a CNN question file, a record's ``entities``); a prepared split keeps none
    names: tuple[Mapping[str, str], ...] = ()


def input_name(input_path: Path) -> str:
    """An input file's name in default output names: its stem and a digest of its absolute path,
    so that two files of one name (``valid.txt`` of two folders) never write over each other's."""
    import hashlib

    return f"{Path(input_path).stem}-{hashlib.sha1(str(Path(input_path).resolve()).encode()).hexdigest()[:8]}"


def example_inputs(checkpoint_path: Path, data_dir: Path | None, input_path: Path | None) -> dict[str, Any]:
    """The files :func:`load_examples` reads, by what they are: outputs may not replace them."""
    from iaa.jobs.workdir import outputs

    if input_path is not None:
        return {"the checkpoint": checkpoint_path, "the input": input_path}
    return {"the checkpoint": checkpoint_path, "a file of the prepared data": outputs.data_files(data_dir)}


def load_examples(checkpoint_path: Path, *, data_dir: Path | None = None, split: str | None = None,
                  input_path: Path | None = None, limit: int | None = None, need_answers: bool = False,
                  todo: str = "", precision: str = "fp32") -> Examples:
    """The reader of ``checkpoint_path`` with the examples of ``input_path`` (the formats ``predict
    --input`` reads, with the vocabulary of ``data_dir`` where given, else the one the checkpoint
    carries), else of ``split`` of the prepared ``data_dir`` (its first ``limit`` rows); ``todo`` ends the message of a vocabulary mismatch.
    The reader computes in ``precision`` (fp32 | bf16).

    Raises:
        InputError: ``need_answers`` and a question of ``input_path`` gives no answer.
    """
    from iaa.jobs.modeling import checkpoint

    if input_path is not None:
        from iaa.jobs.evaluation.predictor import Predictor
        from iaa.data.formats.raw_text import labelled_rows, read_input

        predictor = Predictor.load([Path(checkpoint_path)], data_dir, precision=precision)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            questions = read_input(Path(input_path), predictor.vocab.placeholder)
            table = labelled_rows(questions, predictor.vocab, predictor.lowercase, need_answers=need_answers)
        model = predictor.models[0]
        return Examples(model, model.cfg.kind, table.slice(0, limit), predictor.vocab.tokens, input_name(input_path),
                        str(input_path), example_inputs(checkpoint_path, data_dir, input_path),
                        tuple(str(w.message) for w in caught), predictor.temperature,
                        tuple(dict(q.names) for q in questions[:limit]))
    from iaa.data.loading.loader import PreparedData

    assert data_dir is not None and split is not None
    model, cfg, state = checkpoint.load_model(Path(checkpoint_path), precision=precision)
    data = PreparedData.open(Path(data_dir))
    checkpoint.check_vocab(state, data.manifest.vocab_hash, checkpoint_path, data_dir, todo)
    table = data.table(split) if limit is None else data.rows(split, 0, limit)
    return Examples(model, cfg.model.kind, table, data.vocab.tokens, split,
                    f"{data.manifest.dataset} ({split})", example_inputs(checkpoint_path, data_dir, None),
                    temperature=checkpoint.temperature(state))


@dataclass(frozen=True, kw_only=True)
class EvaluateResult(Result):
    """``iaa-cli evaluate``: a checkpoint's accuracy on a split (or a questions file), how far its
    probabilities can be taken at their word (``log_loss``, ``calibration_error``:
    :mod:`iaa.jobs.evaluation.calibration`), plain and at the temperature it answers at
    (``calibrated_*``), and where its per-example predictions went; the halting steps where the
    reader is an ACT one. ``baseline_accuracy``: the most-frequent-candidate accuracy on the same
    questions (:mod:`iaa.jobs.evaluation.frequency`; None where there are none)."""

    accuracy: float
    accuracy_stderr: float | None
    baseline_accuracy: float | None
    log_loss: float
    calibration_error: float
    mean_confidence: float
    temperature: float                  # fitted on valid while the reader trained; 1.0 for an older checkpoint
    calibrated_log_loss: float
    calibrated_calibration_error: float
    calibrated_mean_confidence: float
    data_dir: str | None                # None: the questions of ``input``
    predictions: str                    # the Parquet file written
    split: str | None
    input: str | None = absent_when_none()
    examples: int
    model: str                          # the reader variant
    checkpoint: str
    examples_per_s: float
    precision: str
    mean_steps: float | None = absent_when_none()
    steps_histogram: dict[int, int] | None = absent_when_none()     # {steps: examples}
    recorded_on_run: str | None = absent_when_none()    # the MLflow run of the checkpoint that got the figures
    not_recorded: str | None = absent_when_none()       # why they went to no run


def run(checkpoint_path: Path, data_dir: Path | None, split: str | None, out: Path | None = None,
        batch_size: int = 64, limit: int | None = None, input_path: Path | None = None,
        precision: str = "auto", progress: Callable[[int], Any] | None = None,
        workdir: Path = Path(DEFAULT_WORKDIR)) -> EvaluateResult:
    """Evaluate a checkpoint on one split of a prepared dataset, or on the questions of
    ``input_path`` (each must give its answer), and write its predictions to ``out``, by default
    ``WORKDIR/evaluations/MODEL/predictions-SPLIT.parquet`` (never beside the checkpoint, whose
    folder may be another's or read-only); ``limit``: the first rows only; ``precision``: what
    the reader multiplies in (auto | fp32 | bf16); ``progress``: called with 1 after each example
    is scored."""
    from iaa.data.loading.loader import iter_batches
    from iaa.jobs.workdir import outputs

    used = precision_lib.resolve(precision)
    if out is not None:                           # refused before the reader and the data load
        outputs.check_file_output(out, suffixes=(".parquet",), what="Parquet",
                                  inputs=example_inputs(checkpoint_path, data_dir, input_path))
    found = load_examples(checkpoint_path, data_dir=data_dir, split=split, input_path=input_path, limit=limit,
                          need_answers=True, todo="evaluate it on the data it was trained on", precision=used)
    if out is None:
        out = Workdir(workdir).evaluation(checkpoint_path) / f"predictions-{found.name}.parquet"
        outputs.check_file_output(out, suffixes=(".parquet",), what="Parquet", inputs=found.inputs)
    table = found.table
    start = time.perf_counter()
    rows = []
    for row in predict(found.model, iter_batches(table, batch_size, seed=0, epoch=0, shuffle=False)):
        rows.append(row)
        if progress is not None:
            progress(1)
    seconds = time.perf_counter() - start
    probs, gold = calibration.padded([r["probs"] for r in rows]), np.array([r["gold"] for r in rows])
    scaled = calibration.scaled(probs, found.temperature)
    rows = [{**r, "calibrated_probs": scaled[i, :len(r["probs"])].tolist()} for i, r in enumerate(rows)]
    words = dict(zip(table.column("example_id").to_pylist(), table.column("candidate_words").to_pylist()))
    write_predictions(rows, words, out)
    correct = sum(r["pred"] == r["gold"] for r in rows)
    accuracy = correct / max(len(rows), 1)
    baseline = frequency.of_table(table)          # on the rows scored: the split's, or the input's questions
    below = [] if baseline is None else frequency.below_warning(accuracy, baseline, "the checkpoint",
                                                                on=split or str(input_path))
    data = None if data_dir is None else str(Path(data_dir).resolve())      # paths said absolute: a script runs anywhere
    checkpoint_path, input_path = Path(checkpoint_path).resolve(), None if input_path is None else Path(input_path).resolve()
    source = {"data": data} if input_path is None else {"input_path": str(input_path), **({"data": data} if data else {})}
    steps = [r["steps"] for r in rows if r.get("steps") is not None]
    return EvaluateResult(
        accuracy=accuracy,
        accuracy_stderr=uncertainty.fields("accuracy", accuracy, len(rows))["accuracy_stderr"],
        baseline_accuracy=baseline,
        **calibration.of(probs, gold).fields(), temperature=found.temperature,
        **calibration.of(scaled, gold).fields("calibrated_"),
        data_dir=data, predictions=str(Path(out).resolve()), split=split,
        input=None if input_path is None else str(input_path),
        warnings=(*found.warnings, *below),
        examples=len(rows), model=found.kind, checkpoint=str(checkpoint_path),
        examples_per_s=len(rows) / max(seconds, 1e-9), precision=used,
        mean_steps=sum(steps) / len(steps) if steps else None,
        steps_histogram={n: steps.count(n) for n in sorted(set(steps))} if steps else None,
        next=(Command.of("explain", checkpoint=str(checkpoint_path), **source, split=split, first=5, **where(workdir)),
              Command.of("serve", checkpoint=str(checkpoint_path), **where(workdir))))


RECORDED_PREFIX = "evaluate/"     # the recorded metrics' names: evaluate/test_acc, ...; the predictions' folder


def record(result: EvaluateResult, open_store: Callable[[], Tracker] | None, store: str) -> EvaluateResult:
    """The result, its figures recorded on the MLflow run that trained the checkpoint
    (:func:`_training_run`): ``evaluate/SPLIT_acc``, ``evaluate/SPLIT_baseline_acc`` (the
    most-frequent-candidate accuracy), ``evaluate/SPLIT_log_loss`` and
    ``evaluate/SPLIT_calibration_error`` (and their ``calibrated_`` forms), and the predictions
    under ``evaluate/``. ``open_store`` opens the store (None: there is none). Questions of an input
    file, no store, one that cannot be opened or searched (a server that does not answer), no run
    naming the checkpoint or a store that refuses the figures (read-only, full) are said in
    ``not_recorded``: the evaluation stands."""
    if result.split is None:
        return replace(result, not_recorded=f"the questions of {result.input} are not a split of the run's data")
    if open_store is None:
        return replace(result, not_recorded=f"there is no MLflow store at {store}")
    try:
        tracker = open_store()
        run_id = _training_run(tracker, Path(result.checkpoint))
    except (IaaError, OSError) as err:          # a server that does not answer, a store that cannot be read
        return replace(result, not_recorded=f"{store} could not be opened or searched ({printable(str(err))})")
    if run_id is None:
        return replace(result, not_recorded=f"no run of {store} names this checkpoint or its run folder "
                                            "(their checkpoint and run_dir tags)")
    run = tracker.attach(run_id)
    run.log_metrics({f"{RECORDED_PREFIX}{result.split}_{key}": value for key, value in (
        ("acc", result.accuracy), ("baseline_acc", result.baseline_accuracy), ("log_loss", result.log_loss),
        ("calibration_error", result.calibration_error), ("calibrated_log_loss", result.calibrated_log_loss),
        ("calibrated_calibration_error", result.calibrated_calibration_error)) if value is not None})
    run.log_artifact(Path(result.predictions), RECORDED_PREFIX.rstrip("/"))
    if run.lost:
        return replace(result, not_recorded=f"run {run_id} of {store} did not keep {', '.join(run.lost)}")
    return replace(result, recorded_on_run=run_id)


def _training_run(tracker: Tracker, path: Path) -> str | None:
    """The run whose ``checkpoint`` tag names ``path`` (a finished ``train`` run, a sweep trial),
    else, for a run folder's ``checkpoints/best.pt`` or ``last.pt``, the run whose ``run_dir`` tag
    names that folder: where its ``tracking.json`` says it began (a folder moved since), or the
    folder itself. A copy of a run folder that shares its original's store is not the original's run."""
    found = tracker.find_by_tag("checkpoint", spellings(path))
    if found is None and path.parent.name == "checkpoints":
        folder = RunFolder(path.parent.parent)
        tracking = folder.tracking()
        began = [tracking.folder] if tracking is not None and folder.copied_from(tracker.uri) is None else []
        found = tracker.find_by_tag("run_dir", [*began, *spellings(folder.path)])
    return found


def describe(result: EvaluateResult) -> str:
    """What ``iaa-cli evaluate`` prints: the accuracy with its standard error over the examples
    beside the most-frequent-candidate baseline, the predictions file, and the next commands."""
    from iaa.jobs.evaluation import closing
    from iaa.jobs.evaluation.model_card import accuracy_words

    steps = f"; {result.mean_steps:.2f} inference steps on average" if result.mean_steps is not None else ""
    plain = calibration.Calibration(result.log_loss, result.calibration_error, result.mean_confidence)
    scaled = calibration.scaling_text(result.temperature, result.split or "input", result.calibration_error,
                                      result.calibrated_calibration_error, result.log_loss, result.calibrated_log_loss)
    at_temperature = "" if result.temperature == 1.0 else f"  temperature:  {scaled}\n"
    recorded = (f"  recorded:     on MLflow run {result.recorded_on_run} as {RECORDED_PREFIX}{result.split}_acc, "
                f"_baseline_acc, _log_loss and _calibration_error (and their calibrated_ forms)\n"
                if result.recorded_on_run else
                f"  not recorded: {result.not_recorded}\n" if result.not_recorded else "")
    return (f"{result.split or result.input} accuracy: "
            f"{accuracy_words(result.accuracy, result.examples, result.baseline_accuracy)}{steps}\n"
            f"  calibration:  {calibration.text(plain)}\n"
            + at_temperature + recorded
            + f"  predictions:  {result.predictions}\n"
            + closing.next_block(result.next))
