"""The most-frequent-candidate baseline: answer the candidate that occurs most often in the document."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from iaa.jobs.evaluation.result import Keyed, Result


def accuracy(doc_cand: list[list[int]], n_cands: list[int], answers: list[int]) -> float:
    """Accuracy of the most frequent candidate; ties go to the first candidate, as CBT's authors did."""
    correct = 0
    for positions, n, gold in zip(doc_cand, n_cands, answers):
        counts = np.bincount(np.asarray([p for p in positions if p >= 0], dtype=np.int64), minlength=n)
        correct += int(np.argmax(counts[:n]) == gold)
    return correct / max(len(answers), 1)


@dataclass(frozen=True, kw_only=True)
class BaselineResult(Keyed, Result):
    """``iaa-cli baseline``: the most-frequent-candidate accuracy on one split of prepared data."""

    baseline: str = "most-frequent-candidate"
    split: str
    accuracy: float
    examples: int


def of_table(table: Any) -> float | None:
    """The baseline's accuracy over the rows of ``table`` (a pyarrow table with the columns of
    ``iaa.data.prepared.shards.SCHEMA``) that give an answer: a prepared split, or questions read from a
    file, where ``answer`` is -1 for a question that gives none; None where no row gives one."""
    rows = [(positions, len(cands), gold) for positions, cands, gold in zip(
        table.column("doc_cand").to_pylist(), table.column("candidates").to_pylist(),
        table.column("answer").to_pylist()) if gold >= 0]
    if not rows:
        return None
    doc_cand, n_cands, answers = zip(*rows)
    return accuracy(list(doc_cand), list(n_cands), list(answers))


def run(data_dir: Path, split: str) -> BaselineResult:
    """The baseline's accuracy on ``split`` of the prepared ``data_dir``."""
    from iaa.data.loading.loader import PreparedData

    table = PreparedData.open(Path(data_dir)).table(split)
    acc = of_table(table)
    return BaselineResult(split=split, accuracy=0.0 if acc is None else acc, examples=table.num_rows)


def beside(accuracy: float, baseline: float, n: int | None = None) -> str:
    """``accuracy`` with the baseline beside it, saying when the reader is not above it; with the
    split size ``n``, the accuracy carries its 95% interval and says when it is noise."""
    from iaa.jobs.evaluation.uncertainty import accuracy_text

    shown = f"{accuracy:.4f}" if n is None else accuracy_text(accuracy, n)
    return f"{shown} {note(accuracy, baseline)}"


def note(accuracy: float, baseline: float) -> str:
    """``(most-frequent-candidate baseline 0.3640)``, saying ``, and not above it`` where ``accuracy`` is not."""
    below = ", and not above it" if accuracy <= baseline else ""
    return f"(most-frequent-candidate baseline {baseline:.4f}{below})"


def below_warning(accuracy: float, baseline: float, what: str, on: str = "valid") -> list[str]:
    """A warning when ``what``'s accuracy on ``on`` (a split, or a questions file) is not above
    the baseline; [] otherwise."""
    if accuracy > baseline:
        return []
    return [f"{what}'s {on} accuracy {accuracy:.4f} is not above the most-frequent-candidate baseline "
            f"{baseline:.4f}: train longer, on more data, or check the questions"]
