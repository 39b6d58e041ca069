"""Hyperparameter search spaces: the paper's grid, per-dataset presets, and a YAML format.

A search space maps dotted config keys (fields of :class:`~iaa.jobs.config.job_config.JobConfig`) to
choices or ranges. The YAML file given to ``iaa-cli tune --search-space`` *replaces* the
preset's space; every key not in it keeps the job config's value::

    # choices: a list, or {choices: [...]}
    train.embed_l2: [1.0e-3, 1.0e-4]
    model.steps: {choices: [3, 5, 8]}
    # ranges: {low, high}, with log: true for a log scale and step for a grid;
    # an integer field gives an integer range
    train.lr: {low: 1.0e-4, high: 3.0e-3, log: true}
    model.hidden_dim: {low: 64, high: 256, step: 64}
    model.dropout: {low: 0.0, high: 0.5}
    # a plain value fixes the field for every trial
    train.batch_size: 64
    # nested keys work too
    model:
      state_dim: [256, 512]
    # adaptive steps (ACT): model.steps is then the most steps an example may take
    model.halting: act
    model.ponder_cost: {low: 1.0e-4, high: 1.0e-2, log: true}

Errors name the key and what is wrong: an unknown field, a value of the wrong type, an empty
choice list, ``low >= high``, a log range that reaches 0, or a key searched where it has no
effect (``model.ponder_cost`` without ``model.halting: act`` in some trial). ``dataset`` and
``model.vocab_size`` come from the data and cannot be searched.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping

from iaa.jobs.config import job_config
from iaa.jobs.config.job_config import ConfigError, JobConfig, apply, read_yaml
from iaa.model.config import shown_number

NOT_SEARCHABLE = ("dataset", "model.vocab_size")
# A key that only matters when another key has a given value: searching it otherwise wastes trials.
ONLY_WITH: dict[str, tuple[str, Any]] = {
    "model.ponder_cost": ("model.halting", "act"),   # τ of ACT's ponder cost
    "model.halt_bias_init": ("model.halting", "act"),
}
SPEC_KEYS = {"choices", "low", "high", "log", "step"}


@dataclass(frozen=True)
class Param:
    """One searched field: ``choices``, or a ``low``..``high`` range (``log`` scale, ``step`` grid)."""

    name: str
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    integer: bool = False

    def value_of(self, value: Any) -> Any:
        """``value`` as a trial of this parameter holds it (a number where the parameter is
        numeric); ConfigError saying why when no trial can (not a choice, outside the range, off
        its step)."""
        numeric = self.choices is None or all(isinstance(c, (int, float)) and not isinstance(c, bool)
                                              for c in self.choices)
        if numeric:
            value = _as_number(value, self.integer, self.name)
        if self.choices is not None:
            if value not in self.choices:
                raise ConfigError(f"{self.name}: {shown_number(value)} is not one of its choices {self.describe()}")
            return value
        assert self.low is not None and self.high is not None
        if not self.low <= value <= self.high:
            raise ConfigError(f"{self.name}: {shown_number(value)} lies outside its range {self.describe()}")
        if self.step and not math.isclose((value - self.low) / self.step, round((value - self.low) / self.step),
                                          abs_tol=1e-8):
            raise ConfigError(f"{self.name}: {shown_number(value)} is off its step {self.describe()}")
        return value

    def describe(self) -> str:
        if self.choices is not None:
            return "{" + ", ".join(f"{c:g}" if isinstance(c, float) else str(c) for c in self.choices) + "}"
        scale = " log" if self.log else ""
        step = f" step {self.step:g}" if self.step else ""
        return f"[{self.low:g}, {self.high:g}]{scale}{step}"


@dataclass(frozen=True)
class SearchSpace:
    params: dict[str, Param]
    fixed: dict[str, Any]                   # dotted key -> value, applied to every trial

    def describe(self) -> str:
        return ", ".join(f"{name} {p.describe()}" for name, p in self.params.items())

    @property
    def size(self) -> int | None:
        """Distinct configurations: the product of the choices; None when a parameter is a range."""
        total = 1
        for p in self.params.values():
            if p.choices is None:
                return None
            total *= len(set(p.choices))
        return total

    def costliest(self, base: JobConfig) -> tuple[JobConfig, dict[str, Any]]:
        """The costliest trial the space allows: ``base`` with the fixed values, then each searched
        integer ``model`` knob (T, d, h, s, the gate) and ``train.max_epochs`` at its largest and
        ``train.batch_size`` at its smallest (a smaller batch costs more per example, and makes
        more steps and checks). No trial trains more slowly per example, or for more epochs.
        Returns it and those of its searched values that differ from the trials' base (empty: the
        base is as costly)."""
        start = apply(base, self.fixed)
        top: dict[str, Any] = {}
        for name, p in self.params.items():
            if name == "train.batch_size":
                top[name] = min(p.choices) if p.choices is not None else p.low
            elif name == "train.max_epochs" or (name.startswith("model.") and p.integer):
                top[name] = max(p.choices) if p.choices is not None else p.high
        top = {k: v for k, v in top.items() if v is not None}
        largest = apply(start, top)
        return largest, {k: v for k, v in top.items() if apply(start, {k: v}) != start}

    def to_json(self) -> str:
        return json.dumps({"params": {k: {f: getattr(p, f) for f in ("choices", "low", "high", "log", "step")}
                                      for k, p in self.params.items()}, "fixed": self.fixed}, default=str)


# The paper's grid (section 4, "Hyperparameters"): embedding regularisation, T, d, h, s.
PAPER_GRID: dict[str, Any] = {
    "train.embed_l2": [1e-3, 1e-4],
    "model.steps": [3, 5, 8],
    "model.embed_dim": [256, 384],
    "model.hidden_dim": [128, 256],
    "model.state_dim": [256, 512],
}

# The demo sweep: knobs that matter at the demo preset's size (d=64, h=64, s=128, T=3). The
# learning rate matters most: at 1e-3 the reader sits at ~0.39 valid for 1.5 epochs before it
# learns (0.86 at epoch 2), at 2e-3 it reaches 0.86 and at 4e-3 0.93 after one epoch. So a whole
# sweep of 1.5-epoch trials runs on a 2-core laptop in minutes and still shows the reader learn.
DEMO_GRID: dict[str, Any] = {
    "train.lr": [2e-3, 4e-3],
    "model.steps": [2, 3],
    "model.hidden_dim": [32, 64],
}


def _field_value(cfg: JobConfig, dotted: str) -> Any:
    """The current value of ``dotted`` in ``cfg``; ``ConfigError`` for unknown or nested keys."""
    node: Any = cfg
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        known = [f.name for f in fields(node)]
        if part not in known:
            where = ".".join(parts[:i]) or "the job config"
            raise ConfigError(f"search space: unknown key {dotted!r}; {where} has {sorted(known)}")
        node = getattr(node, part)
    if is_dataclass(node):
        raise ConfigError(f"search space: {dotted!r} is a section; name one of its fields, e.g. {dotted}.{fields(node)[0].name}")
    return node


def flatten(data: Mapping[str, Any]) -> dict[str, Any]:
    """Nested sections to dotted keys; a mapping of spec keys (choices/low/...) is a leaf."""
    return job_config.flatten(data, leaf=lambda node: bool(set(node) & SPEC_KEYS))


def _number(value: Any, integer: bool, where: str) -> float | int:
    try:
        return _as_number(value, integer, where)
    except ConfigError as err:
        raise ConfigError(f"search space: {err}") from None


def _as_number(value: Any, integer: bool, where: str) -> float | int:
    if isinstance(value, str):
        try:
            value = float(value)  # YAML 1.1 reads 1e-4 (no dot) as a string
        except ValueError:
            pass
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if not math.isfinite(value if isinstance(value, float) else 0.0) or abs(value) > 1e300:
        raise ConfigError(f"{where}: expected a finite number, got {str(value)[:40]}")
    if integer:
        if float(value) != int(value):
            raise ConfigError(f"{where}: this field is an integer, got {value!r}")
        return int(value)
    return float(value)


def _param(name: str, spec: Any, current: Any) -> Param:
    integer = isinstance(current, int) and not isinstance(current, bool)
    numeric = isinstance(current, (int, float)) and not isinstance(current, bool)
    if isinstance(spec, (list, tuple)):
        spec = {"choices": list(spec)}
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ConfigError(f"search space: {name}: unknown keys {sorted(unknown)}; use choices, or low/high with log and step")
    if "choices" in spec:
        if set(spec) - {"choices"}:
            raise ConfigError(f"search space: {name}: give either choices or low/high, not both")
        choices = spec["choices"]
        if not isinstance(choices, (list, tuple)) or not choices:
            raise ConfigError(f"search space: {name}: choices must be a non-empty list")
        values = tuple(_number(c, integer, f"{name} choice") for c in choices) if numeric else tuple(choices)
        if len(set(values)) != len(values):
            raise ConfigError(f"search space: {name}: duplicate choices {list(values)}")
        return Param(name, choices=values, integer=integer)
    if not numeric:
        raise ConfigError(f"search space: {name}: a range needs a numeric field; give choices instead")
    if "low" not in spec or "high" not in spec:
        raise ConfigError(f"search space: {name}: a range needs both low and high")
    low, high = _number(spec["low"], integer, f"{name}.low"), _number(spec["high"], integer, f"{name}.high")
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"search space: {name}: log must be true or false, got {log!r}")
    step = spec.get("step")
    if step is not None:
        step = _number(step, integer, f"{name}.step")
        if step <= 0:
            raise ConfigError(f"search space: {name}: step must be > 0, got {step}")
        if log:
            raise ConfigError(f"search space: {name}: step and log cannot be combined")
    if not low < high:
        raise ConfigError(f"search space: {name}: low ({low}) must be below high ({high})")
    if log and low <= 0:
        raise ConfigError(f"search space: {name}: a log range needs low > 0, got {low}")
    return Param(name, low=low, high=high, log=log, step=step, integer=integer)


def parse(data: Mapping[str, Any] | None, base: JobConfig) -> SearchSpace:
    """A :class:`SearchSpace` from the YAML mapping ``data``, checked against ``base``'s fields."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("search space: expected a mapping of config keys to choices or ranges")
    params: dict[str, Param] = {}
    fixed: dict[str, Any] = {}
    for name, spec in flatten(data).items():
        if name in NOT_SEARCHABLE:
            raise ConfigError(f"search space: {name!r} comes from the data and cannot be searched")
        current = _field_value(base, name)
        if isinstance(spec, (list, tuple, Mapping)):
            params[name] = _param(name, spec, current)
        else:
            fixed[name] = spec
    if not params:
        raise ConfigError("search space: nothing to search (every key is fixed); give choices or a range")
    _check_dependencies(params, fixed, base)
    checks = [(name, value, fixed) for name, value in fixed.items()]
    checks += [(p.name, v, {**fixed, p.name: v}) for p in params.values() for v in (p.choices or (p.low, p.high))]
    for name, value, values in checks:  # every value must make a valid config: fail now, not in a trial
        try:
            apply(base, values)
        except ConfigError as err:
            raise ConfigError(f"search space: {name}={shown_number(value)} is not a valid config value: {err}") from err
    return SearchSpace(params, fixed)


def _check_dependencies(params: Mapping[str, Param], fixed: Mapping[str, Any], base: JobConfig) -> None:
    """A searched key of ``ONLY_WITH`` needs its condition reachable in some trial."""
    for name, (key, value) in ONLY_WITH.items():
        if name not in params:
            continue
        possible = params[key].choices if key in params else (fixed[key],) if key in fixed else (_field_value(base, key),)
        if value not in possible:
            raise ConfigError(f"search space: {name} has no effect unless {key} is {value!r}; "
                              f"add {key}: {value} (or {{choices: [none, {value}]}}) to the space")


def load(path: Path, base: JobConfig) -> SearchSpace:
    """Parse the YAML search-space file at ``path`` (format in the module docstring)."""
    data = read_yaml(Path(path))
    try:
        return parse(data, base)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}") from err
