"""How far an accuracy measured on n questions can be trusted: its 95% interval.

Every command that prints an accuracy prints it through :func:`accuracy_text`: the value, the
95% Wilson score interval (``z = 1.96``) and the split size. Wilson's interval, unlike
p ± 1.96 SE, never shrinks to nothing: at an accuracy of 1 on 2,000 questions it still runs
from 0.9981 to 1. Where it is nearly centred on the accuracy it is printed as ``p ± half-width``,
else as its two ends; an accuracy of exactly 1 or 0 is said as a count (``0 errors in 2,000``).
Where the interval is wider than :data:`NOISE_POINTS` points either side, a note says that a
comparison at that size is noise. The JSON beside an accuracy keeps the binomial standard error
sqrt(p(1 - p) / n) (:func:`fields`).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from iaa.jobs.ports import trial_said

Z95 = 1.96
NOISE_POINTS = 5.0          # a 95% interval wider than this many points either side: noise


def standard_error(p: float, n: int) -> float:
    """sqrt(p(1 - p) / n), in accuracy units (0.01 is one point); nan for n = 0."""
    if n <= 0:
        return float("nan")
    p = min(max(float(p), 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / n)


def wilson_interval(p: float, n: int) -> tuple[float, float]:
    """The Wilson score 95% interval of an accuracy ``p`` on ``n`` questions; (0, 1) for n = 0."""
    if n <= 0:
        return 0.0, 1.0
    p = min(max(float(p), 0.0), 1.0)
    z2 = Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def half_width_points(p: float, n: int) -> float:
    """Half the width of the Wilson 95% interval of ``p`` on ``n`` questions, in points; inf for n = 0."""
    if n <= 0:
        return math.inf
    low, high = wilson_interval(p, n)
    return 100.0 * (high - low) / 2


def is_noise(p: float, n: int) -> bool:
    """True when the 95% interval is wider than ±:data:`NOISE_POINTS` points."""
    return half_width_points(p, n) > NOISE_POINTS


def accuracy_text(p: float, n: int) -> str:
    """``0.8550 ± 0.0154 (n=2000, 95%)``: the accuracy and its 95% Wilson interval. An interval far from
    centred on ``p`` is given by its ends, ``0.2500 (95% interval 0.1601 to 0.3685, n=64; ...)``,
    and a perfect or null score as a count, ``1.0000 (0 errors in 2,000; 95% interval 0.9981 to 1.0000)``."""
    if n <= 0:
        return f"{p:.4f} (n=0)"
    low, high = wilson_interval(p, n)
    half, correct = (high - low) / 2, round(p * n)
    if correct in (0, n):
        count = f"0 errors in {n:,}" if correct == n else f"0 correct in {n:,}"
        text = f"{p:.4f} ({count}; 95% interval {low:.4f} to {high:.4f}"
    elif abs((low + high) / 2 - p) <= half / 10:
        text = f"{p:.4f} ± {half:.4f} (n={n}, 95%"
    else:
        text = f"{p:.4f} (95% interval {low:.4f} to {high:.4f}, n={n}"
    if is_noise(p, n):
        text += "; a comparison at this size is noise"
    return text + ")"


def fields(prefix: str, p: float | None, n: int) -> dict[str, float | int | None]:
    """The JSON keys that go beside an accuracy ``PREFIX``: ``PREFIX_n`` and ``PREFIX_stderr``."""
    se = None if p is None or n <= 0 else round(standard_error(p, n), 6)
    return {f"{prefix}_n": n, f"{prefix}_stderr": se}


def tied_best(scores: Mapping[str, float | None]) -> list[str]:
    """The names whose score equals the best one (exactly, as printed to 4 places); [] for none."""
    known = {k: round(v, 4) for k, v in scores.items() if v is not None}
    if not known:
        return []
    best = max(known.values())
    return [k for k, v in known.items() if v == best]


def tie_note(names: Sequence[str], kept: str, score: float, n: int) -> str:
    """A tie among ``names`` named as one: which was kept, and that the pick means nothing."""
    others = ", ".join(name for name in names if name != kept)
    return (f"{len(names)} trials tie at valid accuracy {accuracy_text(score, n)}: {kept} was kept "
            f"(the first in the sweep's order) and {others} did as well; the pick between them is arbitrary")


def difference_half_width(p: float, q: float, n: int) -> float:
    """Half the 95% interval, in points, of the difference of two accuracies ``p`` and ``q`` each
    measured on ``n`` questions, taken as independent: how far apart chance alone puts two
    readers' scores (two readers scored on the same questions agree more often than that, so a
    gap inside it is not evidence of one being better); inf for n = 0."""
    if n <= 0:
        return math.inf
    p, q = (min(max(float(x), 0.0), 1.0) for x in (p, q))
    return 100.0 * Z95 * math.sqrt((p * (1 - p) + q * (1 - q)) / n)


def close_to_best(scores: Mapping[str, float | None], n: int) -> list[str]:
    """The names whose score is below the best one (not tied with it: :func:`tied_best`) by less than
    :func:`difference_half_width`, closest first; [] for none."""
    ties = tied_best(scores)
    if not ties:
        return []
    best = max(v for v in scores.values() if v is not None)
    close = [(best - v, k) for k, v in scores.items()
             if v is not None and k not in ties and 100.0 * (best - v) < difference_half_width(best, v, n)]
    return [k for _, k in sorted(close)]


def close_note(close: Sequence[str], scores: Mapping[str, float | None], best: str, n: int,
               more: str = "") -> str:
    """What :func:`close_to_best` found, in one line: the trials that chance alone could have put
    behind ``best`` on ``n`` questions, the widest such gap, and ``more`` (what tells them apart)."""
    top = scores[best] or 0.0
    shown = [f"{k} ({scores[k]:.4f})" for k in close[:3]] + ([f"{len(close) - 3} more"] if len(close) > 3 else [])
    widest = max(difference_half_width(top, scores[k] or 0.0, n) for k in close)
    return (f"the best {trial_said(best)} ({top:.4f}) leads {', '.join(shown)} by less than chance moves two readers' "
            f"scores on {n:,} questions ({'' if len(close) == 1 else 'up to '}{widest:.2f} points at 95%), and "
            f"a seed moves one further: the sweep cannot tell which is better" + (f"; {more}" if more else ""))
