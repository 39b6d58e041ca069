"""ACT's knobs in tune's search space: a YAML space can search ``model.ponder_cost`` (and
``model.halting``), the searcher proposes them and every trial's objective uses them."""

from __future__ import annotations

from pathlib import Path

import pytest

from iaa.jobs.config.job_config import ConfigError, JobConfig
from iaa.jobs.modeling.objective import Objective
from iaa.jobs.config import search_space

SPACE = """\
model.halting: act
model.ponder_cost: {low: 1.0e-4, high: 1.0e-2, log: true}
model.steps: [4, 8]
"""


def test_a_yaml_space_searches_the_ponder_cost_and_trials_train_with_it(tmp_path: Path) -> None:
    pytest.importorskip("optuna")
    from iaa.platform.sweeps.search import search_algorithm as search

    path = tmp_path / "act.yaml"
    path.write_text(SPACE, encoding="utf-8")
    space = search_space.load(path, JobConfig())
    assert space.fixed == {"model.halting": "act"}
    dist = search.to_optuna(space)["model.ponder_cost"]
    assert dist.log and (dist.low, dist.high) == (1e-4, 1e-2)
    searcher = search.searcher(space, seed=0)
    for trial in ("t1", "t2", "t3"):
        proposed = searcher.suggest(trial)
        cfg = search_space.apply(JobConfig(), {**space.fixed, **proposed})
        assert cfg.model.halting == "act" and cfg.model.steps in (4, 8)
        assert 1e-4 <= cfg.model.ponder_cost <= 1e-2
        assert Objective.from_config(cfg).ponder_cost == cfg.model.ponder_cost
        searcher.on_trial_complete(trial, {"valid_acc": 0.5, "best_valid_acc": 0.5, "training_iteration": 1})


@pytest.mark.parametrize("text, ok", [
    ("model.ponder_cost: [0.001, 0.01]\n", False),                                   # halting stays none
    ("model.halting: none\nmodel.ponder_cost: [0.001, 0.01]\n", False),
    ("model.halting: [none, act]\nmodel.ponder_cost: [0.001, 0.01]\n", True),
    ("model.halting: [none, act]\n", True),
])
def test_searching_the_ponder_cost_without_act_is_refused(text: str, ok: bool) -> None:
    import yaml

    data = yaml.safe_load(text)
    if ok:
        search_space.parse(data, JobConfig())
        return
    with pytest.raises(ConfigError, match="model.ponder_cost has no effect unless model.halting is 'act'"):
        search_space.parse(data, JobConfig())
