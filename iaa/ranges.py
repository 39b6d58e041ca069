"""Declared ranges of numeric settings, shared by every config class (the reader's and the jobs').

Each config class lists a :class:`Range` per numeric field in ``RANGES`` and calls
:func:`check_ranges` when it is built, so a value out of range (NaN and infinity always are) is
refused by name before anything runs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: always finite, within ``low``..``high`` (either may
    be open, or None for no bound). Upper bounds keep a setting below what would hang or overflow."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            return f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low:g} and finite"
        return f"{'<' if self.high_open else '<='} {self.high:g} and finite" if self.high is not None else "finite"


def check_ranges(cfg: Any, ranges: Mapping[str, Range], section: str) -> None:
    """Raise ValueError naming ``section.field`` for the first numeric field outside its range."""
    for name, allowed in ranges.items():
        value = getattr(cfg, name)
        if value not in allowed:
            raise ValueError(f"{section}.{name} must be {allowed}, got {shown_number(value)}")


def shown_number(value: float) -> str:
    """``value`` short: a huge integer as ``1e+30`` (or its number of digits), not 31 digits."""
    if not isinstance(value, int) or abs(value) < 10**15:
        return repr(value)
    if value.bit_length() < 1000:
        return f"{float(value):.3g}"
    return f"an integer of about {int(value.bit_length() * math.log10(2))} digits"
