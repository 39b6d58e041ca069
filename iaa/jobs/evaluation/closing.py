"""How a command ends: why it stopped, in words, and the next commands, each runnable as printed."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence


STOP_WORDS = {"max-epochs": "stopped at max-epochs (train.max_epochs)",
              "max-time": "stopped at max-time (train.max_minutes)",
              "early-stopped": "stopped early: train.patience checks without improvement"}


def still_improving(steps: int | None, best_step: int | None, checks: int | None = None) -> bool:
    """The run's last check was its best (the budget ended it, not a plateau), and it made more
    than one (``checks``, where known: a single check improved on nothing)."""
    return (isinstance(steps, int) and isinstance(best_step, int) and steps > 0 and best_step == steps
            and (checks is None or checks >= 2))


def stop_words(reason: str | None, *, steps: int | None, best_step: int | None, epochs: float | None = None,
               checks: int | None = None, advice: bool = True) -> str:
    """Why the run stopped (``reason``: its stop reason), in words; when a budget ended it while it
    was still improving (its last check, at ``steps``, was its best of ``checks``), it says so and,
    with ``advice``, names how to give it more: its resume with a larger budget (``epochs``: the
    epochs it ran)."""
    reason = str(reason or "")
    words = STOP_WORDS.get(reason, f"stopped ({reason or 'unknown reason'})")
    if reason in ("max-epochs", "max-time") and still_improving(steps, best_step, checks):
        more = (f"train.max_epochs={2 * epochs:g}" if reason == "max-epochs" and epochs
                else "train.max_epochs=N" if reason == "max-epochs" else "train.max_minutes=N")
        words += " while still improving (its last check was its best)"
        if advice:
            words += f": give it more with `resume` and `sets` {more}"
    return words


@dataclass(frozen=True)
class Command:
    """A command to run next: its name and its options by their Python names, in order.

    A value of True is a bare flag; a tuple repeats the option once per item. As text
    (:meth:`__str__`) each option is written `` `name` VALUE``: the command line spells the flag.
    """

    name: str
    options: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, name: str, /, **options: Any) -> Command:
        """``name`` with ``options``, leaving out those that are None, False or empty; a path is
        made absolute, so that the command runs as printed from any folder."""
        return cls(name, tuple((key, _absolute(value) if key in PATH_OPTIONS else value)
                               for key, value in options.items()
                               if value is not None and value is not False and value != ()))

    def plus(self, **options: Any) -> Command:
        return Command(self.name, self.options + Command.of(self.name, **options).options)

    def __str__(self) -> str:
        parts = [f"iaa-cli {self.name}"]
        for key, value in self.options:
            for item in value if isinstance(value, tuple) else (value,):
                parts.append(f"`{key}`" if item is True else f"`{key}` {q(item)}")
        return " ".join(parts)


# The options that name a local file or folder (a URI, ``s3://...``, stays as it is).
PATH_OPTIONS = frozenset({"checkpoint", "config_file", "data", "ensemble_dir", "input_path", "members", "out",
                          "run_dir", "source", "workdir"})


def _absolute(value: Any) -> Any:
    if isinstance(value, tuple):
        return tuple(_absolute(v) for v in value)
    if isinstance(value, (str, Path)) and "://" not in str(value):
        return str(Path(value).absolute())
    return value


def where(workdir: Path | str | None, tracking_uri: str | None = None) -> dict[str, str]:
    """The ``workdir`` option (absolute, the default one too, so that a command run as printed from
    another folder reaches the same work folder and store) and ``tracking_uri`` where given."""
    found = {} if workdir is None else {"workdir": str(Path(workdir).absolute())}
    return found | ({"tracking_uri": tracking_uri} if tracking_uri else {})


def q(value: Any) -> str:
    """``value`` quoted for any POSIX shell."""
    return shlex.quote(str(value))


def next_block(commands: Sequence[Command | str]) -> str:
    """``next:`` and one indented command a line."""
    return "next:\n" + "\n".join(f"  {c}" for c in commands)


def rounded(value: Any) -> str:
    """A number for people: floats to 4 significant places, the rest as they are."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
