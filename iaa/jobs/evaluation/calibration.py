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

An average of readers that disagree is less sure than each of them: averaging takes off much
of a reader's overconfidence, and can overshoot into underconfidence. **Temperature scaling**
(Guo et al. 2017) corrects what is left, either way, without changing an answer: each
distribution is raised to the power 1/T and renormalised over its candidates,
``p_c^(1/T) / sum_j p_j^(1/T)`` (a softmax of the log-probabilities divided by T), with the one
T that minimises the log-loss on the validation split (:func:`fit_temperature`). T < 1 sharpens,
T > 1 softens; the order of the candidates, hence every answer, stays. A reader's T is fitted at
each training check, on that check's validation answers (``iaa.jobs.training.loop``), and kept in
its checkpoint; an ensemble's on its averaged answers (``iaa.jobs.evaluation.ensembling.averaging``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:
    import torch

BINS = 15
FLOOR = 1e-12          # the probability a gold answer is counted at, at least: -log(FLOOR) is 27.6
TEMPERATURES = (0.1, 10.0)   # the range fit_temperature searches


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


def padded(rows: Sequence[Sequence[float]]) -> np.ndarray:
    """Ragged rows of candidate probabilities as one (E, C) array, 0 past each row's candidates."""
    out = np.zeros((len(rows), max((len(r) for r in rows), default=0)))
    for i, row in enumerate(rows):
        out[i, : len(row)] = row
    return out


def scaled(probs: np.ndarray, temperature: float) -> np.ndarray:
    """``probs`` (E, C) raised to ``1 / temperature`` and renormalised over each row's candidates;
    a probability of 0 (a candidate absent from the document, a column past the real ones) stays
    0, and so does a row of zeros."""
    probs = np.asarray(probs, dtype=np.float64)
    if temperature == 1.0:
        return probs
    logs = _logs(probs) / temperature
    top = logs.max(axis=1, keepdims=True)
    weights = np.exp(logs - np.where(np.isfinite(top), top, 0.0))
    total = weights.sum(axis=1, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


def fit_temperature(probs: np.ndarray, gold: np.ndarray,
                    total: Callable[[Sequence[float]], list[float]] | None = None) -> float:
    """The temperature in :data:`TEMPERATURES` under which ``probs`` (E, C) give their gold
    answers ``gold`` (E,) the least log-loss; 1.0 when no question can tell: none gives its gold
    answer a probability above 0 beside another candidate, or every one is answered right (the
    log-loss then falls without end as T falls to 0, and nothing says how sure to be).

    ``total`` sums figures over the processes that each hold a share of the questions (a
    data-parallel run's all-reduce): every process calls this with its share, and all of them
    find the temperature of all the questions. None: these are all the questions.

    The log-loss is convex in 1/T (a log-sum-exp of lines in it, less a line), so a golden-section
    search over 1/T finds the minimum; 1/T to within 1e-6 of the range's width.
    """
    total = total or (lambda figures: [float(f) for f in figures])
    logs = _logs(np.asarray(probs, dtype=np.float64))
    gold = np.asarray(gold, dtype=np.int64)
    rows = np.arange(len(gold))
    gold_logs = logs[rows, gold] if len(gold) else np.zeros(0)
    telling = np.isfinite(gold_logs) & (np.isfinite(logs).sum(axis=1) > 1)
    logs, gold_logs = logs[telling], gold_logs[telling]
    wrong = int((logs.argmax(axis=1) != gold[telling]).sum()) if len(logs) else 0
    questions, wrong = total([len(logs), wrong])
    if questions == 0 or wrong == 0:
        return 1.0
    # log sum_j p_j^b - b log p_gold = b (top - log p_gold) + log sum_j exp(b (log p_j - top)), over
    # each row's candidates only (a CNN row has a few dozen of the hundreds its batch is padded to)
    finite = np.isfinite(logs)
    top = logs.max(axis=1) if len(logs) else np.zeros(0)
    below = (logs - top[:, None])[finite]                      # row by row, each row's candidates
    counts = finite.sum(axis=1)
    starts = np.cumsum(counts) - counts
    margin = top - gold_logs

    def loss(inverse: float) -> float:
        rows = np.add.reduceat(np.exp(below * inverse), starts) if len(starts) else np.zeros(0)
        return total([float(np.sum(np.log(rows) + margin * inverse))])[0] / questions

    low, high = 1.0 / TEMPERATURES[1], 1.0 / TEMPERATURES[0]
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = high - ratio * (high - low), low + ratio * (high - low)
    fa, fb = loss(a), loss(b)
    while high - low > 1e-6 * (1.0 / TEMPERATURES[0] - 1.0 / TEMPERATURES[1]):
        if fa <= fb:
            high, b, fb = b, a, fa
            a = high - ratio * (high - low)
            fa = loss(a)
        else:
            low, a, fa = a, b, fb
            b = low + ratio * (high - low)
            fb = loss(b)
    return 1.0 / ((low + high) / 2.0)


def stacked(batches: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[np.ndarray, np.ndarray]:
    """Batches' ``(probs (B, C), gold (B,))`` tensors, on any device, as one (E, C) array (0 past
    a batch's columns) and one (E,) array: one read back from the device."""
    import torch

    if not batches:
        return np.zeros((0, 0)), np.zeros(0, dtype=np.int64)
    width = max(probs.shape[1] for probs, _ in batches)
    probs = torch.cat([torch.nn.functional.pad(p.double(), (0, width - p.shape[1])) for p, _ in batches])
    gold = torch.cat([g for _, g in batches])
    return probs.cpu().numpy(), gold.cpu().numpy().astype(np.int64)


def _logs(probs: np.ndarray) -> np.ndarray:
    """log p, with -inf where p is 0."""
    with np.errstate(divide="ignore"):
        return np.log(probs)


def scaling_text(temperature: float, split: str, error: float, scaled_error: float, loss: float,
                 scaled_loss: float) -> str:
    """What a temperature fitted on valid did to ``split``'s figures: ``1.15, fitted on valid:
    test calibration error 2.9 -> 1.8 points, log-loss 1.862 -> 1.854``; on valid, ``(the
    questions it was fitted to)``, and at the edge of :data:`TEMPERATURES`, a note."""
    inside = TEMPERATURES[0] * 1.01 < temperature < TEMPERATURES[1] / 1.01
    edge = "" if inside else " (the edge of the range searched)"
    fitted = " (the questions it was fitted to)" if split == "valid" else ""
    return (f"{temperature:.3g}, fitted on valid{edge}: {split} calibration error {100 * error:.1f} -> "
            f"{100 * scaled_error:.1f} points, log-loss {loss:.3f} -> {scaled_loss:.3f}{fitted}")


def text(found: Calibration) -> str:
    """``log-loss 0.312, calibration error 2.1 points (answers given with 0.874 on average)``."""
    return (f"log-loss {found.log_loss:.3f}, calibration error {100 * found.calibration_error:.1f} points "
            f"(answers given with {found.mean_confidence:.3f} on average)")
