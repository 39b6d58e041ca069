"""How far a reader's answer probabilities can be taken at their word.

Two figures over a split's questions, from the candidate distributions that ``evaluate``,
``predict`` and ``serve`` return (the pointer-sums renormalised over the candidates):

- **log-loss**: the mean of -log p(gold answer). A gold answer given probability 0 (absent from
  the document) counts as :data:`FLOOR`, so one such question cannot make the mean infinite.
- **calibration error** (expected calibration error, Guo, Pleiss, Sun and Weinberger 2017): the
  questions put in :data:`BINS` equal-width bins by the probability of the reader's answer; in
  each, the gap between that mean probability and the share answered right; the gaps averaged,
  weighted by each bin's share of the questions. 0 when a reader that says 0.8 is right 80% of
  the time; in accuracy units, like the accuracies beside it.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

BINS = 15
FLOOR = 1e-12          # the probability a gold answer is counted at, at least: -log(FLOOR) is 27.6


@dataclass(frozen=True)
class Calibration:
    """The log-loss and calibration error of a split's distributions, and the mean probability
    of the answers given."""

    log_loss: float
    calibration_error: float
    mean_confidence: float

    def fields(self, prefix: str = "") -> dict[str, float]:
        """``PREFIXlog_loss``, ``PREFIXcalibration_error`` and ``PREFIXmean_confidence``, rounded for JSON."""
        return {f"{prefix}{name}": round(value, 6) for name, value in asdict(self).items()}


def of(probs: np.ndarray, gold: np.ndarray) -> Calibration:
    """The :class:`Calibration` of ``probs`` (E, C), each row a distribution over its candidates
    (0 past the real ones), against the gold indices ``gold`` (E,); NaNs for no question."""
    probs, gold = np.asarray(probs, dtype=np.float64), np.asarray(gold, dtype=np.int64)
    if len(gold) == 0:
        return Calibration(math.nan, math.nan, math.nan)
    rows = np.arange(len(gold))
    loss = float(-np.log(np.maximum(probs[rows, gold], FLOOR)).mean())
    answer = probs.argmax(axis=1)
    confidence = probs[rows, answer]
    right = (answer == gold).astype(np.float64)
    bins = np.minimum((confidence * BINS).astype(np.int64), BINS - 1)
    gap = 0.0
    for b in np.unique(bins):
        held = bins == b
        gap += held.mean() * abs(confidence[held].mean() - right[held].mean())
    return Calibration(loss, float(gap), float(confidence.mean()))


def of_rows(probs: list[list[float]], gold: list[int]) -> Calibration:
    """:func:`of` for ragged rows of candidate probabilities (CNN's counts vary per question)."""
    width = max((len(p) for p in probs), default=0)
    padded = np.zeros((len(probs), width))
    for i, row in enumerate(probs):
        padded[i, : len(row)] = row
    return of(padded, np.asarray(gold))


def text(found: Calibration) -> str:
    """``log-loss 0.312, calibration error 2.1 points (answers given with 0.874 on average)``."""
    return (f"log-loss {found.log_loss:.3f}, calibration error {100 * found.calibration_error:.1f} points "
            f"(answers given with {found.mean_confidence:.3f} on average)")
