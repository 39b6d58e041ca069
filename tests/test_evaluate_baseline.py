"""``evaluate`` and ``predict`` show their accuracy beside the most-frequent-candidate baseline of
the questions they scored, as ``train`` does, and warn when the reader is not above it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from _faults import assert_says, make_checkpoint, make_prepared
from iaa.data.formats import cbt
from iaa.jobs.evaluation import evaluate, frequency
from iaa.jobs.inference import predict

NOT_ABOVE = "is not above the most-frequent-candidate baseline"


@pytest.fixture(scope="module")
def scored(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(the CBTest folder, prepared folder, an untrained checkpoint): it answers as the baseline does or worse."""
    root = tmp_path_factory.mktemp("baseline")
    source, prepared = make_prepared(root)
    return source, prepared, make_checkpoint(prepared, root / "ckpt.pt")


def _questions(source: Path, out: Path, answered: range | None = None) -> Path:
    """The valid split's questions as ``predict``'s JSON Lines; only those in ``answered`` (all: None) give their answer."""
    examples = cbt.read(source / "data" / "cbtest_NE_valid_2000ex.txt").examples()
    with out.open("w", encoding="utf-8") as f:
        for i, ex in enumerate(examples):
            record = {"id": ex.example_id, "document": " ".join(ex.doc), "query": " ".join(ex.query),
                      "candidates": list(ex.candidates)}
            if answered is None or i in answered:
                record["answer"] = ex.answer
            f.write(json.dumps(record) + "\n")
    return out


def test_evaluate_on_a_split_gives_its_baseline_beside_the_accuracy_and_warns_when_not_above(scored, tmp_path):
    _, prepared, ckpt = scored
    result = evaluate.run(ckpt, prepared, "valid", tmp_path / "p.parquet", precision="fp32")
    base = frequency.run(prepared, "valid").accuracy
    assert result.baseline_accuracy == base and result.fields()["baseline_accuracy"] == base
    assert {"accuracy", "accuracy_stderr", "split", "examples"} <= set(result.fields())     # the keys of before
    assert result.accuracy <= base                   # an untrained reader: the premise of the warning
    [warning] = [w for w in result.warnings if NOT_ABOVE in w]
    assert_says(warning, f"the checkpoint's valid accuracy {result.accuracy:.4f}", f"baseline {base:.4f}")
    assert_says(evaluate.describe(result), f"valid accuracy: {result.accuracy:.4f}",
                f"(most-frequent-candidate baseline {base:.4f}, and not above it)")
    above = evaluate.describe(dataclasses.replace(result, accuracy=0.9))
    assert_says(above, f"(most-frequent-candidate baseline {base:.4f})")
    assert "not above" not in above


def test_evaluate_on_input_questions_gives_their_baseline(scored, tmp_path):
    source, prepared, ckpt = scored
    questions = _questions(source, tmp_path / "q.jsonl")
    result = evaluate.run(ckpt, prepared, None, tmp_path / "p.parquet", input_path=questions, precision="fp32")
    assert result.baseline_accuracy == frequency.run(prepared, "valid").accuracy     # the same questions
    assert_says(evaluate.describe(result), f"{questions} accuracy:",
                f"(most-frequent-candidate baseline {result.baseline_accuracy:.4f}")
    [warning] = [w for w in result.warnings if NOT_ABOVE in w]
    assert_says(warning, f"the checkpoint's {questions} accuracy")


def test_evaluate_records_the_baseline_on_the_training_run(scored, tmp_path):
    from fakes import FakeTracker

    _, prepared, ckpt = scored
    tracker = FakeTracker()
    run = tracker.start_run("train-cbt-ne", "r", tags={"checkpoint": str(ckpt)})
    result = evaluate.record(evaluate.run(ckpt, prepared, "valid", tmp_path / "p.parquet", precision="fp32"),
                             lambda: tracker, tracker.uri)
    assert result.recorded_on_run == run.run_id
    assert run.last("evaluate/valid_baseline_acc") == pytest.approx(result.baseline_accuracy)
    assert run.last("evaluate/valid_acc") == pytest.approx(result.accuracy)
    assert_says(evaluate.describe(result), "evaluate/valid_acc, _baseline_acc")


def test_predict_gives_the_baseline_of_the_questions_that_give_an_answer(scored, tmp_path):
    source, prepared, ckpt = scored
    questions = _questions(source, tmp_path / "q.jsonl", answered=range(4))
    result = predict.run(questions, tmp_path / "a.jsonl", checkpoint=ckpt, data_dir=prepared, precision="fp32")
    from iaa.data.loading.loader import PreparedData

    rows = PreparedData.open(prepared).table("valid").slice(0, 4)        # the answered ones, as prepared
    expected = frequency.of_table(rows)
    assert expected != frequency.run(prepared, "valid").accuracy          # so the subset is what counts
    assert result.baseline_accuracy == expected and result.fields()["baseline_accuracy"] == expected
    assert result.accuracy is not None and result.accuracy <= expected
    assert_says(result.accuracy_over, "over the 4 of 10 questions that give an answer",
                f"(most-frequent-candidate baseline {expected:.4f}, and not above it)")
    [warning] = [w for w in result.warnings if NOT_ABOVE in w]
    assert_says(warning, f"the checkpoint's {questions} accuracy {result.accuracy:.4f}", f"baseline {expected:.4f}")


def test_predict_without_answers_has_no_baseline(scored, tmp_path):
    source, prepared, ckpt = scored
    questions = _questions(source, tmp_path / "q.jsonl", answered=range(0))
    result = predict.run(questions, tmp_path / "a.jsonl", checkpoint=ckpt, data_dir=prepared, precision="fp32")
    assert result.accuracy is None and result.baseline_accuracy is None
    assert "baseline" not in result.accuracy_over and not [w for w in result.warnings if NOT_ABOVE in w]


def test_the_warning_names_the_split_or_file_it_was_measured_on():
    assert frequency.below_warning(0.5, 0.3, "the checkpoint", on="test") == []
    [warning] = frequency.below_warning(0.3067, 0.3067, "the checkpoint", on="test")
    assert warning.startswith(f"the checkpoint's test accuracy 0.3067 {NOT_ABOVE} 0.3067")
    assert frequency.below_warning(0.2, 0.3, "the run")[0].startswith("the run's valid accuracy 0.2000")
