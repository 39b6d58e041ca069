"""Job configuration: frozen, typed, nested; loaded from YAML plus ``--set a.b=v`` overrides."""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any, Callable, ClassVar, Literal, Mapping, Sequence

import yaml

from iaa.errors import IaaError
from iaa.files import atomic_write_text
from iaa.jobs.config import strict_yaml
from iaa.jobs.workdir import fields as fields_mod
from iaa.model.config import Range, ReaderConfig, check_ranges


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
    precision: Literal["auto", "fp32", "bf16"] = "auto"  # auto: bf16 where the machine runs it >= 1.5x faster (iaa.jobs.modeling.precision_policy)
    compile: bool = False         # torch.compile the reader's attention steps (CUDA graphs on CUDA)
    cuda_graphs: bool = True      # CUDA: each training step replays a CUDA graph (iaa.jobs.training.captured); ignored on the CPU

    RANGES: ClassVar[dict[str, Range]] = {
        "lr": Range(0.0, 10.0, low_open=True),       # Adam's step; 1e-3 in the paper
        "batch_size": Range(1, 65536),
        "clip": Range(0.0, 1e6, low_open=True),
        "embed_l2": Range(0.0, 10.0),                # beyond 1 the penalty outweighs any loss
        "check_every": Range(0, 10**9),              # 0: every half epoch
        "lr_decay": Range(0.0, 1.0, low_open=True),
        "patience": Range(1, 10**6),
        "max_epochs": Range(0.0, 10**6, low_open=True),
        "max_minutes": Range(0.0, 10**7),            # 0: no limit
        "seed": Range(0, 2**32 - 1),                 # numpy's and every worker's seed range
        "threads": Range(0, 4096),                   # 0: torch's default
    }

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES, "train")

    def max_steps(self, n_batches: int) -> int:
        """The training steps of ``max_epochs`` epochs of ``n_batches``. Rounded down, so that a
        budget like 1.5 epochs ends on the mid-epoch check instead of one step later, in an extra
        check of a single batch."""
        return max(1, math.floor(self.max_epochs * n_batches + 1e-9))

    def check_due(self, step: int, batch: int, n_batches: int) -> bool:
        """Whether a validation check follows the run's ``step``-th step, its epoch's ``batch``-th:
        every ``check_every`` steps, else at mid-epoch and at the end of the epoch."""
        if self.check_every:
            return step % self.check_every == 0
        return batch in (max(1, n_batches // 2), n_batches)

    def checks(self, n_batches: int) -> int:
        """The validation checks of a run that trains all its ``max_steps``: each one due, and one
        more after the last step where none is due there."""
        steps = self.max_steps(n_batches)
        if self.check_every:
            return math.ceil(steps / self.check_every)
        half = max(1, n_batches // 2)
        epochs, batch = divmod(steps, n_batches)
        per_epoch = 1 if half == n_batches else 2
        return epochs * per_epoch + (batch >= half) + (batch not in (0, half))


@dataclass(frozen=True)
class DistillConfig:
    """Soft targets from a teacher (``iaa-cli distill``; the loss in :mod:`iaa.jobs.modeling.objective`)."""

    alpha: float = 1.0            # α: weight of the gold NLL; 1 - α on the KL to the teacher (1: no teacher)
    temperature: float = 1.0     # T, applied to teacher and student alike

    RANGES: ClassVar[dict[str, Range]] = {"alpha": Range(0.0, 1.0), "temperature": Range(0.0, 1000.0, low_open=True)}

    def __post_init__(self) -> None:
        check_ranges(self, self.RANGES, "distill")


@dataclass(frozen=True)
class JobConfig:
    """Everything a training run needs; checkpoints and MLflow runs store all of it."""

    dataset: str = "demo"
    model: ReaderConfig = field(default_factory=ReaderConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)


# Settings that change how a run computes, not what it learns: the same function by other code,
# and the threads it runs on.
IMPLEMENTATION_KEYS = (
    "train.threads", "train.precision", "train.compile", "train.cuda_graphs",
    "model.fused_gru", "model.triton_gru", "model.fast_dropout", "model.sparse_embedding_grad", "model.batched_read_grad",
    "model.inference_table",
)


class ConfigError(IaaError, ValueError):
    """A config file or override names an unknown key or holds a value of the wrong type."""


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def _coerce(value: Any, declared: Any, where: str) -> Any:
    """``value`` as the field's declared type (int, float, bool, str or a Literal of strings)."""
    if isinstance(value, str) and declared in (int, float):
        try:  # YAML 1.1 reads "5e-4" (no dot) as a string
            value = float(value)
        except ValueError:
            pass
    if declared is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if declared is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if declared is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        try:
            return float(value)
        except OverflowError:      # an integer of hundreds of digits
            raise ConfigError(f"{where}: a number of about {int(value.bit_length() * 0.30103)} digits is too large") from None
    if declared is str and not isinstance(value, str):
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    if typing.get_origin(declared) is Literal and value not in typing.get_args(declared):
        raise ConfigError(f"{where}: expected one of {list(typing.get_args(declared))}, got {value!r}")
    return value


def field_types(cfg: Any) -> dict[str, Any]:
    """Field name -> declared type of a config dataclass (annotations resolved; class constants left out)."""
    return dict(_declared(type(cfg)))


@functools.cache
def _declared(cls: type) -> dict[str, Any]:
    """A config class's field types, resolved once: resolving them is most of what reading a
    config costs (a sweep's record holds one config per trial)."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in fields(cls)}


def merge(cfg: Any, updates: Mapping[str, Any], prefix: str = "") -> Any:
    """A copy of the dataclass ``cfg`` with nested ``updates``; unknown keys and bad values are rejected."""
    known = field_types(cfg)
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
            changes[key] = _coerce(value, known[key], where)
    try:
        return replace(cfg, **changes)
    except (TypeError, ValueError) as err:
        message = str(err)
        section = prefix.rstrip(".")
        raise ConfigError(message if not section or message.startswith(prefix) else f"{section}.{message}") from err


def parse_sets(sets: Sequence[str]) -> dict[str, Any]:
    """``["train.lr=1e-3", "model.steps=5"]`` -> ``{"train": {"lr": 0.001}, "model": {"steps": 5}}``."""
    nested: dict[str, Any] = {}
    for item in sets:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"`sets` expects key=value, got {item!r}")
        node = nested
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        try:
            node[parts[-1]] = strict_yaml.safe_load(raw)
        except yaml.YAMLError as err:
            shown = item if len(item) <= 80 else f"{item[:60]}..."
            raise ConfigError(f"`sets` {shown!r}: the value is not valid YAML ({_first_line(err)})") from None
    return nested


# Top-level keys of a config file that describe where it came from, not the job: a sweep's
# best_config.yaml names its data (``data``: a prepared folder) and the sweep that chose it
# (``sweep``: name, best trial, each trial's epoch budget). ``load`` leaves them out.
HANDOFF_KEYS = ("data", "sweep")


def load(base: JobConfig, path: Path | None = None, sets: Sequence[str] = ()) -> JobConfig:
    """``base`` updated by the YAML file at ``path`` (less its :data:`HANDOFF_KEYS`), then by ``--set`` overrides."""
    cfg = base
    if path is not None:
        data = read_yaml(Path(path))
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        try:
            cfg = merge(cfg, {k: v for k, v in data.items() if k not in HANDOFF_KEYS})
        except ConfigError as err:
            raise ConfigError(f"{path}: {err}") from err
    return merge(cfg, parse_sets(sets))


def read_yaml(path: Path) -> Any:
    """The parsed YAML file at ``path`` ({} when empty); ConfigError naming file and line when it is not YAML."""
    try:
        return strict_yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        line = f", line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{line}: not valid YAML ({err.problem}); fix the file") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML ({_first_line(err)})") from None


def _first_line(err: Exception) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def from_dict(data: Mapping[str, Any]) -> JobConfig:
    """Rebuild a JobConfig from ``to_dict`` output (for example, from a checkpoint).

    A saved ``model.bf16_projections`` (an implementation switch that ``train.precision`` has
    replaced) is dropped; where it was on, the run asked for bf16 GEMMs, so the precision is bf16.
    """
    model = dict(data.get("model") or {})
    if "bf16_projections" in model:
        bf16 = bool(model.pop("bf16_projections"))
        train = dict(data.get("train") or {})
        if bf16 and train.get("precision", "fp32") == "fp32":
            train["precision"] = "bf16"
        data = {**data, "model": model, "train": train}
    return merge(JobConfig(), data)


def dump_yaml(cfg: JobConfig, path: Path, handoff: Mapping[str, Any] | None = None, header: str = "") -> None:
    """Write ``cfg`` as YAML, with ``handoff`` (:data:`HANDOFF_KEYS` only) after it and ``header`` as comments."""
    extra = dict(handoff or {})
    if set(extra) - set(HANDOFF_KEYS):
        raise ValueError(f"handoff keys must be among {HANDOFF_KEYS}, got {sorted(extra)}")
    comments = "".join(f"# {line}\n" for line in header.splitlines())
    atomic_write_text(path, comments + yaml.safe_dump({**to_dict(cfg), **extra}, sort_keys=False))


def read_handoff(path: Path) -> dict[str, Any]:
    """The :data:`HANDOFF_KEYS` that the config file at ``path`` holds ({} for an ordinary config)."""
    data = read_yaml(Path(path))
    if not isinstance(data, Mapping):
        return {}
    handoff = {k: data[k] for k in HANDOFF_KEYS if k in data}
    if "data" in handoff and not isinstance(handoff["data"], str):
        raise ConfigError(f"{path}: data: expected the path of a prepared folder, got {handoff['data']!r}")
    if "sweep" in handoff and not isinstance(handoff["sweep"], Mapping):
        raise ConfigError(f"{path}: sweep: expected a mapping (name, trial, trial_max_epochs), got {handoff['sweep']!r}")
    if "sweep" in handoff:
        fields_mod.check(path, handoff["sweep"], HANDOFF_SWEEP, where="sweep.")
    return handoff


# What a best_config.yaml's ``sweep`` holds (iaa.jobs.workdir.fields kinds); its name and numbers are shown.
HANDOFF_SWEEP = {"name": "name", "trial": "text", "best_valid_acc": "accuracy?", "trial_max_epochs": "number?"}


def flatten(data: Mapping[str, Any], leaf: Callable[[Mapping[str, Any]], bool] = lambda node: False,
            prefix: str = "") -> dict[str, Any]:
    """Nested sections as dotted keys, ``{"model": {"steps": 8}}`` -> ``{"model.steps": 8}``; a
    mapping that ``leaf`` accepts is a value (a search space's ``{choices: [...]}``)."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping) and not leaf(value):
            flat.update(flatten(value, leaf, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"model.steps": 5}`` -> ``{"model": {"steps": 5}}``."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        node = nested
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


def flat(cfg: JobConfig) -> dict[str, Any]:
    """``cfg`` as dotted keys, ``{"model.steps": 5, ...}``: :func:`unflatten`'s inverse."""
    return flatten(to_dict(cfg))


def apply(base: JobConfig, values: Mapping[str, Any]) -> JobConfig:
    """``base`` with the dotted ``values`` of one trial (``ConfigError`` on a bad value)."""
    return merge(base, unflatten(values))


# Short names of the paper's hyperparameters, for run names and table columns.
SHORT_NAMES = {"train.lr": "lr", "model.steps": "T", "model.hidden_dim": "h", "model.embed_dim": "d",
               "model.state_dim": "s", "train.batch_size": "B", "model.dropout": "dropout"}


def short_name(key: str) -> str:
    """``model.steps`` -> ``T``; an unknown key keeps its last dotted part."""
    return SHORT_NAMES.get(key, key.split(".")[-1])


def short_value(value: Any) -> str:
    """``0.004`` -> ``4e-3``, ``64`` -> ``64``: compact and exact for the values a grid holds."""
    if isinstance(value, float) and not value.is_integer() and abs(value) < 0.01:
        mantissa, exponent = f"{value:.2e}".split("e")
        return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def config_label(params: Mapping[str, Any]) -> str:
    """What distinguishes a trial: ``lr=4e-3 T=2 h=64`` from its searched values."""
    return " ".join(f"{short_name(k)}={short_value(v)}" for k, v in sorted(params.items(), key=lambda kv: _order(kv[0])))


def _order(key: str) -> tuple[int, str]:
    names = list(SHORT_NAMES)
    return (names.index(key), key) if key in names else (len(names), key)
