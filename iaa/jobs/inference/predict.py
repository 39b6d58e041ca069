"""``iaa-cli predict``: answer cloze questions given as raw text (or CBT / CNN files) with a
checkpoint or a seed ensemble; the same ``probs`` as ``iaa-cli evaluate`` writes, and the
prediction's real name (``prediction_name``) where the input names its entities.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from iaa.data.formats.raw_text import Question, read_input
from iaa.jobs.evaluation import frequency, uncertainty
from iaa.jobs.evaluation.predictor import Predictor, ensemble_members, ensemble_temperature
from iaa.jobs.evaluation.result import Result, hidden


@dataclass(frozen=True, kw_only=True)
class PredictResult(Result):
    """``iaa-cli predict``: where the answers went, how many, and the accuracy over the questions
    that give an answer, beside the most-frequent-candidate accuracy over them
    (``baseline_accuracy``; both None where none does)."""

    predictions: str                    # the JSON Lines file, or "stdout"
    examples: int
    members: int                        # checkpoints averaged (1: a single reader)
    accuracy: float | None
    precision: str
    temperature: float                  # the probabilities' (a reader's own, or the ensemble's; 1: plain)
    questions_with_answers: int
    accuracy_stderr: float | None
    baseline_accuracy: float | None
    accuracy_over: str                  # the accuracy in words, with what it was scored on
    unknown_questions: int              # questions answered with a warning: a document over a third unknown words
    answers: tuple[dict[str, Any], ...] = hidden(())   # the rows, for the caller to write where ``out`` is -


def run(input_path: Path, out: Path, *, checkpoint: Path | None = None, ensemble_dir: Path | None = None,
        data_dir: Path | None = None, precision: str = "auto",
        progress: Callable[[int], Any] | None = None) -> PredictResult:
    """Predict every question of ``input_path`` with ``checkpoint`` or the members of
    ``ensemble_dir`` and write JSON Lines to ``out`` (``-``: nothing is written, and the caller
    writes the result's ``answers``, :func:`json_lines`); ``data_dir``: the prepared folder whose
    vocabulary to use (default: the one the checkpoints carry); ``precision``: auto | fp32 | bf16.
    ``out`` is refused before any work (:func:`check_out`); ``progress``: called with the number of
    questions answered after each batch.
    """
    import warnings

    from iaa.files import atomic_write_text

    checkpoints = [Path(checkpoint)] if checkpoint is not None else ensemble_members(Path(ensemble_dir))
    to_stdout = str(out) == "-"
    if not to_stdout:
        check_out(out, input_path=input_path, checkpoints=checkpoints, data_dir=data_dir, ensemble_dir=ensemble_dir)
    temperature = None if ensemble_dir is None else ensemble_temperature(Path(ensemble_dir))
    predictor = Predictor.load(checkpoints, data_dir, precision, temperature)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        questions = read_input(Path(input_path), predictor.vocab.placeholder)
        rows = [with_name(row, q) for row, q in zip(predictor.predict(questions, progress=progress), questions)]
    if not to_stdout:
        atomic_write_text(out, json_lines(rows))
    scored = [r["correct"] for r in rows if "correct" in r]
    accuracy = sum(scored) / len(scored) if scored else None
    baseline = predictor.baseline(questions)
    below = [] if accuracy is None or baseline is None else frequency.below_warning(
        accuracy, baseline, "the checkpoint" if checkpoint is not None else "the ensemble", on=str(input_path))
    return PredictResult(
        predictions="stdout" if to_stdout else str(Path(out).resolve()), examples=len(rows), members=len(checkpoints),
        accuracy=accuracy,
        warnings=tuple([str(w.message) for w in caught] + [r["warning"] for r in rows if "warning" in r] + below),
        precision=predictor.precision, temperature=predictor.temperature, questions_with_answers=len(scored),
        accuracy_stderr=uncertainty.fields("accuracy", accuracy, len(scored))["accuracy_stderr"],
        baseline_accuracy=baseline, accuracy_over=accuracy_over(accuracy, len(scored), len(rows), baseline),
        unknown_questions=sum("warning" in r for r in rows), answers=tuple(rows) if to_stdout else ())


def check_out(out: Path, *, input_path: Path, checkpoints: Sequence[Path], data_dir: Path | None,
              ensemble_dir: Path | None) -> None:
    """Refuse the answers' file ``out`` before any work, each in one line
    (:func:`iaa.jobs.workdir.outputs.check_file_output`): a folder, a name without a JSON Lines
    suffix, an input (the questions, a checkpoint, a file of the prepared data or of the ensemble),
    or a place where no file can be created."""
    from iaa.data.formats.raw_text import JSONL_SUFFIXES
    from iaa.jobs.workdir import outputs

    outputs.check_file_output(out, suffixes=JSONL_SUFFIXES, what="JSON Lines", inputs={
        "the input": input_path, "a checkpoint": checkpoints,
        "a file of the prepared data": outputs.data_files(data_dir),
        "a file of the ensemble": outputs.data_files(ensemble_dir)})


def with_name(row: Mapping[str, Any], question: Question) -> dict[str, Any]:
    """``row`` with ``prediction_name`` after ``prediction`` where the question gives entity names (a
    CNN file's ``@entityN:Name`` lines, a record's ``entities``): the prediction's name, or None
    where they do not name it."""
    if not question.names:
        return dict(row)
    out: dict[str, Any] = {}
    for key, value in row.items():
        out[key] = value
        if key == "prediction":
            out["prediction_name"] = question.name_of(value)
    return out


def json_lines(rows: Sequence[Mapping[str, Any]]) -> str:
    """The answer rows as JSON Lines."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def accuracy_over(accuracy: float | None, scored: int, questions: int, baseline: float | None = None) -> str:
    """The accuracy in words with how many of the questions gave an answer to score it on, and
    where given, the most-frequent-candidate ``baseline`` over them."""
    if accuracy is None:
        return f"no accuracy: none of the {questions} questions gives an answer"
    beside = "" if baseline is None else f" {frequency.note(accuracy, baseline)}"
    return (f"accuracy {uncertainty.accuracy_text(accuracy, scored)} over the {scored} of {questions} "
            f"questions that give an answer{beside}")
