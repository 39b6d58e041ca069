"""Job configuration: frozen, typed, nested; loaded from YAML plus ``--set a.b=v`` overrides."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from iaa.errors import IaaError
from iaa.model.config import ReaderConfig


@dataclass(frozen=True)
class TrainConfig:
    """The paper's "Training Details", plus the budget of one run."""

    lr: float = 1e-3
    batch_size: int = 32
    clip: float = 5.0             # gradient-norm clipping
    embed_l2: float = 1e-4        # L2 weight on the word embedding
    check_every: int = 0          # batches between validation checks; 0 means every half epoch
    lr_decay: float = 0.8         # lr multiplier when valid accuracy did not improve at a check
    patience: int = 6             # checks without improvement before stopping early
    max_epochs: float = 10.0
    max_minutes: float = 0.0      # wall-clock budget; 0 means none
    seed: int = 0
    threads: int = 0              # torch intra-op threads; 0 leaves torch's default
    precision: str = "fp32"       # fp32 | bf16: forward passes under bf16 autocast (CUDA or CPU)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"train.batch_size must be >= 1, got {self.batch_size}")
        if self.lr <= 0:
            raise ValueError(f"train.lr must be > 0, got {self.lr}")
        if self.max_epochs <= 0:
            raise ValueError(f"train.max_epochs must be > 0, got {self.max_epochs}")


@dataclass(frozen=True)
class JobConfig:
    """Everything a training run needs; checkpoints and MLflow runs store all of it."""

    dataset: str = "demo"
    model: ReaderConfig = field(default_factory=ReaderConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


class ConfigError(IaaError, ValueError):
    """A config file or override names an unknown key or holds a value of the wrong type."""


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _coerce(value: Any, current: Any, where: str) -> Any:
    if isinstance(value, str) and isinstance(current, (int, float)) and not isinstance(current, bool):
        try:  # YAML 1.1 reads "5e-4" (no dot) as a string
            value = float(value)
        except ValueError:
            pass
    if isinstance(current, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if isinstance(current, int) and not isinstance(current, bool):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if isinstance(current, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if isinstance(current, str) and not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def merge(cfg: Any, updates: Mapping[str, Any], prefix: str = "") -> Any:
    """A copy of the dataclass ``cfg`` with nested ``updates``; unknown keys are rejected."""
    known = {f.name for f in fields(cfg)}
    changes: dict[str, Any] = {}
    for key, value in updates.items():
        where = f"{prefix}{key}"
        if key not in known:
            raise ConfigError(f"unknown config key {where!r}; known keys here: {sorted(known)}")
        current = getattr(cfg, key)
        if is_dataclass(current):
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: expected a mapping of {sorted(f.name for f in fields(current))}")
            changes[key] = merge(current, value, prefix=f"{where}.")
        else:
            changes[key] = _coerce(value, current, where)
    try:
        return replace(cfg, **changes)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{prefix or 'config'}: {err}") from err


def parse_sets(sets: Sequence[str]) -> dict[str, Any]:
    """``["train.lr=1e-3", "model.steps=5"]`` -> ``{"train": {"lr": 0.001}, "model": {"steps": 5}}``."""
    nested: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key=value, got {item!r}")
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = yaml.safe_load(raw)
    return nested


def load(base: JobConfig, path: Path | None = None, sets: Sequence[str] = ()) -> JobConfig:
    """``base`` updated by the YAML file at ``path``, then by ``--set`` overrides."""
    cfg = base
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        data = yaml.safe_load(text) or {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        try:
            cfg = merge(cfg, data)
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from err
    return merge(cfg, parse_sets(sets))


def from_dict(data: Mapping[str, Any]) -> JobConfig:
    """Rebuild a JobConfig from ``to_dict`` output (for example, from a checkpoint)."""
    return merge(JobConfig(), data)


def dump_yaml(cfg: JobConfig, path: Path) -> None:
    Path(path).write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False), encoding="utf-8")
