"""How far an accuracy measured on n questions can be trusted: its binomial standard error.

Every command that prints an accuracy prints it through :func:`accuracy_text`: the value, its
standard error sqrt(p(1 - p) / n) and the split size, and where the 95% interval is wider than
:data:`NOISE_POINTS` points either side, a note that a comparison at that size is noise. The
interval judged is Wilson's (``z = 1.96``), which, unlike p ± 1.96 SE, does not shrink to nothing
at an accuracy of 0 or 1 on a handful of questions.
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

Z95 = 1.96
NOISE_POINTS = 5.0          # a 95% interval wider than this many points either side: noise


def standard_error(p: float, n: int) -> float:
    """sqrt(p(1 - p) / n), in accuracy units (0.01 is one point); nan for n = 0."""
    if n <= 0:
        return float("nan")
    p = min(max(float(p), 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / n)


def half_width_points(p: float, n: int) -> float:
    """Half the width of the Wilson 95% interval of ``p`` on ``n`` questions, in points; inf for n = 0."""
    if n <= 0:
        return math.inf
    p = min(max(float(p), 0.0), 1.0)
    z2 = Z95 * Z95
    return 100.0 * Z95 * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)


def is_noise(p: float, n: int) -> bool:
    """True when the 95% interval is wider than ±:data:`NOISE_POINTS` points."""
    return half_width_points(p, n) > NOISE_POINTS


def accuracy_text(p: float, n: int) -> str:
    """``0.2000 ± 0.1789 (n=5; 95% interval ±35 points: a comparison at this size is noise)``."""
    se = standard_error(p, n)
    text = f"{p:.4f} ± {se:.4f} (n={n}" if n > 0 else f"{p:.4f} (n=0"
    if is_noise(p, n):
        text += f"; 95% interval ±{half_width_points(p, n):.0f} points: a comparison at this size is noise"
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
