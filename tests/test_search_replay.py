"""The search benchmark's replay makes the decisions a real sweep makes: a Ray Tune run of the
project's searcher and ASHA over a lookup trainable (each trial reads its checks from the table of
learning curves instead of training) proposes the same configurations and stops the same trials
at the same checks as ``benchmarks/search/replay.py`` for the same seed, on the committed table of
real-text curves."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks" / "search"))
import replay  # noqa: E402
import table as curves_table  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
TABLE = ROOT / "benchmarks" / "search" / "curves-cbt-cn.parquet"   # committed: 32 configurations of real text
TRIALS, SEED = 10, 3


def test_a_ray_tune_sweep_and_the_replay_propose_and_stop_alike(tmp_path: Path) -> None:
    import numpy as np
    import optuna
    import ray
    import ray.tune as tune

    from iaa.jobs.config.job_config import JobConfig
    from iaa.jobs.config.presets import TUNE_PRESETS
    from iaa.jobs.config.search_space import parse
    from iaa.platform.sweeps.search import search_algorithm as search
    from iaa.platform.sweeps.launch import ResumableSearch
    from tests._platform import start_local_ray
    from tests._study import bound_study

    recorded = curves_table.load(TABLE)
    space = parse(recorded.grid, JobConfig())
    preset = replace(TUNE_PRESETS["demo"])
    checks = len(next(iter(recorded.curves.values())))
    expected = replay.replay(recorded, space, replay.Strategy("tune", search.build_sampler), SEED, preset, TRIALS, 1)
    assert expected.stops, "the slice must make ASHA stop some trials, or the test shows nothing"

    def lookup(config: dict[str, Any], curves: dict[tuple, list[dict[str, Any]]], grid: list[str]) -> None:
        """The trial: its configuration's checks read from the table (defined here, so that Ray
        ships it by value to workers that cannot import the tests)."""
        import ray.tune as tune

        for result in curves[tuple(float(f"{float(config[name]):.12g}") for name in grid)]:
            tune.report(result)

    results = {key: [{"valid_acc": c.valid_acc, "best_valid_acc": c.best_valid_acc, "checks": c.check,
                      "stop_reason": "max-epochs" if c.check == len(curve) else ""} for c in curve]
               for key, curve in recorded.curves.items()}
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    start_local_ray(num_cpus=2)
    try:
        with bound_study(url, "replayed"):
            np.random.seed(SEED)
            tuner = tune.Tuner(
                tune.with_parameters(lookup, curves=results, grid=list(recorded.grid)),
                tune_config=tune.TuneConfig(
                    search_alg=ResumableSearch(search.searcher(space, SEED, "replayed"), 1, "replayed"),
                    scheduler=search.scheduler(preset, checks + 1), num_samples=TRIALS),
                run_config=tune.RunConfig(name="replayed", storage_path=str(tmp_path / "ray"), verbose=0))
            tuner.fit()
    finally:
        ray.shutdown()

    study = optuna.load_study(study_name="replayed", storage=url)
    trials = sorted(study.trials, key=lambda t: t.number)
    assert [{k: t.params[k] for k in recorded.grid} for t in trials] == expected.proposals
    last_check = {f"t{t.number:05d}": max(t.intermediate_values) for t in trials}
    stopped = sorted((trial, check) for trial, check in last_check.items() if check < checks)
    assert stopped == sorted(expected.stops)
    assert [t.state.name for t in trials].count("PRUNED") == len(expected.stops)
