"""The most-frequent-candidate baseline: answer the candidate that occurs most often in the document."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def run(data_dir: Path, split: str) -> BaselineResult:
    """The baseline's accuracy on ``split`` of the prepared ``data_dir``."""
    from iaa.data.loader import PreparedData

    table = PreparedData.open(Path(data_dir)).table(split)
    acc = accuracy(table.column("doc_cand").to_pylist(),
                   [len(c) for c in table.column("candidates").to_pylist()],
                   table.column("answer").to_pylist())
    return BaselineResult(split=split, accuracy=acc, examples=table.num_rows)


def beside(accuracy: float, baseline: float, n: int | None = None) -> str:
    """``accuracy`` with the baseline beside it, saying when the reader is not above it; with the
    split size ``n``, the accuracy carries its 95% interval and says when it is noise."""
    from iaa.jobs.evaluation.uncertainty import accuracy_text

    below = ", and not above it" if accuracy <= baseline else ""
    shown = f"{accuracy:.4f}" if n is None else accuracy_text(accuracy, n)
    return f"{shown} (most-frequent-candidate baseline {baseline:.4f}{below})"


def below_warning(accuracy: float, baseline: float, what: str) -> list[str]:
    """A warning when ``what``'s valid accuracy is not above the baseline; [] otherwise."""
    if accuracy > baseline:
        return []
    return [f"{what}'s valid accuracy {accuracy:.4f} is not above the most-frequent-candidate baseline "
            f"{baseline:.4f}: train longer, on more data, or check the questions"]
