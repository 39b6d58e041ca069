"""What ``iaa-cli ensemble`` asks for (:class:`EnsembleRequest`), checked once when made."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from iaa.jobs.config.job_config import ConfigError
from iaa.jobs.evaluation.ensembling import averaging
from iaa.jobs.workdir import names
from iaa.jobs.workdir.paths import DEFAULT_WORKDIR


@dataclass(frozen=True)
class EnsembleRequest:
    """What ``iaa-cli ensemble`` asks for; exactly one of ``sweep`` and ``members``, checked here."""

    sweep: str | None = None
    members: tuple[Path, ...] = ()
    dataset: str | None = None
    data: Path | None = None
    top_configs: int = 1          # K best configurations of the sweep
    seeds: int = 5                # N seeds of each
    select: str = "all"           # all | top-p | greedy, decided on valid
    p: float = 0.5                # fraction kept by top-p
    name: str | None = None
    workdir: Path = Path(DEFAULT_WORKDIR)
    storage_path: str | None = None
    workers_per_trial: int = 1    # Ray Train workers per member trained
    gpus_per_worker: float = 0.0
    show_progress: bool = True
    verbose: bool = False         # Ray Tune's own status tables while members train
    register: str | None = None   # register the ensemble's MLflow model under this name
    overwrite: bool = False       # replace a finished ensemble of the same name
    calibrate: bool = True        # fit the ensemble's temperature on valid (answers unchanged)
    address: str | None = None    # the Ray cluster members train on; None: a local Ray (the resume line names it)
    tracking_uri: str | None = None   # the store given; named in the resume line (the tracker is the caller's)

    def __post_init__(self) -> None:
        object.__setattr__(self, "members", distinct_members(self.members))
        object.__setattr__(self, "workdir", Path(self.workdir))
        names.folder_name(self.name)
        names.folder_name(self.sweep, "`sweep`")
        names.registered_name(self.register)
        if (self.sweep is None) == (not self.members):
            raise ConfigError("give exactly one of `sweep` NAME or `members` CKPT ...")
        if self.select not in averaging.SELECT_MODES:
            raise ConfigError(f"unknown selection {self.select!r}; choose from {list(averaging.SELECT_MODES)}")
        if self.top_configs < 1 or self.seeds < 1:
            raise ConfigError("`top_configs` and `seeds` must be >= 1")
        if not 0 < self.p <= 1:
            raise ConfigError("`p` must be in (0, 1]")


def distinct_members(members: Sequence[Path]) -> tuple[Path, ...]:
    """The ensemble's checkpoints; ConfigError when one is listed twice (it would count as two members)."""
    seen: dict[Path, Path] = {}
    for member in members:
        key = Path(member).resolve()
        if key in seen:
            raise ConfigError(f"{member}: listed twice in `members` (also as {seen[key]}); an ensemble averages "
                              "distinct checkpoints, so list each once")
        seen[key] = Path(member)
    return tuple(Path(m) for m in members)
