"""The configurations a sweep tries first (``iaa-cli tune --try-first FILE``): what the user
already believes, before the sampler proposes anything.

FILE holds one configuration or a list of them, each a mapping of keys that the search space
searches to a value that it holds (one of its choices, or a point of its range)::

    # the configuration that did best last time, then one that fixes only the learning rate
    - {train.lr: 4.0e-3, model.steps: 3, model.hidden_dim: 64}
    - train.lr: 2.0e-3          # a searched key left out is proposed by the sampler

The sweep's first trials run them, in order; the sampler then learns from their scores as from
any trial's, and never proposes one of them again. One that a trial carried by a warm start ran
whole is not run again: the sampler knows its score (:func:`ran_before`). Nested sections work
as in a search space file. A bad entry is one error naming the file, the line and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

from iaa.jobs.config import strict_yaml
from iaa.jobs.config.job_config import ConfigError, read_yaml
from iaa.jobs.config.search_space import SearchSpace, flatten
from iaa.jobs.ports import Carried
from iaa.model.config import shown_number

Config = Mapping[str, Any]


def load(path: Path, space: SearchSpace) -> tuple[dict[str, Any], ...]:
    """The configurations of the file at ``path``, each value as a trial holds it; ConfigError
    naming the file and the line for a file that is not a list of configurations of ``space``."""
    path = Path(path)
    data = read_yaml(path)                      # a YAML error, or a duplicate key, names its line here
    node = yaml.compose(path.read_text(encoding="utf-8"), Loader=strict_yaml.StrictLoader)
    entries = [data] if isinstance(data, Mapping) else data
    if node is None or not isinstance(entries, list) or not entries or entries == [{}]:
        raise ConfigError(f"{path}: expected a configuration (a mapping of searched keys to values, such as "
                          "`train.lr: 0.002`) or a list of them")
    nodes = node.value if isinstance(node, SequenceNode) else [node]
    configs: list[dict[str, Any]] = []
    for i, (entry, entry_node) in enumerate(zip(entries, nodes), 1):
        at = f"{path}, line {_line(entry_node)}: configuration {i}"
        if not isinstance(entry, Mapping) or not entry:
            raise ConfigError(f"{at}: expected a mapping of searched keys to values, got {_shown(entry)}")
        lines = _key_lines(entry_node)
        config = {}
        for key, value in flatten(entry).items():
            where = f"{path}, line {lines.get(key, _line(entry_node))}: configuration {i}"
            config[key] = _value(space, key, value, where)
        if config in configs:
            raise ConfigError(f"{at}: repeats configuration {configs.index(config) + 1}; give each one once")
        configs.append(config)
    return tuple(configs)


def held(configs: tuple[dict[str, Any], ...], space: SearchSpace, where: str) -> tuple[dict[str, Any], ...]:
    """``configs`` (a resumed sweep's, from its record at ``where``) where ``space`` holds each of
    them; ConfigError naming the configuration and the key where it does not (the sweep resumes
    with another search space than the one it was given them for)."""
    advice = "resume with the search space the sweep started with, or begin a new sweep"
    for i, config in enumerate(configs, 1):
        for key, value in config.items():
            at = f"{where}: configuration {i} given to try first"
            param = space.params.get(key)
            if param is None:
                raise ConfigError(f"{at}: {key} is not searched by the search space the sweep resumes with; {advice}")
            try:
                param.value_of(value)
            except ConfigError as err:
                raise ConfigError(f"{at}: {err}; {advice}") from None
    return configs


def _value(space: SearchSpace, key: str, value: Any, where: str) -> Any:
    param = space.params.get(key)
    if param is None:
        if key in space.fixed:
            raise ConfigError(f"{where}: {key} is fixed to {_shown(space.fixed[key])} by the search space, not "
                              "searched; leave it out")
        raise ConfigError(f"{where}: {key} is not searched (the search space searches "
                          f"{', '.join(space.params)}); set it for every trial with `sets` {key}=VALUE")
    try:
        return param.value_of(value)
    except ConfigError as err:
        raise ConfigError(f"{where}: {err}") from None


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _key_lines(node: Node, prefix: str = "") -> dict[str, int]:
    """The line of each dotted key of a mapping node (nested sections flattened)."""
    lines: dict[str, int] = {}
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            name = f"{prefix}{key_node.value}"
            lines.setdefault(name, _line(key_node))
            lines.update({k: v for k, v in _key_lines(value_node, f"{name}.").items() if k not in lines})
    return lines


def _shown(value: Any) -> str:
    text = shown_number(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def described(configs: tuple[Config, ...]) -> str:
    """The configurations in one line: ``{train.lr: 0.004, model.steps: 3}; {train.lr: 0.002}``."""
    return "; ".join("{" + ", ".join(f"{k}: {_shown(v)}" for k, v in c.items()) + "}" for c in configs)


def held_by(configs: tuple[Config, ...], params: Mapping[str, Any] | None) -> int | None:
    """Which of ``configs`` (from 1) a trial's searched ``params`` hold (each of its keys at its
    value); None for none."""
    found = [i for i, config in enumerate(configs, 1)
             if params and all(k in params and params[k] == v for k, v in config.items())]
    return found[0] if found else None


def ran_before(configs: tuple[Config, ...], carried: Carried | None) -> dict[int, str]:
    """Which of ``configs`` (from 1) a trial that a warm start ``carried`` ran whole (every searched
    key at its value), each with the line that says so: the sweep does not run them again."""
    if carried is None:
        return {}
    found: dict[int, str] = {}
    for i, config in enumerate(configs, 1):
        value = next((v for params, v in carried.ran if params == config), None)
        if value is not None:
            found[i] = (f"configuration {i} given to try first ran in sweep {carried.sweep} (valid_acc {value:.4f}), "
                        "whose trials this sweep begins with: it does not run again")
    return found
