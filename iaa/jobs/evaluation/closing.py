"""How a command ends: why it stopped, in words, and the next commands, each runnable as printed."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Mapping, Sequence

from iaa.jobs.workdir.paths import DEFAULT_WORKDIR

STOP_WORDS = {"max-epochs": "stopped at max-epochs (train.max_epochs)",
              "max-time": "stopped at max-time (train.max_minutes)",
              "early-stopped": "stopped early: train.patience checks without improvement"}


def still_improving(result: Mapping[str, Any]) -> bool:
    """The run's last check was its best (the budget ended it, not a plateau)."""
    steps, best = result.get("steps"), result.get("best_step")
    return isinstance(steps, int) and isinstance(best, int) and steps > 0 and best == steps


def stop_words(result: Mapping[str, Any], epochs: float | None = None) -> str:
    """Why the run stopped, in words; when a budget ended it while it was still improving, it says
    so and names the setting that gives it more."""
    reason = str(result.get("stop_reason") or "")
    words = STOP_WORDS.get(reason, f"stopped ({reason or 'unknown reason'})")
    if reason in ("max-epochs", "max-time") and still_improving(result):
        more = (f"--set train.max_epochs={2 * epochs:g}" if reason == "max-epochs" and epochs
                else "--set train.max_epochs=N" if reason == "max-epochs" else "--set train.max_minutes=N")
        words += f" while still improving (its last check was its best): give it more with {more}"
    return words


def where_flags(workdir: Path | str | None, tracking_uri: str | None = None) -> str:
    """`` --workdir W`` and `` --tracking-uri U`` where they are not the defaults."""
    flags = "" if workdir is None or Path(workdir) == Path(DEFAULT_WORKDIR) else f" --workdir {q(workdir)}"
    return flags + (f" --tracking-uri {q(tracking_uri)}" if tracking_uri else "")


def q(value: Any) -> str:
    """``value`` quoted for any POSIX shell."""
    return shlex.quote(str(value))


def next_block(commands: Sequence[str]) -> str:
    """``next:`` and one indented command a line."""
    return "next:\n" + "\n".join(f"  {c}" for c in commands)


def rounded(value: Any) -> str:
    """A number for people: floats to 4 significant places, the rest as they are."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
